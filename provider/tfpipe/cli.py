"""``tfpipe run DAG_ID [--conf JSON | --rerun RUN_ID]``: one DAG run through Airflow, as one JSON line.

It runs the DAG with Airflow's own ``dag.test()`` (the scheduler's dependency loop, real task
runner, the metadata DB at ``$AIRFLOW_HOME``), so retries, skips, Params validation and XCom all
behave as in a deployment. The last line printed is::

    {"dag_id": ..., "run_id": ..., "state": "success", "model_dir": ..., "metrics": {...}, "tasks": {...}}

``model_dir`` is the exported version as a path on the engine's host; ``published`` its
``gs://`` URI when the run published it. The exit status is 0 only when the run succeeded.

Seeing and reproducing a run (:mod:`tfpipe.debug`):

* ``tfpipe tensorboard DAG_ID RUN_ID|latest [--port 6006]`` serves the run's TensorBoard event
  files from the trainer image on ``127.0.0.1:PORT`` and prints the URL;
* ``tfpipe shell DAG_ID TASK_ID [--run RUN_ID|latest]`` opens a shell in a container set up as
  that task's (image, mounts, user, environment with the run's ``TFPIPE_CONFIG``, working dir,
  network), where ``python3 -m trainer <stage>`` reruns the stage. Private environment values
  are left out. ``--print`` prints the ``docker run`` command instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any


def _load_dag(dag_id: str, dags_folder: str):
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=dags_folder)
    if bag.import_errors:
        for path, err in bag.import_errors.items():
            print(f"tfpipe: DAG import error in {path}:\n{err}", file=sys.stderr)
    dag = bag.get_dag(dag_id)
    if dag is None:
        known = ", ".join(sorted(bag.dag_ids)) or "none"
        raise SystemExit(f"tfpipe: no DAG {dag_id!r} in {dags_folder} (found: {known})")
    return dag


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

    tasks: dict[str, Any] = {}
    results: dict[str, Any] = {}
    with create_session() as session:
        for ti in dag_run.get_task_instances(session=session):
            tasks[ti.task_id] = {"state": str(ti.state.value if hasattr(ti.state, "value") else ti.state),
                                 "try_number": ti.try_number}
        query = XComModel.get_many(run_id=dag_run.run_id, dag_ids=dag.dag_id, key="return_value")
        for row in session.scalars(query):
            results[row.task_id] = XComModel.deserialize_value(row)
    export = results.get("export") or {}
    evaluation = results.get("evaluate") or {}
    metrics = export.get("metrics") or evaluation.get("metrics") or {}
    state = dag_run.state.value if hasattr(dag_run.state, "value") else str(dag_run.state)
    return {
        "dag_id": dag.dag_id,
        "run_id": dag_run.run_id,
        "state": state,
        "model_dir": _host_path(export.get("model_dir"), dag),
        "metrics": metrics,
        "blessed": evaluation.get("blessed"),
        "published": (results.get("publish") or {}).get("uri"),
        "tasks": tasks,
    }


def run(dag_id: str, conf: dict[str, Any] | None, dags_folder: str, rerun: str | None = None,
        tasks: list[str] | None = None, only_failed: bool = False) -> dict[str, Any]:
    """Run one DAG run of ``dag_id`` with ``conf`` (or re-run run ``rerun``) and return its summary.

    A re-run is the UI's Clear (:mod:`tfpipe.rerun`): the same run, its history kept, new try
    numbers for the cleared ``tasks`` (default all) and their downstream tasks.

    Airflow's logs (task logs included) go to stderr, so stdout carries only the summary line.
    """
    saved_stdout = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        dag = _load_dag(dag_id, dags_folder)
        ensure_pools(dag)
        if rerun:
            from tfpipe.rerun import clear_run, drive_run

            cleared = clear_run(dag_id, rerun, task_ids=tasks, only_failed=only_failed)
            print("tfpipe: cleared " + (", ".join(f"{t} (after try {n})" for t, n in cleared) or "nothing"),
                  file=sys.stderr)
            dag_run = drive_run(dag, rerun)
        else:
            dag_run = dag.test(run_conf=conf or None)
        return summarize(dag, dag_run)
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)


# --- seeing and reproducing a run: tfpipe tensorboard, tfpipe shell ------------------------------

@contextlib.contextmanager
def _quiet_stdout():
    """Send whatever Airflow prints while loading DAGs or reading the DB to stderr."""
    saved = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _note(message: str) -> None:
    print(f"tfpipe: {message}", file=sys.stderr, flush=True)


def _stage_tasks(dag: Any) -> list[Any]:
    from tfpipe.operators import TfpipeStageOperator

    return [t for t in dag.tasks if isinstance(t, TfpipeStageOperator)]


def _stage_task(dag: Any, task_id: str) -> Any:
    stages = _stage_tasks(dag)
    for task in stages:
        if task.task_id == task_id:
            return task
    names = ", ".join(t.task_id for t in stages) or "none"
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
        _note(f"cannot read runs of {dag_id} from the metadata DB ({type(err).__name__}: {err})")
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
                _note(f"run dir {newest} is not a run in the metadata DB: using its name as the run id")
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
    _note(f"run {run!r} of {dag_id} is not in the metadata DB: using the DAG's default params")
    return run, None


def _try_number(dag_run: Any, task_id: str) -> int:
    """The task's newest try in the run (1 when the DB does not know it)."""
    if dag_run is None:
        return 1
    try:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            ti = session.scalars(select(TaskInstance).where(
                TaskInstance.dag_id == dag_run.dag_id, TaskInstance.run_id == dag_run.run_id,
                TaskInstance.task_id == task_id)).first()
            return max(int(ti.try_number or 1), 1) if ti is not None else 1
    except Exception:  # noqa: BLE001 -- best effort: the try number only labels the shell
        return 1


