"""What the ``tfpipe`` commands share: loading a DAG, finding a run, quiet stdout, launching docker."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def load_dag(dag_id: str, dags_folder: str, *, for_test: bool = False):
    """The DAG ``dag_id`` of ``dags_folder``; ``for_test``: written to the DB as ``dag.test()`` needs it
    (and the metadata DB created first when it is a SQLite file that does not exist yet)."""
    from tfpipe.compat import DagBag, write_dags_for_test

    if for_test:
        check_metadata_db(create=True)
    bag = DagBag(dag_folder=dags_folder)
    if bag.import_errors:
        for path, err in bag.import_errors.items():
            print(f"tfpipe: DAG import error in {path}:\n{err}", file=sys.stderr)
    # get_dag() also asks the metadata DB whether the DAG expired; the debug commands need only the
    # file's DAG, and work without a DB (from the run dirs alone)
    dag = bag.get_dag(dag_id) if for_test else bag.dags.get(dag_id)
    if dag is None:
        known = ", ".join(sorted(bag.dag_ids)) or "none"
        raise SystemExit(f"tfpipe: no DAG {dag_id!r} in {dags_folder} (found: {known})"
                         + skipped_by_safe_mode(dags_folder))
    if for_test:
        write_dags_for_test(bag)
    return dag


def skipped_by_safe_mode(dags_folder: str) -> str:
    """Why a DAG file of the user's may not have been read at all, and the fix ('' when none applies).

    Safe mode opens only files whose text names "airflow" and "dag"; a tfpipe-only file names neither.
    """
    from airflow.configuration import conf
    from airflow.utils.file import list_py_file_paths, might_contain_dag

    if not conf.getboolean("core", "dag_discovery_safe_mode", fallback=True):
        return ""
    skipped = []
    for path in list_py_file_paths(dags_folder, safe_mode=False):
        try:
            text = Path(path).read_bytes().lower()
        except OSError:
            continue
        if b"tfpipe" in text and not might_contain_dag(path, safe_mode=True):
            skipped.append(os.path.relpath(path, dags_folder) if os.path.isdir(dags_folder) else path)
    if not skipped:
        return ""
    return (f". Airflow did not read {', '.join(sorted(skipped))}: it uses tfpipe, but Airflow's DAG discovery "
            "safe mode reads only files whose text names both \"airflow\" and \"dag\". Fix: add the line "
            "`from airflow.sdk import DAG  # noqa: F401` (or a comment naming airflow and dag) to the file, "
            "or set AIRFLOW__CORE__DAG_DISCOVERY_SAFE_MODE=False")


def metadata_db_url() -> str:
    """The metadata DB's ``sql_alchemy_conn``, its password (if any) written ``***``."""
    from airflow.configuration import conf
    from sqlalchemy.engine import make_url

    raw = conf.get("database", "sql_alchemy_conn")
    try:
        return make_url(raw).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 -- not a URL SQLAlchemy reads: show only its scheme
        return raw.split(":", 1)[0] + ":***"


def check_metadata_db(*, create: bool) -> None:
    """Stop with the fix when the metadata DB has no Airflow tables; ``create``: make a SQLite one instead.

    A server DB, or a SQLite DB that holds other tables, is never migrated behind its operator's back.
    """
    from airflow import settings
    from sqlalchemy import inspect

    url = metadata_db_url()
    try:
        tables = set(inspect(settings.engine).get_table_names())
    except Exception as err:  # noqa: BLE001 -- any driver's error: name the DB and what was said
        raise SystemExit(f"tfpipe: cannot read Airflow's metadata DB at {url} ({type(err).__name__}: {err}). "
                         "Fix: check [database] sql_alchemy_conn (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN) and "
                         "that the DB server answers.") from err
    if {"dag", "dag_run", "alembic_version"} <= tables:
        return
    if create and not tables and settings.engine.url.get_backend_name() == "sqlite":
        note(f"Airflow's metadata DB at {url} is empty (a new AIRFLOW_HOME): creating it, as "
             "`airflow db migrate` does (once; a few seconds)")
        from airflow.utils.db import upgradedb

        upgradedb()
        return
    home = os.environ.get("AIRFLOW_HOME", "~/airflow")
    raise SystemExit(f"tfpipe: Airflow's metadata DB at {url} (AIRFLOW_HOME={home}) has no Airflow tables"
                     + (f" (it has {len(tables)} other tables)" if tables else "")
                     + ". Fix: run `airflow db migrate` with this AIRFLOW_HOME, or point AIRFLOW_HOME / "
                     "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN at the DB you migrated.")


