"""The "Run report" and "TensorBoard" extra links of the train, evaluate and export tasks.

Airflow 3 computes an extra link **on the worker**, when the task ends (success or failure), by
calling ``get_link`` and storing the URL in XCom under the link's ``xcom_key``; the UI then reads
that XCom. The path and URL helpers here are pure (no engine, no metadata DB) and are shared with
the shell tooling of :mod:`tfpipe.debug`. Volume paths are paths on the Docker engine's host; the
``file://`` links and the TensorBoard URL are meant for a browser on that host (or with those
paths mounted at the same place).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
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
    """Map a container path under ``/data``, ``/work`` or ``/models`` to the engine host's path.

    Returns ``None`` for ``None`` or a path outside the three mounts.
    """
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


def file_url(path: str) -> str:
    """A ``file://`` URL of an absolute local path."""
    return "file://" + quote(path, safe="/")


def report_container_path(dag_id: str, run_id: str, result: Mapping[str, Any] | None = None) -> str:
    """The report of a task's XCom result (evaluate: run dir; export: model version), else the run's."""
    report = (result or {}).get("report") if isinstance(result, Mapping) else None
    if isinstance(report, str) and report:
        return report
    return f"{contract.run_dir(dag_id, run_id)}/{contract.REPORT_FILE}"


def report_url(volumes: Any, dag_id: str, run_id: str, result: Mapping[str, Any] | None = None) -> str:
    """``file://`` URL of the run report on the engine's host."""
    container = report_container_path(dag_id, run_id, result)
    path = host_path(container, volumes) or host_path(report_container_path(dag_id, run_id), volumes)
    return file_url(path or container)


def tensorboard_run_name(dag_id: str, run_id: str) -> str:
    """The run's name in TensorBoard: ``<dag>/<run>`` as in ``work/runs/<dag>/<run>``.

    ``tfpipe tensorboard`` mounts the event files at ``/logs/<dag>/<run>``, so TensorBoard names
    the run exactly this; a TensorBoard serving the whole ``work/runs`` tree names it
    ``<dag>/<run>/train/tensorboard``, which the same filter matches.
    """
    return f"{contract.safe_name(dag_id)}/{contract.safe_name(run_id, 120)}"


def tensorboard_url(dag_id: str, run_id: str, base: str | None = None) -> str:
    """The TensorBoard URL with the run selected (TensorBoard 2.9's ``?runFilter=<regex>``).

    ``base`` defaults to ``$TFPIPE_TENSORBOARD_URL``, else ``http://localhost:6006``. Safe names
    hold only ``[A-Za-z0-9._-]``, so escaping ``.`` makes the filter match the name literally.
    """
    base = (base or os.environ.get(TENSORBOARD_URL_ENV) or DEFAULT_TENSORBOARD_URL).rstrip("/")
    regex = tensorboard_run_name(dag_id, run_id).replace(".", r"\.")
    return f"{base}/?runFilter={quote(regex, safe='')}#timeseries"


# --- operator extra links ----------------------------------------------------------------------

def task_result(ti_key: Any) -> dict[str, Any] | None:
    """The task's XCom result (``return_value``), or ``None`` when none can be read.

    Works where the task SDK can read XComs (on the worker, where Airflow calls ``get_link``).
    """
    try:
        from airflow.providers.common.compat.sdk import XCom

        value = XCom.get_value(ti_key=ti_key, key="return_value")
    except Exception:  # no result (failed task), or no XCom access here: fall back to the run dir
        return None
    return value if isinstance(value, dict) else None


class RunReportLink(BaseOperatorLink):
    """"Run report": ``file://`` URL of ``report.html`` on the engine's host.

    The report path of the task's XCom result when there is one (evaluate: the run dir; export:
    ``<version>/report/``), otherwise the run dir's (``contract.run_dir``), e.g. for train or a
    failed task.
    """

    name = "Run report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        spec = getattr(operator, "spec", None)  # every backend's stage operator carries its StageSpec
        volumes = spec.volumes if spec is not None else None
        if volumes is None:
            return ""
        return report_url(volumes, ti_key.dag_id, ti_key.run_id, task_result(ti_key))


class TensorBoardLink(BaseOperatorLink):
    """"TensorBoard": ``$TFPIPE_TENSORBOARD_URL`` (default ``http://localhost:6006``), run selected.

    Serve the run with ``tfpipe tensorboard DAG RUN_ID`` (``make tensorboard RUN=...``).
    """

    name = "TensorBoard"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        return tensorboard_url(ti_key.dag_id, ti_key.run_id)
