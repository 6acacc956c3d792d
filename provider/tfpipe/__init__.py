"""tfpipe: Airflow provider for scheduled TensorFlow 2.9 training pipelines in pinned containers.

Public API, imported lazily so ``import tfpipe`` stays light::

    from tfpipe import PipelineConfig, training_pipeline
    from tfpipe.operators import PrepOperator, ValidateOperator, TrainOperator, EvaluateOperator, ExportOperator
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "PipelineConfig": "tfpipe.config",
    "ImageConfig": "tfpipe.config",
    "VolumesConfig": "tfpipe.config",
    "DataConfig": "tfpipe.config",
    "TrainingConfig": "tfpipe.config",
    "EvaluationConfig": "tfpipe.config",
    "ExportConfig": "tfpipe.config",
    "ResourcesConfig": "tfpipe.config",
    "TfpipeConfigError": "tfpipe.config",
    "training_pipeline": "tfpipe.dag_factory",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfpipe' has no attribute {name!r}")
