"""Airflow DAG: training on two GPUs of the engine's host, one training job at a time."""
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

dag = training_pipeline(PipelineConfig(
    dag_id="images_on_gpus",
    image={"ref": None},
    volumes={"data": "/srv/ml/raw", "work": "/srv/ml/work", "models": "/srv/ml/models"},
    data={"path": "animals/", "format": "images", "image_size": [224, 224], "channels": 3},
    training={"model": "resnet50", "epochs": 40, "batch_size": 128, "mixed_precision": True},
    # --8<-- [start:gpus]
    resources={"gpus": 2,                     # None (CPU), "all", a count, or device ids ["0", "1"]
               "gpu_fallback": "cpu",         # "fail" (the default): no NVIDIA runtime fails the task
               "gpu_stages": ["train", "evaluate"],  # the default
               "shm_size": "2g", "mem_limit": "32g"},
    gpu_pool="gpu",                           # create it first: airflow pools set gpu 1 "GPU training slots"
    # --8<-- [end:gpus]
    export={"model_name": "animals"},
))