def _run_params(dag: Any, task: Any, conf: dict[str, Any] | None) -> dict[str, Any]:
    """The params the task saw: DAG and task Params updated with the run's conf, as Airflow does."""
    try:
        from airflow.sdk.definitions.param import process_params

        return dict(process_params(dag, task, conf, suppress_exception=False))
    except ImportError:  # another Airflow: the same merge by hand
        params = {**dag.params.dump(), **(task.params.dump() if task.params else {})}
        return {**params, **(conf or {})}


def _recorded_image(host_run_dir: str, stage: str) -> str | None:
    """``run.image`` of the stage config the stage recorded in its run dir, if readable here."""
    try:
        recorded = json.loads((Path(host_run_dir) / "config" / f"{stage}.json").read_text())
        image = (recorded.get("run") or {}).get("image")
        return image if isinstance(image, str) and image else None
    except (OSError, ValueError):
        return None


def _task_image(task: Any) -> str:
    """The task's image: its own, else the Airflow Variable tfpipe_image (as the task reads it)."""
    from tfpipe.exceptions import ImageNotSetError
    from tfpipe.settings import resolve_image

    try:
        with _quiet_stdout():
            return resolve_image(task.image, task=task.task_id, allow_floating_tag=True)
    except ImageNotSetError as err:
        raise SystemExit(f"tfpipe: {err}") from err


def _image_present(image: str, docker: list[str]) -> bool:
    return subprocess.run([*docker, "image", "inspect", image], capture_output=True).returncode == 0


def _has_jupyter(image: str, docker: list[str]) -> bool:
    probe = [*docker, "run", "--rm", "--network", "none", "--entrypoint", "sh", image, "-c",
             "command -v jupyter >/dev/null 2>&1"]
    return subprocess.run(probe, capture_output=True).returncode == 0


JUPYTER_MISSING = (
    "tfpipe: --jupyter: the trainer image {image} has no Jupyter (no `jupyter` on its PATH). It is not "
    "installed at run time, which would make the shell differ from the task's container. To add it: "
    "pin `jupyterlab` and its dependencies in docker/requirements.lock (the image's Python packages; "
    "versions for its Python 3.8/3.9), then `make image` (rebuilds the deps image tfpipe/tf29-deps and "
    "gives the trainer image a new tag). Meanwhile use `tfpipe shell` without --jupyter."
)


