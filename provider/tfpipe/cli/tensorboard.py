"""``tfpipe tensorboard DAG_ID RUN_ID|latest [--port 6006]``: TensorBoard from the trainer image on a run's event files."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from tfpipe.cli.common import launch, load_dag, note, on_its_engine, quiet_stdout, resolve_run, stage_tasks, task_image


def tensorboard(args: argparse.Namespace) -> int:
    """``tfpipe tensorboard``: TensorBoard on the run's event files, from the trainer image."""
    from tfpipe import links, reproduce

    with quiet_stdout():
        dag = load_dag(args.dag_id, args.dags_folder)
        stages = stage_tasks(dag)
        if not stages:
            raise SystemExit(f"tfpipe: {dag.dag_id} has no tfpipe stage tasks")
        task = on_its_engine(next((t for t in stages if t.stage == "train"), stages[0]))
        run_id, _ = resolve_run(dag.dag_id, args.run_id, task.volumes.work)
    event_dir = links.host_tensorboard_dir(task.volumes, dag.dag_id, run_id)
    if Path(task.volumes.work).is_dir() and not Path(event_dir).is_dir():
        raise SystemExit(f"tfpipe: no TensorBoard event files for run {run_id!r} of {dag.dag_id}: {event_dir} "
                         "does not exist (has its train task run?)")
    cmd = reproduce.tensorboard_args(image=task_image(task), event_dir=event_dir, dag_id=dag.dag_id, run_id=run_id,
                                 port=args.port, user=task.user, docker_url=task.docker_url,
                                 tls=reproduce.engine_tls(task),
                                 name=f"tfpipe-tensorboard-{args.port}", detach=args.detach)
    url = links.tensorboard_url(dag.dag_id, run_id, base=f"http://localhost:{args.port}")
    if not args.print:
        note(f"TensorBoard for {dag.dag_id} / {run_id} ({event_dir}) at {url}"
              + ("" if args.detach else "  (Ctrl-C stops it)"))
        where = reproduce.remote_port_note(task.docker_url, args.port)
        if where:
            note(where)
    return launch(cmd, args, after=[url] if args.detach else None)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``tensorboard`` sub-command."""
    tb = sub.add_parser("tensorboard", help="serve a run's TensorBoard event files on localhost")
    tb.add_argument("dag_id")
    tb.add_argument("run_id", help="a run id, its run dir name, or 'latest' (the newest run dir)")
    tb.add_argument("--port", type=int, default=6006, help="port on 127.0.0.1 (default 6006)")
    tb.set_defaults(handler=tensorboard)
    return tb
