"""Airflow DAG: manually triggered digits experiments: every hyperparameter comes from the trigger form.

No schedule: trigger it from the UI (the form shows epochs, batch size, learning rate, model,
optimizer, seed, mixed precision, warm start and GPUs, and rejects bad values) or with
``make run DAG=tfpipe_digits_manual CONF='{"epochs": 5, "learning_rate": 0.01}'``.
``gcs_tasks=True`` gives it the Cloud Storage tasks: a run's ``data_uri`` (``gs://...``) is staged
into the data path before prep, and a blessed model is published under its ``publish_uri``; a run
that sets neither skips both.
"""

from __future__ import annotations

import os
from pathlib import Path

# Named here so Airflow's DAG processor imports tfpipe (and the Docker provider under it) once,
# before it forks the process that parses this file ([dag_processor] parsing_pre_import_modules, on
# by default; only airflow.* imports count), instead of in every parse (docs/deploying.md, "The DAG processor's pre-import").
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

HOME = os.environ.get("TFPIPE_HOME") or str(Path(__file__).resolve().parent.parent / ".demo")

dag = training_pipeline(
    PipelineConfig(
        dag_id="tfpipe_digits_manual",
        description="Digits experiments: set epochs, learning rate, model and GPUs when triggering",
        schedule=None,
        tags=("tfpipe", "experiment"),
        image={"ref": None},  # the deployment's image: the Airflow Variable tfpipe_image, read at run time
        volumes={"data": f"{HOME}/data", "work": f"{HOME}/work", "models": f"{HOME}/models"},
        data={"path": "digits/digits.csv"},
        training={"model": "mlp", "epochs": 10},
        # experiments publish under their own name, never over the production model
        export={"model_name": "digits_experiments"},
        evaluation={"threshold": 0.9},
        gcs_tasks=True,  # stage_in and publish, with the buckets chosen per run (data_uri, publish_uri)
        retry_delay_seconds=float(os.environ.get("TFPIPE_RETRY_DELAY", "30")),
    )
)
