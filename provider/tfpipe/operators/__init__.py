"""Operators of the tfpipe provider: :mod:`tfpipe.operators.docker` (the stage operators) and
:mod:`tfpipe.operators.gcs` (Cloud Storage stage-in and publish). The stage operators import from here lazily.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "TfpipeStageOperator": "tfpipe.operators.docker",
    "PrepOperator": "tfpipe.operators.docker",
    "ValidateOperator": "tfpipe.operators.docker",
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
