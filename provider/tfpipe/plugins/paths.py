"""Where the plugin serves a run, and what a stage task records so the api-server can find it (pure)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

#: Mount point of the plugin's FastAPI app under the api-server.
URL_PREFIX = "/tfpipe"
#: XCom key under which every stage task records where its run's files live (see :func:`location_record`).
LOCATION_XCOM_KEY = "tfpipe_location"
#: The report files the api-server hands out (written by the evaluate stage, ``trainer.report``).
REPORT_HTML = "report.html"
REPORT_FILES = (REPORT_HTML, "loss.png", "accuracy.png", "confusion_matrix.png")


def _segment(value: str) -> str:
    # Airflow run ids may hold ':' and '+'; quoting keeps them one path segment either way.
    return quote(value, safe="")


def base_url() -> str:
    """``[api] base_url`` without a trailing slash, or ``""`` (links are then root-relative)."""
    try:
        from airflow.configuration import conf

        return (conf.get("api", "base_url", fallback="") or "").rstrip("/")
    except Exception:  # no Airflow configuration here (pure unit tests)
        return ""


def run_path(dag_id: str, run_id: str) -> str:
    """The path of a run under the api-server: ``/tfpipe/runs/<dag>/<run>``."""
    return f"{URL_PREFIX}/runs/{_segment(dag_id)}/{_segment(run_id)}"


def report_url(dag_id: str, run_id: str, base: str | None = None) -> str:
    """URL of the run report served by the plugin (trailing slash: the plots resolve next to it)."""
    return f"{base_url() if base is None else base.rstrip('/')}{run_path(dag_id, run_id)}/report/"


def tensorboard_url(dag_id: str, run_id: str, base: str | None = None) -> str:
    """URL of the run's TensorBoard, started on demand by the plugin."""
    return f"{base_url() if base is None else base.rstrip('/')}{run_path(dag_id, run_id)}/tensorboard/"


def location_record(*, stage: str, docker_url: str, image: str, volumes: Any) -> dict[str, Any]:
    """What the api-server needs to read a run's files through the engine: the engine, the image and
    the volume paths on the engine's host."""
    return {"stage": stage, "docker_url": docker_url, "image": image, "work": volumes.work,
            "models": volumes.models}


def parse_location(value: Any) -> dict[str, str] | None:
    """The record read back from XCom, or ``None`` when it is missing or malformed."""
    if not isinstance(value, Mapping):
        return None
    keys = ("docker_url", "image", "work")
    if not all(isinstance(value.get(k), str) and value.get(k) for k in keys):
        return None
    return {k: str(value[k]) for k in (*keys, "models", "stage") if value.get(k)}
