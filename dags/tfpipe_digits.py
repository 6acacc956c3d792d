"""Airflow DAG: nightly retraining of the digits classifier (cron): the pipeline ``make demo`` runs.

prep -> validate -> train -> evaluate -> export, every stage a container of the pinned trainer image.
Trigger it from the UI to change epochs, batch size, learning rate, model, GPUs and more. Its data
is on the data volume: a pipeline whose data is in a bucket sets ``data_uri`` (and ``publish_uri``
for its models) in its config, and gets the ``stage_in`` (``publish``) task for it
(``tfpipe_digits_manual`` shows the per-run form).

The trainer image is the deployment's: each task reads the Airflow Variable ``tfpipe_image`` when
it runs (``make image`` sets it here; elsewhere ``airflow variables set tfpipe_image REF``), so this
file deploys as it is. Paths are directories on the Docker engine's host: ``TFPIPE_HOME`` is the
parent of ``data/``, ``work/`` and ``models/`` (default ``<repo>/.demo``).
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
        dag_id="tfpipe_digits",
        description="Nightly retraining of the UCI digits classifier",
        schedule="0 3 * * *",
        image={"ref": None},  # the deployment's image: the Airflow Variable tfpipe_image, read at run time
        volumes={"data": f"{HOME}/data", "work": f"{HOME}/work", "models": f"{HOME}/models"},
        # 1,797 UCI handwritten digits, 8x8 pixels as 64 CSV columns plus the label
        data={"path": "digits/digits.csv", "format": "csv", "label": "label", "eval_fraction": 0.2},
        training={"model": "mlp", "epochs": 15, "batch_size": 32, "learning_rate": 0.002,
                  "checkpoint_every_steps": 20},
        evaluation={"threshold": 0.95, "tolerance": 0.02},
        export={"model_name": "digits", "keep_versions": 5},
        retry_delay_seconds=float(os.environ.get("TFPIPE_RETRY_DELAY", "30")),
    )
)
