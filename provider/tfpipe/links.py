"""The "Run report" and "TensorBoard" extra links of the train, evaluate and export tasks.

Airflow 3 computes an extra link on the worker when the task ends and stores the URL in XCom. The
path helpers here are pure and shared with :mod:`tfpipe.reproduce`.
"""

from __future__ import annotations

import os
import posixpath
from typing import Any
from urllib.parse import quote

from airflow.providers.common.compat.sdk import BaseOperatorLink

from tfpipe import contract

#: Environment variable with the base URL of the TensorBoard the "TensorBoard" link points to.
TENSORBOARD_URL_ENV = "TFPIPE_TENSORBOARD_URL"
DEFAULT_TENSORBOARD_URL = "http://localhost:6006"

# --- paths and URLs ----------------------------------------------------------------------------

def _volume_map(volumes: Any) -> tuple[tuple[str, str], ...]:
    return ((contract.CONTAINER_DATA, volumes.data), (contract.CONTAINER_WORK, volumes.work),
            (contract.CONTAINER_MODELS, volumes.models))


def host_path(container_path: str | None, volumes: Any) -> str | None:
    """Map a container path under ``/data``, ``/work`` or ``/models`` to the engine host's path (else ``None``)."""
    if not container_path:
        return None
    path = posixpath.normpath(container_path)
    for target, source in _volume_map(volumes):
        if path == target:
            return source
        if path.startswith(target + "/"):
            return source.rstrip("/") + path[len(target):]
    return None


def host_run_dir(volumes: Any, dag_id: str, run_id: str) -> str:
    """The run directory (``contract.run_dir``) as a path on the engine's host."""
    path = host_path(contract.run_dir(dag_id, run_id), volumes)
    assert path is not None  # run_dir is always under /work
    return path


def host_tensorboard_dir(volumes: Any, dag_id: str, run_id: str) -> str:
    """The run's TensorBoard event files on the engine's host."""
    return f"{host_run_dir(volumes, dag_id, run_id)}/{contract.TENSORBOARD_SUBDIR}"


def tensorboard_run_name(dag_id: str, run_id: str) -> str:
    """The run's name in TensorBoard: ``<dag>/<run>`` as in ``work/runs/<dag>/<run>`` (a prefix of the name
    a TensorBoard serving the whole tree gives it, so one filter matches both)."""
    return f"{contract.safe_name(dag_id)}/{contract.safe_name(run_id, 120)}"


def tensorboard_url(dag_id: str, run_id: str, base: str | None = None) -> str:
    """The TensorBoard URL at ``base`` (default ``$TFPIPE_TENSORBOARD_URL``, else ``http://localhost:6006``)
    with the run selected (TensorBoard 2.9's ``?runFilter=<regex>``)."""
    base = (base or os.environ.get(TENSORBOARD_URL_ENV) or DEFAULT_TENSORBOARD_URL).rstrip("/")
    regex = tensorboard_run_name(dag_id, run_id).replace(".", r"\.")  # safe names: [A-Za-z0-9._-] only
    return f"{base}/?runFilter={quote(regex, safe='')}#timeseries"


# --- operator extra links ----------------------------------------------------------------------

class RunReportLink(BaseOperatorLink):
    """"Run report": the run's ``report.html`` at ``[api] base_url`` + ``/tfpipe/runs/<dag>/<run>/report/``."""

    name = "Run report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from tfpipe.plugins import paths as plugin_paths  # when the task ends: a parse never needs it

        return plugin_paths.report_url(ti_key.dag_id, ti_key.run_id)


class TensorBoardLink(BaseOperatorLink):
    """"TensorBoard": the run's TensorBoard, started on demand at ``.../tfpipe/runs/<dag>/<run>/tensorboard/``."""

    name = "TensorBoard"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from tfpipe.plugins import paths as plugin_paths

        return plugin_paths.tensorboard_url(ti_key.dag_id, ti_key.run_id)


class MlflowRunLink(BaseOperatorLink):
    """"MLflow run": the MLflow UI page of the run the ``register`` task logged.

    Airflow stores a link when its task ends, before ``register`` logs the run: so ``register`` stores
    this link for ``train`` itself. Read here it is the URL of an earlier ``register``'s result, else empty.
    """

    name = "MLflow run"
    register_task_id = "register"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from airflow.providers.common.compat.sdk import XCom

        try:
            result = XCom.get_one(key="return_value", dag_id=ti_key.dag_id, task_id=self.register_task_id,
                                  run_id=ti_key.run_id)
        except Exception:  # no task runner to ask (a link read outside a task): no run to point at yet
            return ""
        return str(result.get("run_url") or "") if isinstance(result, dict) else ""
