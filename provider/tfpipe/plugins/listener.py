"""Airflow listener of the tfpipe plugin: the run's note gets a one-line summary when the run ends.

A note bound to the caller's session is committed with the state change (no second writer); a
detached run gets its own short session. A note a person wrote is kept.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.providers.common.compat.sdk import hookimpl

LOG = logging.getLogger(__name__)


def write_note(dag_run: Any, session: Any, state: Any = None) -> None:
    """Set the run's note to its summary, unless a person already wrote one."""
    existing = dag_run.note
    if existing and not str(existing).startswith("tfpipe: "):
        return
    from tfpipe.plugins.summary import note_for_run

    line = note_for_run(dag_run, session, state=state)
    if line:
        dag_run.note = line
        LOG.info("run note of %s %s: %s", dag_run.dag_id, dag_run.run_id, line)


def _set_note(dag_run: Any) -> None:
    from sqlalchemy import inspect, select

    try:
        session = inspect(dag_run).session
        if session is not None:
            write_note(dag_run, session)
            return
        # dag.test() hands over a DagRun detached from any session: write through a short one of
        # our own (the state change it reports is already committed there). Not the thread's scoped
        # session: on Airflow 3.0 that is the one dag.test() itself goes on with, and closing it here
        # would detach what dag.test() has loaded.
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session

        with create_session(scoped=False) as own:
            attached = own.scalars(select(DagRun).where(DagRun.dag_id == dag_run.dag_id,
                                                        DagRun.run_id == dag_run.run_id)).one_or_none()
            if attached is not None:
                write_note(attached, own, state=dag_run.state)
    except Exception:  # a summary must never fail the state change that triggered it
        LOG.exception("could not write the tfpipe run note of %s %s", dag_run.dag_id, dag_run.run_id)


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    _set_note(dag_run)


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    _set_note(dag_run)
