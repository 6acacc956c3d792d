"""``tfpipe shell DAG_ID TASK_ID [--run RUN_ID|latest] [--map-index N]``: a shell in a container set up as a task's.

``python3 -m trainer <stage>`` inside reruns the stage; private environment values are left out.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

from tfpipe import contract
from tfpipe.cli.common import (
    task_image,
    launch,
    load_dag,
    note,
    on_its_engine,
    quiet_stdout,
    resolve_run,
    run_params,
    stage_task,
    try_number_of,
)


def _recorded_image(host_run_dir: str, stage: str) -> str | None:
    """``run.image`` of the stage config the stage recorded in its run dir, if readable here."""
    try:
        recorded = json.loads(Path(contract.stage_config_path(host_run_dir, stage)).read_text())
        image = (recorded.get("run") or {}).get("image")
        return image if isinstance(image, str) and image else None
    except (OSError, ValueError):
        return None


def _image_identity(image: str, docker: list[str]) -> dict[str, Any] | None:
    """The image ID and repo digest the task's config carries (as the operator reads them); None when
    the engine has no such image."""
    from tfpipe.tries import image_identity

    proc = subprocess.run([*docker, "image", "inspect", image], capture_output=True, text=True)
    return image_identity(image, json.loads(proc.stdout)[0]) if proc.returncode == 0 else None


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
    from tfpipe import links, reproduce

    with quiet_stdout():
        dag = load_dag(args.dag_id, args.dags_folder)
        task = on_its_engine(stage_task(dag, args.task_id, args.map_index))
        map_index = -1 if args.map_index is None else args.map_index
        run_id, dag_run = resolve_run(dag.dag_id, args.run, task.volumes.work)
        try_number = args.try_number or try_number_of(dag_run, task.task_id, map_index)
        conf = dict(dag_run.conf or {}) if dag_run is not None else None
        params = run_params(dag, task, conf)
    host_run_dir = links.host_run_dir(task.volumes, dag.dag_id, run_id)
    image = task_image(task)
    docker = reproduce.docker_base(task.docker_url, reproduce.engine_tls(task))
    recorded = _recorded_image(host_run_dir, task.stage)
    if recorded and recorded != image:
        if _image_identity(recorded, docker) is not None:
            note(f"the run's {task.stage} ran on {recorded}; the DAG now names {image}: using {recorded}")
            image = recorded
        else:
            note(f"the run's {task.stage} ran on {recorded}, which the engine no longer has: using the DAG's "
                  f"{image} instead (the code may differ from the task's)")
    plan = reproduce.task_plan(task, dag_id=dag.dag_id, run_id=run_id, try_number=try_number, params=params,
                           map_index=map_index, image=image,
                           image_identity=_image_identity(image, docker),
                           data_interval_end=getattr(dag_run, "data_interval_end", None) or getattr(dag_run, "run_after", None))
    instance = f"[{map_index}]" if map_index >= 0 else ""
    note(f"{dag.dag_id} / {run_id} / {task.task_id}{instance} try {try_number}"
          f"{' (conf ' + json.dumps(conf, sort_keys=True) + ')' if conf else ''}; run dir {host_run_dir}")
    if plan.left_out:
        note("left out of the shell (private_environment, values not copied): " + ", ".join(plan.left_out))
    for line in plan.notes:
        note(line)
    name = f"tfpipe-shell-{task.task_id}-{secrets.token_hex(3)}"
    use_gpus = not args.no_gpus
    if args.jupyter:
        if not _has_jupyter(plan.image, docker):
            print(JUPYTER_MISSING.format(image=plan.image), file=sys.stderr)
            return 2
        token = secrets.token_urlsafe(24)
        cmd = reproduce.jupyter_args(plan, port=args.port, token=token, name=name, detach=args.detach,
                                 gpus=use_gpus)
        note(f"Jupyter: {reproduce.jupyter_url(args.port, token)}")
        where = reproduce.remote_port_note(plan.docker_url, args.port)
        if where:
            note(where)
    else:
        cmd = reproduce.shell_args(plan, dag_id=dag.dag_id, run_id=run_id, task_id=task.task_id, name=name,
                               tty=sys.stdin.isatty(), detach=args.detach, gpus=use_gpus)
    return launch(cmd, args)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``shell`` sub-command."""
    sh = sub.add_parser("shell", help="a shell in a container set up as a task's, to reproduce it by hand")
    sh.add_argument("dag_id")
    sh.add_argument("task_id", help="a stage task: prep, train, evaluate or export (prep_shard, prep_merge when sharded)")
    sh.add_argument("--map-index", type=int, default=None,
                    help="which instance of a mapped task (prep_shard: the shard's index)")
    sh.add_argument("--run", default="latest", help="run id, run dir name, or 'latest' (default)")
    sh.add_argument("--try", dest="try_number", type=int, default=None,
                    help="the try whose stage config to use (default: the task's newest try)")
    sh.add_argument("--jupyter", action="store_true", help="start Jupyter instead of a shell (needs it in the image)")
    sh.add_argument("--port", type=int, default=8888, help="Jupyter's port on 127.0.0.1 (default 8888)")
    sh.add_argument("--no-gpus", action="store_true", help="do not request the task's GPUs")
    sh.set_defaults(handler=shell)
    return sh
