"""Operators of the tfpipe provider, one module per backend or concern.

- :mod:`tfpipe.operators.docker`: the stage operators (``PrepOperator``, ``TrainOperator``,
  ``EvaluateOperator``, ``ExportOperator``, and sharded prep's ``PrepShardOperator`` and
  ``PrepMergeOperator``) on a Docker engine;
- :mod:`tfpipe.operators.gcs`: Google Cloud Storage stage-in and publish.

The stage operators are importable from here too (``from tfpipe.operators import TrainOperator``),
lazily, so importing one module does not import the others.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "TfpipeStageOperator": "tfpipe.operators.docker",
    "PrepOperator": "tfpipe.operators.docker",
    "TrainOperator": "tfpipe.operators.docker",
    "EvaluateOperator": "tfpipe.operators.docker",
    "ExportOperator": "tfpipe.operators.docker",
    "PrepShardOperator": "tfpipe.operators.docker",
    "PrepMergeOperator": "tfpipe.operators.docker",
    "OPERATORS": "tfpipe.operators.docker",
    "stage_operator": "tfpipe.operators.docker",
    "GcsStageInOperator": "tfpipe.operators.gcs",
    "GcsPublishOperator": "tfpipe.operators.gcs",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'tfpipe.operators' has no attribute {name!r}")
