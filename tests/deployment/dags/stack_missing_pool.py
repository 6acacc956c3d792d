"""A DAG that only the deployment tests load into ``make up``'s stack (TFPIPE_STACK_EXTRA_DAGS).

- ``tfpipe_stack_missing_pool``: the digits pipeline whose ``train`` is in the pool
  ``tfpipe_stack_no_such_pool``, which nothing creates: ``prep`` runs, ``train`` must never be
  queued (the docs: GPUs, "gpu_pool"). No ``cleanup`` (retention off), so once ``prep`` is done nothing of
  the run is left running while ``train`` waits, and the test can end the run without killing a task.

Paths and the engine come from the stack's environment, as for the repository's DAGs.
"""

from __future__ import annotations

import os

from tfpipe import PipelineConfig, training_pipeline

HOME = os.environ.get("TFPIPE_HOME", "/nonexistent")
MISSING_POOL = "tfpipe_stack_no_such_pool"

missing_pool = training_pipeline(PipelineConfig.from_dict(dict(
    dag_id="tfpipe_stack_missing_pool", schedule=None, gpu_pool=MISSING_POOL,
    image={"ref": None},  # the deployment's image: the Airflow Variable tfpipe_image, which make up sets
    volumes={"data": f"{HOME}/data", "work": f"{HOME}/work", "models": f"{HOME}/models"},
    data={"path": "digits/digits.csv"},
    training={"model": "mlp", "epochs": 1, "batch_size": 128, "checkpoint_every_steps": 5},
    evaluation={"threshold": 0.0, "tolerance": 1.0}, export={"model_name": "tfpipe_stack_missing_pool"},
    retention={"enabled": False}, mlflow={"enabled": False}, retry_delay_seconds=2.0, tags=("tfpipe", "stack-test"),
)))
