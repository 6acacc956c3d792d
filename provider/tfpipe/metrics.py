"""Training and evaluation figures as Airflow metrics (StatsD / Datadog / OpenTelemetry), named
``tfpipe.<dag_id>.<stage>.<figure>`` with tags ``dag_id`` and ``stage``, sent when Airflow's metrics are on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from typing import Any

LOG = logging.getLogger(__name__)

_TRAIN_KEYS = ("final_loss", "final_accuracy", "final_val_loss", "final_val_accuracy", "epochs", "steps",
               "try_number")


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and value == value:  # NaN is no gauge value
        return float(value)
    return None


def stage_gauges(stage: str, result: Mapping[str, Any] | None) -> dict[str, float]:
    """The gauges of one stage result, by name below ``tfpipe.<dag_id>.<stage>.`` (pure)."""
    result = result or {}
    found: dict[str, Any] = {}
    if stage == "train":
        found = {k: result.get(k) for k in _TRAIN_KEYS}
        found["resumed"] = result.get("resumed_from") is not None
    elif stage == "evaluate":
        found = dict(result.get("metrics") or {})
        found["blessed"] = result.get("blessed")
    elif stage == "export":
        found = {"version": result.get("version")}
    elif stage in ("prep", "prep_merge"):
        examples = result.get("examples")
        found = {"examples": sum(examples.values()) if isinstance(examples, Mapping) else None}
    return {name: number for name, value in found.items() if (number := _number(value)) is not None}


@functools.lru_cache(maxsize=1)
def _backend() -> Any:
    # The task runner initialises Airflow's Stats, but dag.test() runs tasks in-process without
    # it; a backend from Airflow's own factory follows the same [metrics] settings either way.
    try:
        from airflow.sdk.observability.metrics.stats_utils import get_stats_factory
    except ImportError:  # older Airflow: its Stats is set up in every process
        from airflow.providers.common.compat.sdk import Stats

        return Stats
    import inspect

    if "stats_cls" in inspect.signature(get_stats_factory).parameters:
        # Airflow 3.2 asks for the Stats class (its Datadog logger reads settings from it)
        from airflow.providers.common.compat.sdk import Stats

        return get_stats_factory(Stats)()
    return get_stats_factory()()


def emit_stage_metrics(dag_id: str, stage: str, result: Mapping[str, Any] | None) -> dict[str, float]:
    """Send the stage's gauges when Airflow's metrics are on; return what was sent by full name."""
    from airflow.providers.common.compat.sdk import conf

    if not any(conf.getboolean("metrics", key, fallback=False)
               for key in ("statsd_on", "statsd_datadog_enabled", "otel_on")):
        return {}
    sent: dict[str, float] = {}
    try:
        backend = _backend()
    except Exception:  # e.g. the statsd package is missing: metrics must never fail a stage
        LOG.warning("Airflow metrics are on but no metrics client could be made; tfpipe sends none",
                    exc_info=True)
        return sent
    tags = {"dag_id": dag_id, "stage": stage}
    for name, value in stage_gauges(stage, result).items():
        stat = f"tfpipe.{dag_id}.{stage}.{name}"
        try:
            backend.gauge(stat, value, tags=tags)
        except Exception:  # metrics must never fail a stage that succeeded
            LOG.warning("could not send metric %s", stat, exc_info=True)
            continue
        sent[stat] = value
    if sent and conf.getboolean("metrics", "otel_on", fallback=False):
        _flush_otel()
    return sent


def _flush_otel(timeout_millis: int = 5000) -> None:
    """Export the gauges now. OpenTelemetry sends them every ``[metrics] otel_interval_milliseconds``
    (60 s by default), and Airflow 3.0 registers no flush at exit: a task process that ends before
    the next export would take its stage's gauges with it."""
    try:
        from opentelemetry import metrics

        flush = getattr(metrics.get_meter_provider(), "force_flush", None)
        if flush is not None:
            flush(timeout_millis=timeout_millis)
    except Exception:  # metrics must never fail a stage that succeeded
        LOG.warning("could not export the stage's metrics to OpenTelemetry", exc_info=True)
