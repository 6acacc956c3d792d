"""Airflow DAG: a hyperparameter sweep of the digits classifier, on demand.

prep -> validate -> train (4 mapped trials, 2 at a time) -> select -> evaluate -> export. Each trial
is a mapped instance of ``train`` with its own settings and checkpoints, so a killed trial is retried
and resumes alone; ``select`` picks the trial with the best validation accuracy, and the blessing
gate and export take its model. The exported version's ``metadata.json`` and the run report name
the chosen trial and list every trial. On GPU hosts, name a pool (``gpu_pool="gpu"``) so the
trials share the GPUs with every other training task.

Trigger it from the UI or with ``make run DAG=tfpipe_digits_sweep``.
"""

from __future__ import annotations

import os
from pathlib import Path

import airflow.providers.tfpipe  # noqa: F401  (see tfpipe_digits_manual.py: the DAG processor's pre-import)
from tfpipe import PipelineConfig, training_pipeline

HOME = os.environ.get("TFPIPE_HOME") or str(Path(__file__).resolve().parent.parent / ".demo")

dag = training_pipeline(
    PipelineConfig(
        dag_id="tfpipe_digits_sweep",
        description="Hyperparameter sweep of the digits classifier: 4 trials, 2 at a time",
        schedule=None,
        tags=("tfpipe", "sweep"),
        image={"ref": None},  # the deployment's image: the Airflow Variable tfpipe_image, read at run time
        volumes={"data": f"{HOME}/data", "work": f"{HOME}/work", "models": f"{HOME}/models"},
        data={"path": "digits/digits.csv"},
        training={"model": "mlp", "epochs": 8, "batch_size": 32, "checkpoint_every_steps": 20},
        # --8<-- [start:tuning]
        tuning={
            "space": {
                "learning_rate": {"low": 0.0003, "high": 0.01, "log": True},
                "model_kwargs.hidden_units": [[32], [64, 32]],
            },
            "search": "random",
            "trials": 4,
            "parallel": 2,
            "seed": 2,
            "metric": "val_accuracy",
        },
        # --8<-- [end:tuning]
        evaluation={"threshold": 0.9},
        # sweeps publish under their own name, never over the production model
        export={"model_name": "digits_sweep"},
        retry_delay_seconds=float(os.environ.get("TFPIPE_RETRY_DELAY", "30")),
    )
)
