"""Seeing and reproducing a run: operator extra links, TensorBoard and a debug shell.

* :class:`RunReportLink` and :class:`TensorBoardLink` are the "Run report" and "TensorBoard"
  buttons of the train, evaluate and export tasks in the Airflow UI. Airflow 3 computes an extra
  link **on the worker**, when the task ends (success or failure), by calling ``get_link`` and
  storing the URL in XCom under the link's ``xcom_key``; the UI then reads that XCom.
* :func:`task_plan` says what container a stage task starts for a given run and try (image,
  mounts, user, environment, working dir, network, ...), from the same builders as
  :meth:`tfpipe.operators.TfpipeStageOperator.execute`. :func:`shell_args` and
  :func:`tensorboard_args` turn a plan into a ``docker run`` command line (``tfpipe shell`` and
  ``tfpipe tensorboard`` in :mod:`tfpipe.cli` run them).

Every function here is pure: no engine, no metadata DB. The links point at the tfpipe plugin
under the api-server (:mod:`tfpipe.plugins`), which reads the run's files through the engine;
the ``tfpipe tensorboard`` URL is meant for a browser on the engine's host.
"""

from __future__ import annotations

import os
import posixpath
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from airflow.providers.common.compat.sdk import BaseOperatorLink

from tfpipe import contract
from tfpipe.specs import GpuRequest, MountSpec, container_labels, container_name, resolve_stage_config

#: Environment variable with the base URL of the TensorBoard the "TensorBoard" link points to.
TENSORBOARD_URL_ENV = "TFPIPE_TENSORBOARD_URL"
DEFAULT_TENSORBOARD_URL = "http://localhost:6006"
#: The port TensorBoard listens on inside its container.
TENSORBOARD_CONTAINER_PORT = 6006
#: Where the event files are mounted in the TensorBoard container (``<root>/<dag>/<run>``).
TENSORBOARD_LOGDIR = "/logs"
#: The port Jupyter would listen on inside the shell container.
JUPYTER_CONTAINER_PORT = 8888
#: Run dir sub-path of the TensorBoard event files (``trainer.train``).
TENSORBOARD_SUBDIR = "train/tensorboard"
#: ``tfpipe.role`` label values of the containers started here.
SHELL_ROLE = "shell"
TENSORBOARD_ROLE = "tensorboard"
DEFAULT_DOCKER_URL = "unix://var/run/docker.sock"


# --- paths and URLs ----------------------------------------------------------------------------

def _volume_map(volumes: Any) -> tuple[tuple[str, str], ...]:
    return ((contract.CONTAINER_DATA, volumes.data), (contract.CONTAINER_WORK, volumes.work),
            (contract.CONTAINER_MODELS, volumes.models))


def host_path(container_path: str | None, volumes: Any) -> str | None:
    """Map a container path under ``/data``, ``/work`` or ``/models`` to the engine host's path.

    Returns ``None`` for ``None`` or a path outside the three mounts.
    """
    if not container_path:
        return None
    path = posixpath.normpath(container_path)
    for target, source in _volume_map(volumes):
        if path == target:
            return source
        if path.startswith(target + "/"):
            return source.rstrip("/") + path[len(target):]
    return None


def host_run_dir(volumes: Any, dag_id: str, run_id: str) -> str:
    """The run directory (``contract.run_dir``) as a path on the engine's host."""
    path = host_path(contract.run_dir(dag_id, run_id), volumes)
    assert path is not None  # run_dir is always under /work
    return path


def host_tensorboard_dir(volumes: Any, dag_id: str, run_id: str) -> str:
    """The run's TensorBoard event files on the engine's host."""
    return f"{host_run_dir(volumes, dag_id, run_id)}/{TENSORBOARD_SUBDIR}"


def tensorboard_run_name(dag_id: str, run_id: str) -> str:
    """The run's name in TensorBoard: ``<dag>/<run>`` as in ``work/runs/<dag>/<run>``.

    ``tfpipe tensorboard`` mounts the event files at ``/logs/<dag>/<run>``, so TensorBoard names
    the run exactly this; a TensorBoard serving the whole ``work/runs`` tree names it
    ``<dag>/<run>/train/tensorboard``, which the same filter matches.
    """
    return f"{contract.safe_name(dag_id)}/{contract.safe_name(run_id, 120)}"


