"""Reproducing a run by hand (pure): the container a stage task starts, as ``docker run`` command lines."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from tfpipe import contract
from tfpipe.config import GpuRequest
from tfpipe.engine_settings import DEFAULT_DOCKER_URL
from tfpipe.links import tensorboard_run_name
from tfpipe.specs import MountSpec
from tfpipe.tries import TryIdentity, resolve_try

#: The port TensorBoard listens on inside its container.
TENSORBOARD_CONTAINER_PORT = 6006
#: Where the event files are mounted in the TensorBoard container (``<root>/<dag>/<run>``).
TENSORBOARD_LOGDIR = "/logs"
#: The port Jupyter would listen on inside the shell container.
JUPYTER_CONTAINER_PORT = 8888
#: ``tfpipe.role`` label values of the containers started here.
SHELL_ROLE = "shell"
TENSORBOARD_ROLE = "tensorboard"

#: The docker CLI's flag for each TLS file a task presents to its engine (docker-py's names).
TLS_FLAGS = {"tls_ca_cert": "--tlscacert", "tls_client_cert": "--tlscert", "tls_client_key": "--tlskey"}


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
    #: CPU limit (Docker's ``--cpus``), or ``None``
    cpus: float | None = None
    gpus: GpuRequest | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    name: str | None = None
    docker_url: str = DEFAULT_DOCKER_URL
    #: the TLS files the task presents to that engine (:func:`engine_tls`)
    tls: Mapping[str, str] = field(default_factory=dict)
    #: the resolved stage config (also in ``environment[TFPIPE_CONFIG]``)
    config: Mapping[str, Any] = field(default_factory=dict)
    #: names of the task's private environment variables, which are not in ``environment``
    left_out: tuple[str, ...] = ()
    #: notes for the user (templated values, env_file, ...)
    notes: tuple[str, ...] = ()


def task_plan(task: Any, *, dag_id: str, run_id: str, try_number: int, params: Mapping[str, Any] | None,
              map_index: int = -1, image: str | None = None,
              image_identity: Mapping[str, Any] | None = None, data_interval_end: Any = None) -> ContainerPlan:
    """The container a tfpipe stage task starts for one try, as its ``execute()`` builds it.

    ``params``: the run's params; ``image`` overrides the task's image; ``image_identity`` is what the
    task adds to the config's ``run`` section; ``data_interval_end``: the run's, where a date window ends
    (``data.window_days``). Private environment values are left out (named in ``left_out``).
    """
    from docker.utils import parse_bytes

    spec = task.spec
    image = image or spec.image
    identity = TryIdentity(dag_id, run_id, task.task_id, try_number, map_index, data_interval_end=data_interval_end)
    plan = resolve_try(spec, identity, params, image=image,
                       shard_index=getattr(task, "shard_index", None))
    private = dict(spec.private_environment)
    environment = {k: str(v) for k, v in (task.environment or {}).items()
                   if k not in private and k != "AIRFLOW_TMP_DIR"}
    if image_identity:
        plan.config["run"].update(image_identity)
    environment[contract.CONFIG_ENV] = contract.dumps(plan.config)
    notes = []
    templated = sorted(k for k, v in environment.items() if "{{" in str(v) or "{%" in str(v))
    if templated:
        notes.append(f"environment values not rendered (Jinja templates): {', '.join(templated)}")
    if getattr(task, "env_file", None):
        notes.append("the task's env_file is not reproduced (its values may be secret)")
    if getattr(task, "tls_hostname", None):
        notes.append(f"the docker CLI checks the engine's certificate against the host in {task.docker_url}, "
                     f"not tls_hostname {task.tls_hostname!r}: the certificate must name that host too")
    return ContainerPlan(
        image=image,
        command=tuple(spec.command),
        mounts=tuple(spec.mounts),
        user=spec.user,
        environment=environment,
        working_dir=getattr(task, "working_dir", None),
        network_mode=spec.network_mode,
        shm_size=parse_bytes(spec.shm_size) if spec.shm_size else None,
        mem_limit=spec.mem_limit,
        cpus=spec.cpus,
        gpus=plan.gpus,
        labels=dict(plan.labels),
        name=plan.name,
        docker_url=getattr(task, "docker_url", None) or DEFAULT_DOCKER_URL,
        tls=engine_tls(task),
        config=plan.config,
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


def engine_tls(task: Any) -> dict[str, str]:
    """The TLS files ``task`` presents to its engine (set by
    :meth:`tfpipe.engine_settings.EngineSettings.apply_to`, as before a try), by docker-py's names."""
    return {name: str(getattr(task, name)) for name in TLS_FLAGS if getattr(task, name, None)}


