"""``tfpipe run DAG_ID [--conf JSON | --rerun RUN_ID]``: one DAG run through Airflow, as one JSON line.

It runs the DAG with Airflow's own ``dag.test()`` (scheduler loop, task runner, metadata DB), so
retries, skips, Params and XCom behave as in a deployment. Stdout carries only the summary line
(``dag_id``, ``run_id``, ``state``, ``model_dir`` on the engine's host, ``metrics``, ``published``,
``tasks``); the exit status is 0 only when the run succeeded. Stderr shows the stages and epochs
(:mod:`tfpipe.cli.console`) while Airflow's log goes to a file under ``$AIRFLOW_HOME/logs/tfpipe-run/``
(``-v``: on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from tfpipe.cli.common import load_dag, note, quiet_stdout
from tfpipe.cli.console import RunConsole, airflow_log_path


def ensure_pools(dag: Any) -> None:
    """Create the pools the DAG's tasks use when missing (a task in a missing pool never runs)."""
    from airflow.models.pool import Pool

    for name in sorted({t.pool for t in dag.tasks if t.pool and t.pool != Pool.DEFAULT_POOL_NAME}):
        if Pool.get_pool(name) is None:
            Pool.create_or_update_pool(name, 1, "created by tfpipe: one training job at a time", False)


def _host_path(container_path: str | None, dag: Any) -> str | None:
    """Map a container path under /models back to the host path of the models volume."""
    if not container_path:
        return None
    from tfpipe import contract

    for task in dag.tasks:
        volumes = getattr(task, "volumes", None)
        if volumes is not None and container_path.startswith(contract.CONTAINER_MODELS + "/"):
            return volumes.models + container_path[len(contract.CONTAINER_MODELS):]
    return container_path


def summarize(dag: Any, dag_run: Any) -> dict[str, Any]:
    """The run's state, every task's state and result, the exported model and its metrics."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from tfpipe.compat import state_name, xcom_query

    tasks: dict[str, Any] = {}
    results: dict[str, Any] = {}
    with create_session() as session:
        for ti in dag_run.get_task_instances(session=session):
            mapped = ti.map_index is not None and ti.map_index >= 0  # prep_shard[k]: one entry per instance
            key = f"{ti.task_id}[{ti.map_index}]" if mapped else ti.task_id
            tasks[key] = {"state": str(state_name(ti.state)),
                          "try_number": ti.try_number}
        for row in session.scalars(xcom_query(session, run_id=dag_run.run_id, dag_id=dag.dag_id, key="return_value")):
            results[row.task_id] = XComModel.deserialize_value(row)
    # Only tfpipe's stages return a dict; any other DAG's tasks may push anything (a log line).
    results = {task: value for task, value in results.items() if isinstance(value, dict)}
    export = results.get("export") or {}
    evaluation = results.get("evaluate") or {}
    metrics = export.get("metrics") or evaluation.get("metrics") or {}
    return {
        "dag_id": dag.dag_id,
        "run_id": dag_run.run_id,
        "state": state_name(dag_run.state),
        "model_dir": _host_path(export.get("model_dir"), dag),
        "metrics": metrics,
        "blessed": evaluation.get("blessed"),
        "published": (results.get("publish") or {}).get("uri"),
        "tasks": tasks,
    }


def lost_sync_race(err: BaseException) -> bool:
    """Whether ``err`` is the metadata DB refusing a row another process inserted first while ``dag.test()``
    wrote the DAG (``sync_bag_to_db``): two ``tfpipe run`` started together on a new DAG both insert
    its rows, and the slower one fails on a unique constraint before any run exists."""
    from sqlalchemy.exc import IntegrityError, PendingRollbackError

    from tfpipe.exceptions import causes

    return any(isinstance(e, (IntegrityError, PendingRollbackError)) for e in causes(err)) and any(
        frame.name == "sync_bag_to_db" for frame in traceback.extract_tb(err.__traceback__))


def run_dag_test(dag: Any, conf: dict[str, Any] | None, logical_date: datetime | None = None) -> Any:
    """``dag.test(run_conf=conf)`` (at ``logical_date``, else now), once more when its DAG sync lost a race
    with another ``tfpipe run`` (:func:`lost_sync_race`): the second sync only reads the rows the other
    process committed, and nothing ran yet, so nothing is done twice."""
    dated = {"logical_date": logical_date} if logical_date is not None else {}
    try:
        return dag.test(run_conf=conf or None, **dated)
    except Exception as err:
        if not lost_sync_race(err):
            raise
        print(f"tfpipe: another process wrote DAG {dag.dag_id!r} to the metadata DB at the same moment "
              f"({type(err).__name__}); writing it again", file=sys.stderr)
    time.sleep(random.uniform(0.2, 1.0))  # apart from a third run that lost the same race
    return dag.test(run_conf=conf or None, **dated)


def run(dag_id: str, conf: dict[str, Any] | None, dags_folder: str, rerun: str | None = None,
        tasks: list[str] | None = None, only_failed: bool = False, *,
        console: RunConsole | None = None, logical_date: datetime | None = None) -> dict[str, Any]:
    """Run one DAG run of ``dag_id`` with ``conf`` (or re-run run ``rerun`` as the UI's Clear does,
    :mod:`tfpipe.rerun`) and return its summary; Airflow's logs go where :func:`quiet_stdout` sends them."""
    with quiet_stdout():
        dag = load_dag(dag_id, dags_folder, for_test=True)
        ensure_pools(dag)
        if console is not None:
            console.loaded(dags_folder)
        if rerun:
            from tfpipe.rerun import clear_run, drive_run

            cleared = clear_run(dag_id, rerun, task_ids=tasks, only_failed=only_failed)
            print("tfpipe: cleared " + (", ".join(f"{t} (after try {n})" for t, n in cleared) or "nothing"),
                  file=sys.stderr)
            dag_run = drive_run(dag, rerun)
        else:
            dag_run = run_dag_test(dag, conf, logical_date)
        return summarize(dag, dag_run)


