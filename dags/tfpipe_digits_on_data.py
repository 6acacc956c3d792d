"""Retrain when new digits data lands: scheduled on the raw-data Airflow Asset.

Whatever writes the data (an ingestion DAG, or any task with ``outlets=[Asset(DATA_ASSET)]``)
triggers this DAG; its export emits the model asset ``tfpipe://models/digits`` that a deploy
DAG can schedule on (``schedule=[Asset("tfpipe://models/digits")]``).
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
DATA_ASSET = f"file://{HOME}/data/digits"

dag = training_pipeline(
    PipelineConfig(
        dag_id="tfpipe_digits_on_data",
        description="Retrains the digits classifier whenever the raw data asset is updated",
        schedule=None,
        data_asset=DATA_ASSET,
        model_asset="tfpipe://models/digits",
        tags=("tfpipe", "data-aware"),
        image={"ref": None},  # the deployment's image: the Airflow Variable tfpipe_image, read at run time
        volumes={"data": f"{HOME}/data", "work": f"{HOME}/work", "models": f"{HOME}/models"},
        data={"path": "digits/digits.csv"},
        training={"model": "mlp", "epochs": 15, "batch_size": 32, "learning_rate": 0.002},
        evaluation={"threshold": 0.95, "tolerance": 0.02},
        export={"model_name": "digits"},
        retry_delay_seconds=float(os.environ.get("TFPIPE_RETRY_DELAY", "30")),
    )
)
