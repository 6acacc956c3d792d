"""DAGs that only the deployment tests load into ``make up``'s stack (TFPIPE_STACK_EXTRA_DAGS).

- ``tfpipe_stack_cron``: the digits pipeline every minute, tiny epochs (a scheduler-created run);
- ``tfpipe_stack_parallel``: two runs may be active at once, both blessed (distinct versions);
- ``tfpipe_stack_bad_tls``: prep against the TLS engine with no client certificate and with one
  from a foreign CA (the error must name the engine and the fix, and not be retried);
- ``tfpipe_stack_shards``: sharded prep over two engines, shard 0 on the TLS engine (named by its
  URL, so it takes the deployment's TLS files) and shard 1 on the first engine (its unix socket
  spelt ``unix:///``, since the default spelling means the deployment's engine); both mount the
  same host directories, and everything after the shards runs on the deployment's engine.
- ``tfpipe_stack_stage_in``: a stage-in alone, from the bucket the run's ``data_uri`` names on the
  Cloud Storage emulator the run's ``emulator`` names (the workers' environment has none: the task
  sets it before it runs), onto the GPU host's data volume.

Paths and the engine come from the stack's environment, as for the repository's DAGs.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, Param

from tfpipe import PipelineConfig, training_pipeline
from tfpipe.operators import GcsStageInOperator, PrepOperator
from tfpipe.specs import config_template

HOME = os.environ.get("TFPIPE_HOME", "/nonexistent")
STACK_DIR = os.environ.get("TFPIPE_STACK_DIR", "/nonexistent")
IMAGE = None  # the deployment's image: the Airflow Variable tfpipe_image, which make up sets
VOLUMES = {"data": f"{HOME}/data", "work": f"{HOME}/work", "models": f"{HOME}/models"}
TINY = {"model": "mlp", "epochs": 1, "batch_size": 128, "checkpoint_every_steps": 5}


def _cfg(dag_id: str, **kw) -> PipelineConfig:
    base = dict(dag_id=dag_id, image={"ref": IMAGE}, volumes=VOLUMES, data={"path": "digits/digits.csv"},
                training=TINY, evaluation={"threshold": 0.0, "tolerance": 1.0},
                export={"model_name": dag_id}, retry_delay_seconds=2.0, tags=("tfpipe", "stack-test"))
    base.update(kw)
    return PipelineConfig.from_dict(base)


_engine = os.environ.get("AIRFLOW__TFPIPE__DOCKER_URL", "tcp://127.0.0.1:1")
FIRST_ENGINE = "unix:///var/run/docker.sock"

cron = training_pipeline(_cfg("tfpipe_stack_cron", schedule="* * * * *"))
parallel = training_pipeline(_cfg("tfpipe_stack_parallel", schedule=None, gpu_pool="gpu"), max_active_runs=2)
shards = training_pipeline(_cfg("tfpipe_stack_shards", schedule=None, data={"path": "digits_parts", "shards": 2},
                                shard_docker_urls=(_engine, FIRST_ENGINE)))

bad_cfg = _cfg("tfpipe_stack_bad_tls", schedule=None)
bad_tls = DAG("tfpipe_stack_bad_tls", schedule=None, tags=["stack-test"])
_foreign = f"{STACK_DIR}/foreign-client"
with bad_tls:
    for task_id, tls in (
        ("no_client_cert", {}),
        ("foreign_client_cert", {"tls_ca_cert": f"{STACK_DIR}/certs/client/ca.pem",
                                 "tls_client_cert": f"{_foreign}/cert.pem", "tls_client_key": f"{_foreign}/key.pem"}),
    ):
        PrepOperator(task_id=task_id, image=IMAGE, stage_config=config_template(bad_cfg, "prep"), volumes=VOLUMES,
                     docker_url=_engine, retries=3, retry_delay=2.0, **tls)


def _use_the_runs_emulator(context) -> None:
    # In the task process, before execute(): the hook reads STORAGE_EMULATOR_HOST when it makes its client.
    os.environ["STORAGE_EMULATOR_HOST"] = context["params"]["emulator"]


stage_in_only = DAG("tfpipe_stack_stage_in", schedule=None, tags=["stack-test"],
                    params={"data_uri": Param(None, type=["null", "string"]),
                            "emulator": Param("http://127.0.0.1:1", type="string")})
with stage_in_only:
    GcsStageInOperator(task_id="stage_in", data_volume=VOLUMES["data"], data_path="stage_in_many/", image=IMAGE,
                       on_execute_callback=_use_the_runs_emulator, retries=0)