def tensorboard_url(dag_id: str, run_id: str, base: str | None = None) -> str:
    """The TensorBoard URL with the run selected (TensorBoard 2.9's ``?runFilter=<regex>``).

    ``base`` defaults to ``$TFPIPE_TENSORBOARD_URL``, else ``http://localhost:6006``. Safe names
    hold only ``[A-Za-z0-9._-]``, so escaping ``.`` makes the filter match the name literally.
    """
    base = (base or os.environ.get(TENSORBOARD_URL_ENV) or DEFAULT_TENSORBOARD_URL).rstrip("/")
    regex = tensorboard_run_name(dag_id, run_id).replace(".", r"\.")
    return f"{base}/?runFilter={quote(regex, safe='')}#timeseries"


# --- operator extra links ----------------------------------------------------------------------

class RunReportLink(BaseOperatorLink):
    """"Run report": the run's ``report.html``, served by the tfpipe plugin under the api-server.

    ``[api] base_url`` + ``/tfpipe/runs/<dag>/<run>/report/`` (root-relative when ``base_url`` is
    unset). The plugin reads the report through the Docker engine and lets only users who may
    read the DAG see it (:mod:`tfpipe.plugins.app`).
    """

    name = "Run report"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from tfpipe.plugins.paths import report_url as plugin_report_url

        return plugin_report_url(ti_key.dag_id, ti_key.run_id)


class TensorBoardLink(BaseOperatorLink):
    """"TensorBoard": the run's TensorBoard, started on demand by the tfpipe plugin.

    ``[api] base_url`` + ``/tfpipe/runs/<dag>/<run>/tensorboard/``. On a workstation,
    ``tfpipe tensorboard DAG RUN_ID`` (``make tensorboard RUN=...``) serves it without Airflow.
    """

    name = "TensorBoard"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        from tfpipe.plugins.paths import tensorboard_url as plugin_tensorboard_url

        return plugin_tensorboard_url(ti_key.dag_id, ti_key.run_id)


# --- what a task's container is ----------------------------------------------------------------

@dataclass(frozen=True)
class ContainerPlan:
    """One container as ``docker run`` would start it (environment without private values)."""

    image: str
    command: tuple[str, ...]
    mounts: tuple[MountSpec, ...]
    user: str | None
    environment: Mapping[str, str]
    working_dir: str | None
    network_mode: str | None
    shm_size: int | str | None = None
    mem_limit: int | str | None = None
    gpus: GpuRequest | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    docker_url: str = DEFAULT_DOCKER_URL
    #: the resolved stage config (also in ``environment[TFPIPE_CONFIG]``)
    config: Mapping[str, Any] = field(default_factory=dict)
    #: names of the task's private environment variables, which are not in ``environment``
    left_out: tuple[str, ...] = ()
    #: notes for the user (templated values, env_file, ...)
    notes: tuple[str, ...] = ()


def task_plan(task: Any, *, dag_id: str, run_id: str, try_number: int, params: Mapping[str, Any] | None,
              map_index: int = -1, image: str | None = None) -> ContainerPlan:
    """The container a tfpipe stage task starts for one try, as its ``execute()`` builds it.

    ``params`` are the run's params (the DAG's defaults updated with ``dag_run.conf``, as Airflow
    hands them to the task); ``image`` overrides the task's image (e.g. the image recorded in the
    run's ``config/<stage>.json`` when the DAG file now names another one). Private environment
    values are left out (their names are in ``left_out``).
    """
    params = dict(params or {})
    image = image or task.image
    config = resolve_stage_config(
        {**task.stage_config, "stage": task.stage},
        dag_id=dag_id, run_id=run_id, task_id=task.task_id, try_number=try_number, image=image,
        overrides=params,
    )
    gpus = task.gpu_request
    if task.gpu_stage and params.get("gpus") not in (None, ""):
        gpus = GpuRequest.parse(params["gpus"], field_name="params.gpus")
    private = dict(getattr(task, "_private_environment", None) or {})
    environment = {k: str(v) for k, v in (task.environment or {}).items()
                   if k not in private and k != "AIRFLOW_TMP_DIR"}
    environment[contract.CONFIG_ENV] = contract.dumps(config)
    notes = []
    templated = sorted(k for k, v in environment.items() if "{{" in str(v) or "{%" in str(v))
    if templated:
        notes.append(f"environment values not rendered (Jinja templates): {', '.join(templated)}")
    if getattr(task, "env_file", None):
        notes.append("the task's env_file is not reproduced (its values may be secret)")
    return ContainerPlan(
        image=image,
        command=tuple(task.command) if not isinstance(task.command, str) else tuple(shlex.split(task.command)),
        mounts=tuple(task.mount_specs),
        user=task.user,
        environment=environment,
        working_dir=getattr(task, "working_dir", None),
        network_mode=task.network_mode,
        shm_size=task.shm_size,
        mem_limit=task.mem_limit,
        gpus=gpus,
        labels=container_labels(dag_id=dag_id, run_id=run_id, task_id=task.task_id, try_number=try_number,
                                stage=task.stage, map_index=map_index),
        name=container_name(dag_id, run_id, task.task_id, map_index),
        docker_url=getattr(task, "docker_url", None) or DEFAULT_DOCKER_URL,
        config=config,
        left_out=tuple(sorted(private)),
        notes=tuple(notes),
    )