def shell(args: argparse.Namespace) -> int:
    """``tfpipe shell``: a shell (or Jupyter) in a container set up as the task's."""
    from tfpipe import debug

    with _quiet_stdout():
        dag = _load_dag(args.dag_id, args.dags_folder)
        task = _stage_task(dag, args.task_id)
        run_id, dag_run = resolve_run(dag.dag_id, args.run, task.volumes.work)
        try_number = args.try_number or _try_number(dag_run, task.task_id)
        conf = dict(dag_run.conf or {}) if dag_run is not None else None
        params = _run_params(dag, task, conf)
    host_run_dir = debug.host_run_dir(task.volumes, dag.dag_id, run_id)
    image = _task_image(task)
    recorded = _recorded_image(host_run_dir, task.stage)
    if recorded and recorded != image:
        if _image_present(recorded, debug.docker_base(task.docker_url)):
            _note(f"the run's {task.stage} ran on {recorded}; the DAG now names {image}: using {recorded}")
            image = recorded
        else:
            _note(f"the run's {task.stage} ran on {recorded}, which the engine no longer has: using the DAG's "
                  f"{image} instead (the code may differ from the task's)")
    plan = debug.task_plan(task, dag_id=dag.dag_id, run_id=run_id, try_number=try_number, params=params,
                           image=image)
    _note(f"{dag.dag_id} / {run_id} / {task.task_id} try {try_number}"
          f"{' (conf ' + json.dumps(conf, sort_keys=True) + ')' if conf else ''}; run dir {host_run_dir}")
    if plan.left_out:
        _note("left out of the shell (private_environment, values not copied): " + ", ".join(plan.left_out))
    for line in plan.notes:
        _note(line)
    name = f"tfpipe-shell-{task.task_id}-{secrets.token_hex(3)}"
    use_gpus = not args.no_gpus
    if args.jupyter:
        docker = debug.docker_base(plan.docker_url)
        if not _has_jupyter(plan.image, docker):
            print(JUPYTER_MISSING.format(image=plan.image), file=sys.stderr)
            return 2
        token = secrets.token_urlsafe(24)
        cmd = debug.jupyter_args(plan, port=args.port, token=token, name=name, detach=args.detach,
                                 gpus=use_gpus)
        _note(f"Jupyter: {debug.jupyter_url(args.port, token)}")
    else:
        cmd = debug.shell_args(plan, dag_id=dag.dag_id, run_id=run_id, task_id=task.task_id, name=name,
                               tty=sys.stdin.isatty(), detach=args.detach, gpus=use_gpus)
    return _launch(cmd, args)


def tensorboard(args: argparse.Namespace) -> int:
    """``tfpipe tensorboard``: TensorBoard on the run's event files, from the trainer image."""
    from tfpipe import debug

    with _quiet_stdout():
        dag = _load_dag(args.dag_id, args.dags_folder)
        stages = _stage_tasks(dag)
        if not stages:
            raise SystemExit(f"tfpipe: {dag.dag_id} has no tfpipe stage tasks")
        task = next((t for t in stages if t.stage == "train"), stages[0])
        run_id, _ = resolve_run(dag.dag_id, args.run_id, task.volumes.work)
    event_dir = debug.host_tensorboard_dir(task.volumes, dag.dag_id, run_id)
    if Path(task.volumes.work).is_dir() and not Path(event_dir).is_dir():
        raise SystemExit(f"tfpipe: no TensorBoard event files for run {run_id!r} of {dag.dag_id}: {event_dir} "
                         "does not exist (has its train task run?)")
    cmd = debug.tensorboard_args(image=_task_image(task), event_dir=event_dir, dag_id=dag.dag_id, run_id=run_id,
                                 port=args.port, user=task.user, docker_url=task.docker_url,
                                 name=f"tfpipe-tensorboard-{args.port}", detach=args.detach)
    url = debug.tensorboard_url(dag.dag_id, run_id, base=f"http://localhost:{args.port}")
    if not args.print:
        _note(f"TensorBoard for {dag.dag_id} / {run_id} ({event_dir}) at {url}"
              + ("" if args.detach else "  (Ctrl-C stops it)"))
    return _launch(cmd, args, after=[url] if args.detach else None)


