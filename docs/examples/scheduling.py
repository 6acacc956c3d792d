"""Airflow DAG: retrain every night and whenever new data lands, starting from the last model."""
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

dag = training_pipeline(PipelineConfig(
    dag_id="churn_nightly",
    # --8<-- [start:schedule]
    schedule="0 3 * * *",                  # cron (UTC) or a preset such as "@daily"; None: manual only
    data_asset="s3://raw/churn",           # and/or: a run whenever this Airflow Asset is updated
    model_asset="tfpipe://models/churn",   # export emits it (this is the default for model_name churn)
    training={"model": "mlp", "epochs": 20, "warm_start": True},   # start from the newest blessed model
    export={"model_name": "churn", "keep_versions": 5},
    retention={"keep_runs": 10, "min_idle_minutes": 60},
    # --8<-- [end:schedule]
    image={"ref": None},
    volumes={"data": "/srv/ml/raw", "work": "/srv/ml/work", "models": "/srv/ml/models"},
    data={"path": "churn/", "label": "churned"},
))