# --- docker run command lines ------------------------------------------------------------------

def _csv_field(value: str) -> str:
    """One field of a ``--mount`` value (CSV): quoted when it holds a comma or a quote."""
    if "," in value or '"' in value:
        return '"' + value.replace('"', '""') + '"'
    return value


def mount_arg(mount: MountSpec) -> str:
    """``--mount`` value of a bind mount, keeping the read-only flag."""
    parts = ["type=bind", _csv_field(f"src={mount.source}"), _csv_field(f"dst={mount.target}")]
    if mount.read_only:
        parts.append("readonly")
    return ",".join(parts)


def gpus_arg(gpus: GpuRequest) -> str:
    """``--gpus`` value: ``all``, a count, or ``"device=0,1"`` (quoted: the CLI parses it as CSV)."""
    if gpus.device_ids:
        return '"device=' + ",".join(gpus.device_ids) + '"'
    return "all" if gpus.count == -1 else str(gpus.count)


def docker_base(docker_url: str | None) -> list[str]:
    """``docker`` plus ``-H URL`` when the task's engine is not the local default socket."""
    url = docker_url or DEFAULT_DOCKER_URL
    if url.startswith("unix://"):
        path = "/" + url[len("unix://"):].lstrip("/")
        if path in ("/var/run/docker.sock", "/run/docker.sock"):
            return ["docker"]
        return ["docker", "-H", "unix://" + path]
    return ["docker", "-H", url]


def shell_command(plan: ContainerPlan, *, dag_id: str, run_id: str, task_id: str) -> tuple[str, ...]:
    """An interactive shell (``bash`` if the image has it, else ``sh``) after a short banner."""
    stage = plan.config.get("stage", "")
    try_number = (plan.config.get("run") or {}).get("try_number", "?")
    run_dir = (plan.config.get("paths") or {}).get("run_dir", "")
    banner = (
        f"tfpipe shell: {dag_id} / {run_id} / {task_id} (try {try_number}), image {plan.image}\n"
        f"  rerun the stage:  python3 -m trainer {stage}\n"
        f"  stage config:     echo \"$TFPIPE_CONFIG\" | python3 -m json.tool\n"
        f"  run dir:          {run_dir}\n"
        "  mounts: /data (read-only), /work, /models: what you write there is the run's."
    )
    script = ('printf "%s\\n" "$1"; '
              'if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi')
    return ("sh", "-c", script, "tfpipe-shell", banner)


def run_args(plan: ContainerPlan, command: Sequence[str], *, role: str, name: str | None = None,
             tty: bool = False, interactive: bool = False, detach: bool = False, remove: bool = True,
             publish: Iterable[str] = (), extra_env: Mapping[str, str] | None = None,
             network_mode: str | None = None, gpus: bool = True) -> list[str]:
    """``docker run`` arguments for ``plan`` with ``command``, labelled ``tfpipe.role=<role>``.

    Image, mounts (same read-only flags), user, environment, working dir, network mode, shm and
    memory limits and GPUs are the plan's; ``network_mode`` overrides the network (a published
    port needs one).
    """
    args = [*docker_base(plan.docker_url), "run"]
    if remove:
        args.append("--rm")
    if detach:
        args.append("--detach")
    if interactive:
        args.append("--interactive")
    if tty:
        args.append("--tty")
    if name:
        args += ["--name", name]
    for key, value in sorted({**plan.labels, "tfpipe.role": role}.items()):
        args += ["--label", f"{key}={value}"]
    if plan.user:
        args += ["--user", plan.user]
    network = network_mode or plan.network_mode
    if network:
        args += ["--network", network]
    if plan.working_dir:
        args += ["--workdir", plan.working_dir]
    if plan.shm_size:
        args += ["--shm-size", str(plan.shm_size)]
    if plan.mem_limit:
        args += ["--memory", str(plan.mem_limit)]
    if gpus and plan.gpus:
        args += ["--gpus", gpus_arg(plan.gpus)]
    for mount in plan.mounts:
        args += ["--mount", mount_arg(mount)]
    for port in publish:
        args += ["--publish", port]
    for key, value in sorted({**plan.environment, **(extra_env or {})}.items()):
        args += ["--env", f"{key}={value}"]
    args.append(plan.image)
    args += list(command)
    return args


