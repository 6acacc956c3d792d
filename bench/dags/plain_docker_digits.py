"""Bench only: the digits pipeline as five hand-written DockerOperators, no tfpipe operator.

``provider_cost_ratio`` runs it beside ``tfpipe_digits``: the same image, commands, stage configs
(built here once, at parse time, as a user would paste them), mounts and engine. It leaves out what
the provider adds: the volume-preparing helper container, leftover clean-up, the engine ping, the
result parsing, and the ``cleanup`` teardown. The containers run as root, since nothing prepares
the run dir for the image's user, unless ``TFPIPE_BENCH_USER`` names one (``provider_cost_ratio``
runs them as uid 1000, on volumes it prepared for that user). The ``run_id`` reaches the configs
through templating.
"""

import json
import os

from airflow.providers.docker.operators.docker import DockerOperator
from airflow.sdk import DAG
from docker.types import Mount

from tfpipe import contract
from tfpipe.config import PipelineConfig
from tfpipe.specs import TF_DEFAULT_ENV, config_template, resolve_stage_config, stage_command

DAG_ID = "bench_plain_docker_digits"
HOME = os.environ.get("TFPIPE_HOME", "/nonexistent")
# The deployment's image, as tfpipe's tasks read it: the Airflow Variable tfpipe_image, rendered
# (DockerOperator's image and environment are templated) when each task runs.
IMAGE = "{{ var.value.tfpipe_image }}"
#: the conf provider_cost_ratio triggers tfpipe_digits with
CONF = json.loads(os.environ.get("TFPIPE_BENCH_CONF", '{"epochs": 2, "batch_size": 100}'))
PLACEHOLDER = "RUNIDPLACEHOLDER"
USER = os.environ.get("TFPIPE_BENCH_USER", "0:0")

cfg = PipelineConfig.from_dict(dict(
    dag_id=DAG_ID, image={"ref": None},
    volumes={"data": f"{HOME}/data", "work": f"{HOME}/work", "models": f"{HOME}/models"},
    data={"path": "digits/digits.csv", "format": "csv", "label": "label", "eval_fraction": 0.2},
    training={"model": "mlp", "epochs": 15, "batch_size": 32, "learning_rate": 0.002, "checkpoint_every_steps": 20},
    evaluation={"threshold": 0.95, "tolerance": 0.02}, export={"model_name": "digits_plain", "keep_versions": 5},
))
engine = {"docker_url": os.environ.get("AIRFLOW__TFPIPE__DOCKER_URL", "unix://var/run/docker.sock")}
if os.environ.get("AIRFLOW__TFPIPE__TLS_CLIENT_CERT"):
    engine.update(tls_ca_cert=os.environ["AIRFLOW__TFPIPE__TLS_CA_CERT"],
                  tls_client_cert=os.environ["AIRFLOW__TFPIPE__TLS_CLIENT_CERT"],
                  tls_client_key=os.environ["AIRFLOW__TFPIPE__TLS_CLIENT_KEY"])
mounts = [Mount(contract.CONTAINER_DATA, cfg.volumes.data, type="bind", read_only=True),
          Mount(contract.CONTAINER_WORK, cfg.volumes.work, type="bind"),
          Mount(contract.CONTAINER_MODELS, cfg.volumes.models, type="bind")]

with DAG(DAG_ID, schedule=None, max_active_runs=1, tags=["bench"]) as dag:
    previous = None
    for stage in ("prep", "validate", "train", "evaluate", "export"):
        config = resolve_stage_config(config_template(cfg, stage), dag_id=DAG_ID, run_id=PLACEHOLDER,
                                      task_id=stage, try_number=1, image=IMAGE, overrides=CONF)
        task = DockerOperator(
            task_id=stage, image=IMAGE, command=list(stage_command(stage)), api_version="auto",
            environment={**TF_DEFAULT_ENV,
                         contract.CONFIG_ENV: json.dumps(config).replace(PLACEHOLDER, "{{ run_id }}")},
            mounts=mounts, mount_tmp_dir=False, user=USER, shm_size=1 << 30, auto_remove="success",
            skip_on_exit_code=int(contract.ExitCode.NOT_BLESSED) if stage == "evaluate" else None,
            **engine,
        )
        if previous:
            previous >> task
        previous = task
