"""Airflow DAG: prep of a large CSV folder in four containers, spread over two engines."""
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

dag = training_pipeline(PipelineConfig(
    dag_id="clicks_sharded",
    image={"ref": None},
    volumes={"data": "/mnt/nfs/raw", "work": "/mnt/nfs/work", "models": "/mnt/nfs/models"},
    # --8<-- [start:shards]
    data={"path": "clicks/", "label": "outcome", "classes": ["none", "click", "buy"],
          "shards": 4},                                      # 4 prep_shard tasks, then prep_merge
    shard_docker_urls=["tcp://gpu-1:2376", "tcp://gpu-2:2376"],  # shard k on entry k % 2; same volumes on each
    training={"model": "mlp", "epochs": 5, "cache": "auto"},    # auto: memory when it fits, else a file
    # --8<-- [end:shards]
    export={"model_name": "clicks"},
))
