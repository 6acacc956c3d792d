"""Strict run parameters: a run's ``conf`` may only name the DAG's Params.

Airflow passes unknown ``conf`` keys through silently, so a typo such as ``{"epoch": 3}`` would train
the default; every tfpipe task calls :func:`reject_unknown_conf` first in ``execute()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def conf_only_keys() -> frozenset[str]:
    """Keys a run's ``conf`` may set without being a trigger-form Param (advanced overrides)."""
    from tfpipe import contract

    return frozenset(contract.overridable())


#: Run parameters only some pipelines have, and how a pipeline gets them.
OPTIONAL_PARAMS = {
    "data_uri": "this DAG has no stage_in task: give its PipelineConfig data_uri or gcs_tasks=True",
    "publish_uri": "this DAG has no publish task: give its PipelineConfig publish_uri or gcs_tasks=True",
}


def unknown_run_params(conf: Mapping[str, Any] | None, known: Iterable[str]) -> list[str]:
    """The messages for every key of ``conf`` that is not in ``known`` (empty: all keys known)."""
    names = sorted(set(known))
    problems = []
    for key in sorted(str(k) for k in (conf or {})):
        if key in names:
            continue
        import difflib  # only for a key that is wrong

        close = difflib.get_close_matches(key, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if key in OPTIONAL_PARAMS:
            hint = f" ({OPTIONAL_PARAMS[key]})"
        problems.append(f"unknown run parameter {key!r}{hint}")
    return problems


def reject_unknown_conf(context: Mapping[str, Any], task_id: str) -> None:
    """Fail the task without retrying when the run's ``conf`` names a parameter the DAG lacks."""
    dag_run = context.get("dag_run")
    dag = context.get("dag")
    conf = getattr(dag_run, "conf", None) or {}
    if not conf or dag is None:
        return
    known = set(dag.params.keys()) | conf_only_keys()
    problems = unknown_run_params(conf, known)
    if problems:
        from airflow.providers.common.compat.sdk import AirflowFailException

        params = ", ".join(sorted(dag.params.keys()))
        raise AirflowFailException(
            f"{task_id}: " + "; ".join(problems) + f". Fix: remove it from the run's conf, or use one of "
            f"{dag.dag_id}'s parameters: {params}. Nothing ran.")
