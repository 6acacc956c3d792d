"""Airflow listener of the tfpipe plugin: the run's note gets a one-line summary when the run ends.

Airflow calls these hooks where a DAG run's state is decided (the scheduler, ``dag.test``, the
REST API's mark-as), inside that caller's DB session: the note is set on the same ``DagRun`` object
and committed with the state change, so no second writer competes for the row. A note a person
already wrote is kept; a run of a DAG that is not tfpipe's is left alone.
"""

from __future__ import annotations

import logging
from typing import Any

from airflow.providers.common.compat.sdk import hookimpl

LOG = logging.getLogger(__name__)


def _set_note(dag_run: Any) -> None:
    from sqlalchemy.orm import object_session

    from tfpipe.plugins.summary import note_for_run

    session = object_session(dag_run)
    if session is None:
        return
    try:
        existing = dag_run.note
        if existing and not str(existing).startswith("tfpipe: "):
            return
        line = note_for_run(dag_run, session)
        if line:
            dag_run.note = line
            LOG.info("run note of %s %s: %s", dag_run.dag_id, dag_run.run_id, line)
    except Exception:  # a summary must never fail the state change that triggered it
        LOG.exception("could not write the tfpipe run note of %s %s", dag_run.dag_id, dag_run.run_id)


@hookimpl
def on_dag_run_success(dag_run: Any, msg: str) -> None:
    _set_note(dag_run)


@hookimpl
def on_dag_run_failed(dag_run: Any, msg: str) -> None:
    _set_note(dag_run)
