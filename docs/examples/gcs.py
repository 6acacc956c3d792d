"""Airflow DAG: raw data staged in from a bucket, blessed models published to another."""
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

dag = training_pipeline(PipelineConfig(
    dag_id="churn_from_gcs",
    image={"ref": None},
    volumes={"data": "/srv/ml/raw", "work": "/srv/ml/work", "models": "/srv/ml/models"},
    data={"path": "churn/", "label": "churned"},
    export={"model_name": "churn"},
    # --8<-- [start:gcs]
    data_uri="gs://acme-raw/churn/",          # defaults; a run's data_uri / publish_uri Params override them
    publish_uri="gs://acme-models/prod",
    gcp_conn_id="google_cloud_default",       # the default
    # --8<-- [end:gcs]
))
