"""What differs between the Airflow 3 releases tfpipe supports (3.0 to 3.3), found by feature, never by version.

Names resolve on first use (PEP 562), so importing this module imports nothing heavy.
"""

from __future__ import annotations

import importlib
from typing import Any

#: name -> the places it may live, newest first.
_HOMES: dict[str, tuple[tuple[str, str], ...]] = {
    "DagBag": (("airflow.dag_processing.dagbag", "DagBag"), ("airflow.models.dagbag", "DagBag")),
    "CronTriggerTimetable": (("airflow.sdk", "CronTriggerTimetable"),
                             ("airflow.timetables.trigger", "CronTriggerTimetable")),
    "AssetOrTimeSchedule": (("airflow.sdk", "AssetOrTimeSchedule"),
                            ("airflow.timetables.assets", "AssetOrTimeSchedule")),
    "ResumableJobMixin": (("airflow.sdk", "ResumableJobMixin"),
                          ("airflow.providers.common.compat.sdk", "ResumableJobMixin")),
    "DagSerialization": (("airflow.serialization.serialized_objects", "DagSerialization"),
                         ("airflow.serialization.serialized_objects", "SerializedDAG")),
}

__all__ = ["doubling_backoff", "has_resumable_jobs", "run_scheduled_task", "state_name", "task_state_store",
           "write_dags_for_test", "xcom_query", *_HOMES]


def _find(name: str) -> tuple[Any, str]:
    """``(object, module it came from)`` for one of :data:`_HOMES`."""
    for module, attr in _HOMES[name]:
        try:
            return getattr(importlib.import_module(module), attr), module
        except (ImportError, AttributeError):
            continue
    tried = ", ".join(f"{m}.{a}" for m, a in _HOMES[name])
    raise ImportError(f"this Airflow has none of {tried}. Fix: install Airflow 3.0 to 3.3 "
                      "(see the README's supported versions)")


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value, _ = _find(name)
    globals()[name] = value  # resolved once
    return value


def has_resumable_jobs() -> bool:
    """Whether Airflow itself has ``ResumableJobMixin`` and ``task_state_store`` (not the stand-in)."""
    try:
        _, module = _find("ResumableJobMixin")
    except ImportError:
        return False
    return module == "airflow.sdk"


def state_name(state: Any) -> str | None:
    """``"running"`` for a state given as text or as an enum member (the task SDK's enums print as
    ``DagRunState.RUNNING``)."""
    return None if state is None else str(getattr(state, "value", state))


def task_state_store(context: Any) -> Any | None:
    """The try's ``task_state_store`` accessor, or None where this Airflow has none."""
    return context.get("task_state_store") if hasattr(context, "get") else None


def doubling_backoff() -> float | bool:
    """The ``retry_exponential_backoff`` value that doubles the wait after each failed try (a
    multiplier from 3.2 on, where ``True`` would count as 1; a bool before)."""
    import inspect

    from airflow.sdk import BaseOperator

    annotation = inspect.signature(BaseOperator.__init__).parameters["retry_exponential_backoff"].annotation
    return 2.0 if "float" in str(annotation) else True


def xcom_query(session: Any, *, run_id: str, dag_id: str, key: str | None = None) -> Any:
    """``XComModel.get_many``'s query for one run's XComs (of ``key`` only, when given), to run in ``session``.

    3.0's ``get_many`` would otherwise close the thread's scoped session, detaching what the caller loaded.
    """
    import inspect

    from airflow.models.xcom import XComModel

    kwargs: dict[str, Any] = {"run_id": run_id, "dag_ids": dag_id}
    if key is not None:
        kwargs["key"] = key
    if "session" in inspect.signature(XComModel.get_many).parameters:
        kwargs["session"] = session
    return XComModel.get_many(**kwargs)


def run_scheduled_task(ti: Any, task: Any) -> None:
    """Run task instance ``ti`` of ``task`` to its end state in this process, with ``dag.test()``'s runner
    (which takes the task from 3.1 on and reads ``ti.task`` on 3.0)."""
    import inspect

    from airflow.sdk.definitions.dag import _run_task

    if "task" in inspect.signature(_run_task).parameters:
        _run_task(ti=ti, task=task, run_triggerer=True)
    else:
        ti.task = task
        _run_task(ti=ti, run_triggerer=True)


def write_dags_for_test(bag: Any) -> None:
    """Write a DagBag's DAGs, and the assets they use, to the metadata DB where ``dag.test()`` does not.

    On 3.0 ``dag.test()`` runs from memory only, and a task with an outlet then fails with
    ``AirflowInactiveAssetInInletOrOutletException``.
    """
    if hasattr(importlib.import_module(type(bag).__module__), "sync_bag_to_db"):
        return
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    DagBundlesManager().sync_bundles_to_db()  # the DAG rows refer to their bundle's row
    bag.sync_to_db(bundle_name="dags-folder", bundle_version=None)


def is_param_rejection(err: BaseException) -> bool:
    """Whether ``err`` is Airflow refusing a run's ``conf`` against the DAG's Params (3.2 raises a
    plain ``ValueError("Invalid input for param ...")``)."""
    from airflow.providers.common.compat.sdk import ParamValidationError

    return isinstance(err, ParamValidationError) or (
        isinstance(err, ValueError) and str(err).startswith("Invalid input for param "))
