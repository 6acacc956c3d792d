"""Re-running an existing DAG run in one process, the way the UI's "Clear" does.

``tfpipe run DAG --rerun RUN_ID`` clears task instances with Airflow's ``clear_task_instances`` and
:func:`drive_run` runs the cleared run to its end here. ``dag.test()`` cannot be used: it replaces the
run, losing its history, try numbers and ``task_state_store``. With a scheduler, use the REST API's clear.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

#: Task states that mean "a worker was running this": after the worker died they stay so until the
#: scheduler's heartbeat timeout fails them; in one process there is no scheduler to do it.
_LEFT_BY_A_DEAD_WORKER = ("running", "queued", "restarting", "scheduled")


def clear_run(dag_id: str, run_id: str, *, task_ids: Sequence[str] | None = None,
              only_failed: bool = False) -> list[tuple[str, int]]:
    """Clear ``run_id`` of ``dag_id`` as the UI's Clear does; return the cleared ``(task_id, try_number)``.

    :param task_ids: clear these tasks and everything downstream of them; ``None`` = every task.
    :param only_failed: clear only failed (and upstream-failed) task instances.
    """
    from airflow.models.dagrun import DagRun
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.models.taskinstance import clear_task_instances
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    from tfpipe.compat import state_name

    with create_session() as session:
        dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        if dag_run is None:
            raise SystemExit(f"tfpipe: no run {run_id!r} of DAG {dag_id!r} to re-run")
        tis = list(dag_run.get_task_instances(session=session))
        for ti in tis:
            if state_name(ti.state) in _LEFT_BY_A_DEAD_WORKER:
                print(f"tfpipe: {ti.task_id} try {ti.try_number} was left {ti.state} by a dead worker: "
                      "marking it failed before the re-run", file=sys.stderr)
                ti.set_state(TaskInstanceState.FAILED, session=session)
        session.flush()
        if task_ids:
            # else the newest serialized version, as the scheduler reads it (every Airflow 3 release has this)
            dag = dag_run.dag or SerializedDagModel.get_dag(dag_id, session=session)
            unknown = sorted(set(task_ids) - set(dag.task_ids))
            if unknown:
                raise SystemExit(f"tfpipe: {dag_id} has no task {', '.join(unknown)} (tasks: {', '.join(dag.task_ids)})")
            wanted = set(task_ids)
            for task_id in task_ids:
                wanted |= dag.get_task(task_id).get_flat_relative_ids(upstream=False)
            tis = [ti for ti in tis if ti.task_id in wanted]
        if only_failed:
            failed = (TaskInstanceState.FAILED, TaskInstanceState.UPSTREAM_FAILED)
            tis = [ti for ti in tis if ti.state in failed]
        cleared = [(ti.task_id, int(ti.try_number or 0)) for ti in tis]
        clear_task_instances(tis, session, DagRunState.QUEUED)
    return cleared


def drive_run(dag: Any, run_id: str) -> Any:
    """Run the tasks of an existing (cleared) run of ``dag`` to the run's end, in this process; return the run.

    The loop is ``dag.test()``'s: ``update_state`` says which task instances are ready; each gets its
    next try number and runs here, until the run has an end state.
    """
    import logging
    import time

    from airflow import settings
    from airflow.models.dagrun import DagRun
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import select

    from tfpipe.compat import DagSerialization, run_scheduled_task

    log = logging.getLogger(__name__)
    scheduler_dag = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    # The serialized DAG records only that the DAG has run callbacks; update_state calls them from
    # it, as dag.test() sets them there too.
    scheduler_dag.on_success_callback = dag.on_success_callback
    scheduler_dag.on_failure_callback = dag.on_failure_callback
    session = settings.Session()  # the thread's scoped session, which the task runner also uses
    run = session.scalar(select(DagRun).where(DagRun.dag_id == dag.dag_id, DagRun.run_id == run_id))
    run.dag = scheduler_dag
    run.set_state(DagRunState.RUNNING)
    session.commit()
    while run.state == DagRunState.RUNNING:
        session.expire_all()
        ready, _ = run.update_state(session=session)
        for ti in ready:
            if ti.state != TaskInstanceState.UP_FOR_RESCHEDULE:  # a reschedule goes on in the same try
                ti.try_number += 1
            ti.state = TaskInstanceState.SCHEDULED
            ti.scheduled_dttm = datetime.now(timezone.utc)
        session.commit()
        scheduled = [ti for ti in run.get_task_instances(session=session) if ti.state == TaskInstanceState.SCHEDULED]
        if not scheduled and run.state == DagRunState.RUNNING:
            time.sleep(1)  # nothing ready yet (a task waits to be rescheduled)
        for ti in scheduled:
            try:
                run_scheduled_task(ti, dag.task_dict[ti.task_id])
            except Exception:  # the task failed: its state says so, and the run goes on as a scheduler's would
                log.exception("tfpipe: %s failed", ti)
    return run