def shell_args(plan: ContainerPlan, *, dag_id: str, run_id: str, task_id: str, name: str | None = None,
               tty: bool = True, detach: bool = False, gpus: bool = True) -> list[str]:
    """``docker run`` of a debug shell in the task's container setup (``--detach``: ``sleep infinity``)."""
    command = ("sleep", "infinity") if detach else shell_command(plan, dag_id=dag_id, run_id=run_id,
                                                                  task_id=task_id)
    return run_args(plan, command, role=SHELL_ROLE, name=name, tty=tty and not detach,
                    interactive=not detach, detach=detach, gpus=gpus)


def jupyter_args(plan: ContainerPlan, *, port: int, token: str, name: str | None = None,
                 detach: bool = False, gpus: bool = True) -> list[str]:
    """``docker run`` of Jupyter in the task's container setup, published on ``127.0.0.1:port``.

    Jupyter listens on all interfaces *inside* the container (so the published port reaches it)
    and is published on the host's loopback only; the token travels in ``JUPYTER_TOKEN``. Needs a
    network (the port is published on a bridge even when the task runs with ``network_mode='none'``).
    """
    network = plan.network_mode if plan.network_mode not in (None, "none", "host") else "bridge"
    command = ("jupyter", "lab", "--ip=0.0.0.0", f"--port={JUPYTER_CONTAINER_PORT}", "--no-browser",
               f"--notebook-dir={plan.working_dir or '/tmp'}")
    return run_args(plan, command, role=SHELL_ROLE, name=name, detach=detach, interactive=not detach,
                    tty=not detach, publish=[f"127.0.0.1:{port}:{JUPYTER_CONTAINER_PORT}"],
                    extra_env={"JUPYTER_TOKEN": token}, network_mode=network, gpus=gpus)


def jupyter_url(port: int, token: str) -> str:
    return f"http://127.0.0.1:{port}/lab?token={quote(token, safe='')}"


def tensorboard_args(*, image: str, event_dir: str, dag_id: str, run_id: str, port: int,
                     user: str | None = None, docker_url: str | None = None, name: str | None = None,
                     detach: bool = False) -> list[str]:
    """``docker run`` of TensorBoard on the run's event files, published on ``127.0.0.1:port``.

    The event dir is mounted read-only at ``/logs/<dag>/<run>`` so TensorBoard names the run as
    :func:`tensorboard_run_name` (the filter of :func:`tensorboard_url` selects it).
    """
    target = f"{TENSORBOARD_LOGDIR}/{tensorboard_run_name(dag_id, run_id)}"
    # not the tfpipe.dag_id/run_id labels of stage containers: a TensorBoard is no part of the run
    labels = {"tfpipe.role": TENSORBOARD_ROLE, "tfpipe.tensorboard": f"{dag_id}/{run_id}"}
    args = [*docker_base(docker_url), "run", "--rm"]
    args.append("--detach" if detach else "--interactive")
    if name:
        args += ["--name", name]
    for key, value in sorted(labels.items()):
        args += ["--label", f"{key}={value}"]
    if user:
        args += ["--user", user]
    args += ["--publish", f"127.0.0.1:{port}:{TENSORBOARD_CONTAINER_PORT}",
             "--mount", mount_arg(MountSpec(event_dir, target, True)),
             image, "tensorboard", "--logdir", TENSORBOARD_LOGDIR, "--host", "0.0.0.0",
             "--port", str(TENSORBOARD_CONTAINER_PORT)]
    return args


def printable(args: Sequence[str]) -> str:
    """A command line to paste into a POSIX shell."""
    return shlex.join(list(args))