def _launch(cmd: list[str], args: argparse.Namespace, after: list[str] | None = None) -> int:
    """Print ``cmd`` (``--print``), start it detached and print the container id, or exec it."""
    from tfpipe.debug import printable

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


def _add_debug_parsers(sub: Any) -> None:
    dags_folder = os.environ.get("AIRFLOW__CORE__DAGS_FOLDER", str(Path("dags")))
    tb = sub.add_parser("tensorboard", help="serve a run's TensorBoard event files on localhost")
    tb.add_argument("dag_id")
    tb.add_argument("run_id", help="a run id, its run dir name, or 'latest' (the newest run dir)")
    tb.add_argument("--port", type=int, default=6006, help="port on 127.0.0.1 (default 6006)")
    sh = sub.add_parser("shell", help="a shell in a container set up as a task's, to reproduce it by hand")
    sh.add_argument("dag_id")
    sh.add_argument("task_id", help="a stage task: prep, train, evaluate or export")
    sh.add_argument("--run", default="latest", help="run id, run dir name, or 'latest' (default)")
    sh.add_argument("--try", dest="try_number", type=int, default=None,
                    help="the try whose stage config to use (default: the task's newest try)")
    sh.add_argument("--jupyter", action="store_true", help="start Jupyter instead of a shell (needs it in the image)")
    sh.add_argument("--port", type=int, default=8888, help="Jupyter's port on 127.0.0.1 (default 8888)")
    sh.add_argument("--no-gpus", action="store_true", help="do not request the task's GPUs")
    for p in (tb, sh):
        p.add_argument("--dags-folder", default=dags_folder)
        p.add_argument("--print", action="store_true", help="print the docker command instead of running it")
        p.add_argument("--detach", action="store_true",
                       help="start the container in the background and print its id"
                       + (" (the shell container runs `sleep infinity`)" if p is sh else ""))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tfpipe`` command."""
    parser = argparse.ArgumentParser(prog="tfpipe", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run one DAG run and print a JSON summary line")
    run_p.add_argument("dag_id")
    run_p.add_argument("--conf", default="{}", help="run parameters as a JSON object")
    run_p.add_argument("--dags-folder", default=os.environ.get("AIRFLOW__CORE__DAGS_FOLDER", str(Path("dags"))))
    run_p.add_argument("--rerun", metavar="RUN_ID",
                       help="clear an existing run as the UI's Clear does and run it again: same run, history "
                       "kept, new try numbers (training re-attaches to its container or resumes from checkpoints)")
    run_p.add_argument("--task", dest="tasks", action="append", metavar="TASK_ID",
                       help="with --rerun: clear only this task and its downstream tasks (repeatable)")
    run_p.add_argument("--only-failed", action="store_true", help="with --rerun: clear only failed tasks")
    _add_debug_parsers(sub)
    args = parser.parse_args(argv)
    if args.command == "tensorboard":
        return tensorboard(args)
    if args.command == "shell":
        return shell(args)
    try:
        conf = json.loads(args.conf or "{}")
    except json.JSONDecodeError as err:
        parser.error(f"--conf is not valid JSON ({err}); pass an object such as '{{\"epochs\": 5}}'")
    if not isinstance(conf, dict):
        parser.error("--conf must be a JSON object such as '{\"epochs\": 5}'")
    if (args.tasks or args.only_failed) and not args.rerun:
        parser.error("--task and --only-failed choose what --rerun RUN_ID clears; add --rerun")
    from airflow.providers.common.compat.sdk import ParamValidationError

    try:
        summary = run(args.dag_id, conf, args.dags_folder, rerun=args.rerun, tasks=args.tasks,
                      only_failed=args.only_failed)
    except ParamValidationError as err:  # rejected before a run starts, as the trigger form does
        print(f"tfpipe: {args.dag_id} rejected the run parameters: {err}. Fix: pass values its Params "
              "accept (the trigger form shows them).", file=sys.stderr)
        return 2
    print(json.dumps(summary, sort_keys=False, default=str), flush=True)
    return 0 if summary["state"] == "success" else 1


if __name__ == "__main__":
    sys.exit(main())