def docker_base(docker_url: str | None, tls: Mapping[str, str] | None = None) -> list[str]:
    """``docker`` plus ``-H URL`` when the task's engine is not the local default socket, and the
    TLS files of ``tls`` (:func:`engine_tls`), the engine's certificate verified as docker-py
    verifies it for the task."""
    args = ["docker"]
    if tls:
        args.append("--tlsverify")
        for name, flag in TLS_FLAGS.items():
            if tls.get(name):
                args += [flag, tls[name]]
    url = docker_url or DEFAULT_DOCKER_URL
    if url.startswith("unix://"):
        path = "/" + url[len("unix://"):].lstrip("/")
        if path in ("/var/run/docker.sock", "/run/docker.sock"):
            return args
        return [*args, "-H", "unix://" + path]
    return [*args, "-H", url]


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

    Everything is the plan's; ``network_mode`` overrides the network (a published port needs one).
    """
    args = [*docker_base(plan.docker_url, plan.tls), "run"]
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
    if plan.cpus is not None:
        args += ["--cpus", f"{plan.cpus:g}"]
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

    The token travels in ``JUPYTER_TOKEN``; a task without network gets a bridge for the port.
    """
    network = plan.network_mode if plan.network_mode not in (None, "none", "host") else "bridge"
    command = ("jupyter", "lab", "--ip=0.0.0.0", f"--port={JUPYTER_CONTAINER_PORT}", "--no-browser",
               f"--notebook-dir={plan.working_dir or '/tmp'}")
    return run_args(plan, command, role=SHELL_ROLE, name=name, detach=detach, interactive=not detach,
                    tty=not detach, publish=[f"127.0.0.1:{port}:{JUPYTER_CONTAINER_PORT}"],
                    extra_env={"JUPYTER_TOKEN": token}, network_mode=network, gpus=gpus)


def remote_port_note(docker_url: str | None, port: int) -> str | None:
    """Where a port published on ``127.0.0.1`` is reachable when the engine is another host's
    (``tcp://`` to a host that is not this one's loopback): on that host's loopback, so from here
    through an SSH tunnel. None for an engine on this machine."""
    import ipaddress
    from urllib.parse import urlsplit

    url = docker_url or DEFAULT_DOCKER_URL
    if not url.startswith("tcp://"):
        return None
    host = urlsplit(url).hostname or ""
    try:
        if host == "localhost" or ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:  # a host name
        pass
    return (f"port {port} is published on the loopback of the engine's host {host}, not on this machine: "
            f"reach it with `ssh -N -L {port}:127.0.0.1:{port} {host}`")


def jupyter_url(port: int, token: str) -> str:
    return f"http://127.0.0.1:{port}/lab?token={quote(token, safe='')}"


def tensorboard_args(*, image: str, event_dir: str, dag_id: str, run_id: str, port: int,
                     user: str | None = None, docker_url: str | None = None,
                     tls: Mapping[str, str] | None = None, name: str | None = None,
                     detach: bool = False) -> list[str]:
    """``docker run`` of TensorBoard on the run's event files, published on ``127.0.0.1:port``.

    The event dir is mounted at ``/logs/<dag>/<run>``, so TensorBoard names the run as
    :func:`tensorboard_run_name`.
    """
    target = f"{TENSORBOARD_LOGDIR}/{tensorboard_run_name(dag_id, run_id)}"
    # not the tfpipe.dag_id/run_id labels of stage containers: a TensorBoard is no part of the run
    plan = ContainerPlan(image=image, command=(), mounts=(MountSpec(event_dir, target, True),), user=user,
                         environment={}, working_dir=None, network_mode=None,
                         labels={"tfpipe.tensorboard": f"{dag_id}/{run_id}"},
                         docker_url=docker_url or DEFAULT_DOCKER_URL, tls=tls or {})
    command = ("tensorboard", "--logdir", TENSORBOARD_LOGDIR, "--host", "0.0.0.0", "--port", str(TENSORBOARD_CONTAINER_PORT))
    return run_args(plan, command, role=TENSORBOARD_ROLE, name=name, interactive=not detach, detach=detach,
                    publish=[f"127.0.0.1:{port}:{TENSORBOARD_CONTAINER_PORT}"])


def printable(args: Sequence[str]) -> str:
    """A command line to paste into a POSIX shell."""
    return shlex.join(list(args))