#: Where :func:`quiet_stdout` sends file descriptor 1 now: stderr, or the file of Airflow's log.
_STDOUT_SINKS = [2]


@contextlib.contextmanager
def quiet_stdout(to: int | None = None):
    """Send whatever Airflow prints while loading DAGs or reading the DB (its log goes to stdout) to
    stderr, or to the file descriptor ``to``; nested, to where the enclosing one sends it.

    It moves file descriptor 1, not ``sys.stdout``: log handlers keep the object they found, and C
    libraries and subprocesses write to the descriptor.
    """
    target = _STDOUT_SINKS[-1] if to is None else to
    saved = os.dup(1)
    sys.stdout.flush()
    os.dup2(target, 1)
    _STDOUT_SINKS.append(target)
    try:
        yield
    finally:
        _STDOUT_SINKS.pop()
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def task_image(task: Any) -> str:
    """The task's image: its own, else the Airflow Variable tfpipe_image (as the task reads it)."""
    from tfpipe.exceptions import ImageNotSetError
    from tfpipe.settings import resolve_image

    try:
        with quiet_stdout():
            return resolve_image(task.image, task=task.task_id, allow_floating_tag=True)
    except ImageNotSetError as err:
        raise SystemExit(f"tfpipe: {err}") from err


def note(message: str) -> None:
    print(f"tfpipe: {message}", file=sys.stderr, flush=True)


def stage_tasks(dag: Any) -> list[Any]:
    """The DAG's tfpipe stage tasks (no mapped ones: see :func:`stage_task`)."""
    from tfpipe.operators.docker import TfpipeStageOperator

    return [t for t in dag.tasks if isinstance(t, TfpipeStageOperator)]


def on_its_engine(task: Any) -> Any:
    """``task`` pointed at the engine its tries use, as its ``execute()`` points it: the deployment's
    ``[tfpipe] docker_url`` and TLS files unless the DAG names an engine of its own."""
    from tfpipe.engine_settings import EngineSettings
    from tfpipe.exceptions import TfpipeConfigError

    try:
        EngineSettings.from_airflow_config().apply_to(task, tls_for_named_engine=task.engine_from_shard_list)
    except TfpipeConfigError as err:
        raise SystemExit(f"tfpipe: {err}") from err
    return task


def _mapped_stage_tasks(dag: Any) -> list[Any]:
    """The DAG's mapped tfpipe stage tasks (``prep_shard``), still mapped."""
    from tfpipe.operators.docker import TfpipeStageOperator

    # an operator's own operator_class is its class: only a mapped task is not an instance of it
    return [t for t in dag.tasks if not isinstance(t, TfpipeStageOperator)
            and isinstance(getattr(t, "operator_class", None), type)
            and issubclass(t.operator_class, TfpipeStageOperator)]


def _instance_count(task: Any) -> int:
    """How many instances a mapped task has: ``expand(shard_index=[...])`` keeps a dict of lists,
    ``expand_kwargs([...])`` a list of dicts."""
    import math

    value = task.expand_input.value
    return math.prod(len(v) for v in value.values()) if isinstance(value, dict) else len(value)


def _unmapped(task: Any, map_index: int) -> Any:
    """Instance ``map_index`` of a mapped stage task as the operator its try runs.

    tfpipe maps only over values fixed at parse time, so the instance is known without a run.
    """
    from types import SimpleNamespace

    count = _instance_count(task)
    if not 0 <= map_index < count:
        raise SystemExit(f"tfpipe: --map-index {map_index}: {task.task_id} has instances 0..{count - 1}. "
                         f"Fix: give one of them (the shard's index).")
    kwargs, _ = task._expand_mapped_kwargs({"ti": SimpleNamespace(map_index=map_index)})
    return task.unmap(kwargs)