def add_parser(sub: Any) -> None:
    """The ``run`` sub-command."""
    run_p = sub.add_parser("run", help="run one DAG run and print a JSON summary line")
    run_p.add_argument("dag_id")
    run_p.add_argument("--conf", default="{}", help="run parameters as a JSON object")
    run_p.add_argument("--logical-date", type=logical_date_arg, metavar="DATE",
                       help="the run's logical date (ISO 8601: 2026-12-06 or 2026-12-06T00:00:00+00:00, UTC "
                       "when no offset is given); its data interval follows from the DAG's schedule. A run of "
                       "a past date is a backfill of it; default: now")
    run_p.add_argument("--dags-folder", default=os.environ.get("AIRFLOW__CORE__DAGS_FOLDER", str(Path("dags"))))
    run_p.add_argument("--rerun", metavar="RUN_ID",
                       help="clear an existing run as the UI's Clear does and run it again: same run, history "
                       "kept, new try numbers (training re-attaches to its container or resumes from checkpoints)")
    run_p.add_argument("--task", dest="tasks", action="append", metavar="TASK_ID",
                       help="with --rerun: clear only this task and its downstream tasks (repeatable)")
    run_p.add_argument("--only-failed", action="store_true", help="with --rerun: clear only failed tasks")
    run_p.add_argument("-v", "--verbose", action="store_true",
                       help="print Airflow's own log on stderr, as Airflow does (without -v it goes to a file "
                       "under $AIRFLOW_HOME/logs/tfpipe-run/ and stderr shows the stages, training's epochs and "
                       "the result)")
    run_p.set_defaults(handler=command)


def logical_date_arg(text: str) -> datetime:
    """``--logical-date``: an ISO 8601 date or time, UTC when it names no offset."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 date or time such as 2026-12-06 "
                                         "or 2026-12-06T00:00:00+00:00") from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def command(args: argparse.Namespace) -> int:
    """``tfpipe run``: print the summary line; 0 when the run succeeded, 2 for rejected parameters.

    Without ``--verbose`` Airflow's log goes to a file before Airflow is first imported (so it sets its
    logging up on that file) and stderr shows the :class:`~tfpipe.cli.console.RunConsole`.
    """
    try:
        conf = json.loads(args.conf or "{}")
    except json.JSONDecodeError as err:
        args.parser.error(f"--conf is not valid JSON ({err}); pass an object such as '{{\"epochs\": 5}}'")
    if not isinstance(conf, dict):
        args.parser.error("--conf must be a JSON object such as '{\"epochs\": 5}'")
    if (args.tasks or args.only_failed) and not args.rerun:
        args.parser.error("--task and --only-failed choose what --rerun RUN_ID clears; add --rerun")
    if args.logical_date is not None and args.rerun:
        args.parser.error("--logical-date dates a new run; a --rerun keeps its run's date: drop one of them")
    console = None
    if not args.verbose:
        try:
            console = RunConsole(args.dag_id, airflow_log_path(args.dag_id))
        except OSError as err:  # a read-only AIRFLOW_HOME: the run still runs, its log shown here
            note(f"cannot keep Airflow's log in a file ({err}); printing it here, as -v does")
    if console is None:
        summary = _run_summary(args, conf, None)
    else:
        console.begin(conf)
        with open(console.log_path, "a", buffering=1) as log_file, quiet_stdout(to=log_file.fileno()), \
                _warnings_to(log_file):
            try:
                summary = _run_summary(args, conf, console)
            except BaseException:  # its error reaches the terminal in full; the log holds what led to it
                console.name_log()
                raise
    if summary is None:
        return 2
    print(json.dumps(summary, sort_keys=False, default=str), flush=True)
    return 0 if summary["state"] == "success" else 1


@contextlib.contextmanager
def _warnings_to(log_file: Any) -> Iterator[None]:
    """Python's warnings (Airflow's deprecations among them) into the run's log file, not the screen."""
    import warnings

    import airflow  # noqa: F401  (its settings put their own showwarning in place at import: ours goes after)

    shown = warnings.showwarning

    def to_log(message, category, filename, lineno, file=None, line=None):  # warnings.showwarning's signature
        log_file.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = to_log
    try:
        yield
    finally:
        warnings.showwarning = shown


def _run_summary(args: argparse.Namespace, conf: dict[str, Any], console: RunConsole | None) -> dict[str, Any] | None:
    """The run's summary, or None when the DAG rejected the run parameters (said on stderr)."""
    from airflow.providers.common.compat.sdk import ParamValidationError

    from tfpipe.compat import is_param_rejection

    if console is not None:
        console.install()
    try:
        summary = run(args.dag_id, conf, args.dags_folder, rerun=args.rerun, tasks=args.tasks,
                      only_failed=args.only_failed, console=console,
                      logical_date=args.logical_date)
    except (ParamValidationError, ValueError) as err:  # rejected before a run starts, as the trigger form does
        if not is_param_rejection(err):
            raise
        print(f"tfpipe: {args.dag_id} rejected the run parameters: {err}. Fix: pass values its Params "
              "accept (the trigger form shows them).", file=sys.stderr)
        return None
    if console is not None:
        console.finish(summary)
    return summary
