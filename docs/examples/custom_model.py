"""Airflow DAG: a pipeline that trains a model of your own, built by a function on the data volume."""
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

dag = training_pipeline(PipelineConfig(
    dag_id="churn_wide",
    image={"ref": None},
    volumes={"data": "/srv/ml/raw", "work": "/srv/ml/work", "models": "/srv/ml/models"},
    data={"path": "churn/", "label": "churned"},
    # --8<-- [start:model]
    training={"model": "churn_models.wide:build",   # /data/code/churn_models/wide.py, function build
              "code_path": "code",                   # relative to the data volume: /data/code
              "model_kwargs": {"units": 256}},       # passed to build() as keyword arguments
    # --8<-- [end:model]
    export={"model_name": "churn_wide"},
))
