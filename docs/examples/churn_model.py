"""Airflow DAG: nightly retraining of a churn model on a remote GPU host."""
import airflow.providers.tfpipe  # noqa: F401  (the DAG processor then imports tfpipe once, not per parse)
from tfpipe import PipelineConfig, training_pipeline

dag = training_pipeline(PipelineConfig(
    dag_id="churn_model",
    schedule="0 3 * * *",                                # cron, and/or data_asset="s3://raw/churn"
    image={"ref": "registry.local/tfpipe/trainer:1.4.0"},  # or None: the Airflow Variable tfpipe_image
    volumes={"data": "/srv/ml/raw", "work": "/srv/ml/work", "models": "/srv/ml/models"},
    data={"path": "churn/", "format": "csv", "label": "churned"},
    training={"model": "mlp", "epochs": 30, "batch_size": 256, "class_weight": "balanced"},
    evaluation={"metric": "macro_f1", "threshold": 0.85, "tolerance": 0.01},
    export={"model_name": "churn"},
    resources={"gpus": "all", "mem_limit": "16g", "cpus": 8, "timezone": "Asia/Shanghai"},
    retention={"keep_runs": 10, "min_idle_minutes": 60},
    docker_url="tcp://gpu-host-1:2376",                  # the GPU host's Docker engine
))
