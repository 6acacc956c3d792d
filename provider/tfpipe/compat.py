"""What differs between the Airflow 3 releases tfpipe supports (3.0 to 3.3), found by feature.

Every check asks Airflow whether it has a feature (a module, a class, an argument type), never
which version it is, so a backport or a patch release does the right thing by itself. The rest of
tfpipe takes these names from here: a difference between releases lives in this one file.

* ``DagBag``: ``airflow.dag_processing.dagbag`` on newer releases (the old home warns there),
  ``airflow.models.dagbag`` on older ones.
* ``CronTriggerTimetable`` and ``AssetOrTimeSchedule``: the Task SDK's (``airflow.sdk``) where it
  has them, else ``airflow.timetables``'.
* ``DagSerialization``: what the scheduler and the UI read a DAG back from (``SerializedDAG`` on
  older releases).
* ``ResumableJobMixin``: Airflow's own from 3.3 on, which keeps a try's external job id in
  ``task_state_store`` so the next try can re-attach to it. Older releases have neither; there the
  common-compat provider's stand-in submits a new job on every try, and :func:`task_state_store`
  returns None. What tfpipe does then is the README's "Supported Airflow versions".
* :func:`doubling_backoff`: ``retry_exponential_backoff`` is a multiplier (a number) from 3.2 on
  and a bool before; both double the wait after each failed try, written differently.
* :func:`run_scheduled_task`: the in-process task runner of ``dag.test()`` and ``airflow tasks
  test`` takes the task beside the task instance from 3.1 on, and reads it from the instance on 3.0.
* :func:`xcom_query`: ``XComModel.get_many`` takes a ``session`` on 3.0 and opens and closes the
  thread's scoped session itself when it gets none; later releases take no session.

Names resolve when first used (PEP 562), so importing this module imports nothing heavy.
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

__all__ = ["doubling_backoff", "has_resumable_jobs", "run_scheduled_task", "task_state_store", "write_dags_for_test",
           "xcom_query", *_HOMES]


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


def task_state_store(context: Any) -> Any | None:
    """The try's ``task_state_store`` accessor, or None where this Airflow has none."""
    return context.get("task_state_store") if hasattr(context, "get") else None


def backoff_takes_multiplier() -> bool:
    """Whether ``retry_exponential_backoff`` takes a multiplier (a number) rather than a bool."""
    try:
        from airflow.sdk.bases.operator import BASEOPERATOR_ARGS_EXPECTED_TYPES

        expected = BASEOPERATOR_ARGS_EXPECTED_TYPES["retry_exponential_backoff"]
    except (ImportError, KeyError):  # that table is internal: read the signature instead
        import inspect

        from airflow.sdk import BaseOperator

        annotation = inspect.signature(BaseOperator.__init__).parameters["retry_exponential_backoff"].annotation
        return "float" in str(annotation)
    return float in (expected if isinstance(expected, tuple) else (expected,))


def doubling_backoff() -> float | bool:
    """The ``retry_exponential_backoff`` value that doubles the wait after each failed try.

    Newer Airflow multiplies ``retry_delay`` by this number per try (``True`` would count as 1
    there: no backoff at all); older Airflow takes a bool whose ``True`` always doubles.
    """
    return 2.0 if backoff_takes_multiplier() else True


def xcom_query(session: Any, *, run_id: str, dag_id: str, key: str | None = None) -> Any:
    """``XComModel.get_many``'s query for one run's XComs (of ``key`` only, when given), to run in ``session``.

    3.0's ``get_many`` is wrapped in ``provide_session``: called without a session it opens the
    thread's scoped session and commits and closes it before returning, which detaches whatever the
    caller loaded in that session (the scheduler's and ``dag.test()``'s session is that one). It is
    handed the caller's session there; later releases build the query without one.
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
    """Run one scheduled task instance ``ti`` of the SDK operator ``task`` in this process, to its
    end state in the metadata DB, with the runner ``dag.test()`` and ``airflow tasks test`` use
    (a deferred task's trigger runs in line).

    That runner takes the task as an argument from 3.1 on; on 3.0 it reads it from ``ti.task``.
    """
    import inspect

    from airflow.sdk.definitions.dag import _run_task

    if "task" in inspect.signature(_run_task).parameters:
        _run_task(ti=ti, task=task, run_triggerer=True)
    else:
        ti.task = task
        _run_task(ti=ti, run_triggerer=True)


def write_dags_for_test(bag: Any) -> None:
    """Write a DagBag's DAGs, and the assets they use, to the metadata DB where ``dag.test()`` does not.

    From 3.1 on ``dag.test()`` syncs the DAG bundle to the DB first (``sync_bag_to_db`` arrived with
    that), which also activates the assets tasks emit. 3.0's ``dag.test()`` runs the DAG from memory
    only, and a task with an outlet (``export``'s model asset) then fails with
    ``AirflowInactiveAssetInInletOrOutletException``. ``tfpipe run`` calls this before ``dag.test()``.
    """
    if hasattr(importlib.import_module(type(bag).__module__), "sync_bag_to_db"):
        return
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    DagBundlesManager().sync_bundles_to_db()  # the DAG rows refer to their bundle's row
    bag.sync_to_db(bundle_name="dags-folder", bundle_version=None)


def is_param_rejection(err: BaseException) -> bool:
    """Whether ``err`` is Airflow refusing a run's ``conf`` against the DAG's Params.

    Most releases raise ``ParamValidationError``; 3.2 validates the serialized DAG's params while
    creating the run and raises a plain ``ValueError("Invalid input for param ...")`` instead.
    """
    from airflow.providers.common.compat.sdk import ParamValidationError

    return isinstance(err, ParamValidationError) or (
        isinstance(err, ValueError) and str(err).startswith("Invalid input for param "))