def stage_task(dag: Any, task_id: str, map_index: int | None = None) -> Any:
    """The stage task ``task_id`` of ``dag``; of a mapped one (``prep_shard``), instance ``map_index``."""
    stages = stage_tasks(dag)
    for task in stages:
        if task.task_id == task_id:
            if map_index is not None:
                raise SystemExit(f"tfpipe: --map-index {map_index}: {task_id} is not a mapped task. "
                                 "Fix: leave --map-index out.")
            return task
    mapped = _mapped_stage_tasks(dag)
    for task in mapped:
        if task.task_id == task_id:
            if map_index is None:
                raise SystemExit(f"tfpipe: {task_id} is a mapped task (one instance per shard, "
                                 f"0..{_instance_count(task) - 1}). Fix: add --map-index N.")
            return _unmapped(task, map_index)
    known = {t.task_id for t in [*stages, *mapped]}
    names = ", ".join(t.task_id for t in dag.tasks if t.task_id in known) or "none"
    raise SystemExit(f"tfpipe: {dag.dag_id} has no tfpipe stage task {task_id!r} (stage tasks: {names})")


def _db_runs(dag_id: str) -> list[Any]:
    """The DAG's runs in the metadata DB (none when it cannot be read)."""
    try:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session

        with create_session() as session:
            runs = DagRun.find(dag_id=dag_id, session=session)
            for run in runs:
                session.expunge(run)
            return runs
    except Exception as err:  # no DB yet, another Airflow: work from the run dirs alone
        note(f"cannot read runs of {dag_id} from the metadata DB ({type(err).__name__}: {err})")
        return []


def resolve_run(dag_id: str, run: str | None, work_volume: str) -> tuple[str, Any | None]:
    """``(run_id, dag_run or None)`` for ``run``: a run id, a run dir name, or ``latest``.

    ``latest`` is the newest run directory under ``<work>/runs/<dag>/`` when this machine sees
    the work volume, else the newest run in the metadata DB.
    """
    from tfpipe import contract

    runs = _db_runs(dag_id)
    by_safe = {contract.safe_name(r.run_id, 120): r for r in runs}
    if not run or run == "latest":
        root = Path(work_volume) / "runs" / contract.safe_name(dag_id)
        dirs = [p for p in root.iterdir() if p.is_dir()] if root.is_dir() else []
        if dirs:
            newest = max(dirs, key=lambda p: p.stat().st_mtime)
            found = by_safe.get(newest.name)
            if found is None:
                note(f"run dir {newest} is not a run in the metadata DB: using its name as the run id")
            return (found.run_id if found else newest.name), found
        if runs:
            newest_run = max(runs, key=lambda r: r.run_after or r.logical_date or r.start_date)
            return newest_run.run_id, newest_run
        raise SystemExit(f"tfpipe: no run of {dag_id} found (no run dirs under {root}, none in the metadata DB)")
    for candidate in runs:
        if candidate.run_id == run:
            return run, candidate
    if run in by_safe:
        return by_safe[run].run_id, by_safe[run]
    note(f"run {run!r} of {dag_id} is not in the metadata DB: using the DAG's default params")
    return run, None


def try_number_of(dag_run: Any, task_id: str, map_index: int = -1) -> int:
    """The task's newest try in the run (1 when the DB does not know it); ``map_index``: of that
    instance of a mapped task."""
    if dag_run is None:
        return 1
    try:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            ti = session.scalars(select(TaskInstance).where(
                TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id,
                TaskInstance.task_id == task_id, TaskInstance.map_index == map_index)).first()
            return max(int(ti.try_number or 1), 1) if ti is not None else 1
    except Exception:  # noqa: BLE001 -- best effort: the try number only labels the shell
        return 1


def run_params(dag: Any, task: Any, conf: dict[str, Any] | None) -> dict[str, Any]:
    """The params the task saw: DAG and task Params updated with the run's conf, as Airflow does."""
    from airflow.sdk.definitions.param import process_params

    return dict(process_params(dag, task, conf, suppress_exception=False))


def launch(cmd: list[str], args: argparse.Namespace, after: list[str] | None = None) -> int:
    """Print ``cmd`` (``--print``), start it detached and print the container id, or exec it."""
    from tfpipe.reproduce import printable

    if args.print:
        print(printable(cmd), flush=True)
        return 0
    if args.detach:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stderr.strip() or f"docker exited {proc.returncode}", file=sys.stderr)
            return proc.returncode
        print(proc.stdout.strip(), flush=True)
        for line in after or []:
            print(line, flush=True)
        return 0
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(cmd[0], cmd)
    return 0  # not reached
