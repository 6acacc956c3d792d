"""The Docker backend: one thin ``DockerOperator`` subclass per pipeline stage, built from a
:class:`~tfpipe.specs.StageSpec`.

Construction only stores the spec and hands Docker's arguments to ``DockerOperator`` (no I/O:
DAG files parse fast and offline). ``execute()`` then, against the Docker engine at ``docker_url``:

1. resolves this try (:func:`tfpipe.specs.resolve_try`: config with the run's overrides and
   identity, GPUs, container name and labels);
2. has the engine's :class:`~tfpipe.hooks.docker.TfpipeDockerHook` check the engine, remove any
   leftover container of an earlier try of the same task (a worker killed with SIGKILL never ran
   ``on_kill``: two containers must never write one checkpoint directory) and prepare the
   directories the stage writes, from a short root container (the worker may not see the
   engine's disks);
3. runs the stage container (deterministic name, ``tfpipe.*`` labels, non-root user, GPUs);
4. maps the exit code through the contract (:mod:`tfpipe.operators.exits`) and returns the
   stage's JSON result through XCom.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any, ClassVar

from airflow.providers.common.compat.sdk import AirflowFailException
from airflow.providers.docker.exceptions import DockerContainerFailedException
from airflow.providers.docker.operators.docker import DockerOperator

from tfpipe import contract
from tfpipe.config import GpuRequest
from tfpipe.exceptions import GpuUnavailableError, StageFailedError, TfpipeConfigError
from tfpipe.hooks.docker import TfpipeDockerHook
from tfpipe.lineage import capture
from tfpipe.links import RunReportLink, TensorBoardLink
from tfpipe.metrics import emit_stage_metrics
from tfpipe.operators.exits import raise_for_exit
from tfpipe.plugins.paths import LOCATION_XCOM_KEY, location_record
from tfpipe.run_params import reject_unknown_conf
from tfpipe.specs import (
    MountSpec,
    StageSpec,
    TryPlan,
    image_identity,
    prepare_dirs_command,
    resolve_try,
    stage_spec,
)

_NO_GPU_DRIVER = "could not select device driver"
_NO_BIND_SOURCE = "bind source path does not exist"
#: ``tfpipe.role`` of the short container that prepares a stage's directories.
PREPARE_ROLE = "prepare-volumes"
#: Upstream stages whose results a stage's OpenLineage event names (dataset dir, model, blessing).
_LINEAGE_STAGES = ("prep", "train", "evaluate")


def docker_mount(mount: MountSpec) -> Any:
    """The docker-py bind ``Mount`` of a spec's mount."""
    from docker.types import Mount

    return Mount(target=mount.target, source=mount.source, type="bind", read_only=mount.read_only)


def device_requests(gpus: GpuRequest | None) -> list | None:
    """The docker-py ``DeviceRequest`` list of a GPU request (engine API >= 1.40)."""
    return gpus.to_docker() if gpus else None


class _RedactingLog:
    """A logger that writes ``***`` in place of each secret value before anything is logged.

    Airflow masks ``mask_secret`` values only on some log paths (a deployment's supervisor masks
    them in the task log file; ``dag.test`` prints task logs unmasked), so the stage operator
    redacts its secrets itself, once, for every path: container output, errors, its own lines.
    """

    def __init__(self, log: Any, secrets: list[str]) -> None:
        self._log = log
        self._secrets = sorted(set(secrets), key=len, reverse=True)  # longest first: no partial leftovers

    def redact(self, text: str) -> str:
        """``text`` with every secret value replaced by ``***``."""
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _emit(self, level: str, msg: Any, *args: Any, **kwargs: Any) -> None:
        text = str(msg) % args if args else str(msg)
        getattr(self._log, level)("%s", self.redact(text), **kwargs)

    def debug(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self._emit("debug", msg, *args, **kwargs)

    def info(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self._emit("info", msg, *args, **kwargs)

    def warning(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self._emit("warning", msg, *args, **kwargs)

    def error(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self._emit("error", msg, *args, **kwargs)

    def exception(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self._emit("exception", msg, *args, **kwargs)

    def critical(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self._emit("critical", msg, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


class TfpipeStageOperator(DockerOperator):
    """Run one tfpipe stage (``python3 -m trainer <stage>``) in the trainer image.

    Built from a :class:`~tfpipe.specs.StageSpec` (:func:`tfpipe.dag_factory.training_pipeline`
    passes ``spec``); used on its own, it builds the spec from the arguments below with
    :func:`tfpipe.specs.stage_spec`, validated as a pipeline config is.

    :param spec: the stage's spec; when given, the spec arguments below must be left out.
    :param docker_url: the Docker engine, local or remote.
    :param prepare_volumes: create and chown the directories the stage writes before it runs.
    :param image: the trainer image, pinned by version tag or digest.
    :param stage_config: the stage config template (see :func:`tfpipe.specs.config_template`);
        run identity and container paths are added for each try.
    :param volumes: host directories on the Docker engine's host: ``data`` (read-only),
        ``work`` and ``models`` (read-write). A :class:`~tfpipe.config.VolumesConfig` or mapping.
    :param gpus: ``None``, ``"all"``, a count, or a list of device ids (Docker ``DeviceRequest``s).
        Not templated: the templater would flatten the request objects. A ``gpus`` Param of
        the run overrides it.
    :param gpu_fallback: ``"fail"`` (default) or ``"cpu"``: what to do when GPUs are requested
        but the engine has no NVIDIA runtime.
    :param gpu_stage: whether a run's ``gpus`` Param applies to this task (default: train and
        evaluate); prep and export read and write files and need no GPU.
    :param allow_floating_tag: accept an unpinned image such as ``:latest``.
    :param user: ``uid:gid`` the stage runs as; non-root so files on mounts belong to the user.
    :param shm_size: ``/dev/shm`` size, e.g. ``"1g"`` (tf.data needs more than Docker's 64 MB).
    :param mem_limit: memory limit, e.g. ``"8g"``; an out-of-memory kill is reported as such.
    :param network_mode: Docker network; ``"none"`` cuts the stage off the network.
    :param environment: extra environment variables (templated).
    :param private_environment: secrets for the container; never rendered or logged.
    :param kwargs: passed to ``BaseOperator`` (``task_id``, ``retries``, ``pool``, ...).
    """

    stage: ClassVar[str] = ""
    template_fields = tuple(f for f in DockerOperator.template_fields if f not in ("container_name", "mounts"))
    ui_color = "#fbe9d0"

    def __init__(
        self,
        *,
        spec: StageSpec | None = None,
        docker_url: str = "unix://var/run/docker.sock",
        prepare_volumes: bool = True,
        image: str | None = None,
        stage_config: Any = None,
        volumes: Any = None,
        gpus: Any = None,
        gpu_fallback: str = "fail",
        gpu_stage: bool | None = None,
        allow_floating_tag: bool = False,
        user: str = "1000:1000",
        shm_size: str | None = "1g",
        mem_limit: str | None = None,
        network_mode: str = "bridge",
        environment: dict[str, str] | None = None,
        private_environment: dict[str, str] | None = None,
        cpus: float | None = None,
        timezone: str = "UTC",
        jemalloc: bool = True,
        **kwargs: Any,
    ) -> None:
        if not self.stage:
            raise TypeError("use one of PrepOperator, TrainOperator, EvaluateOperator, ExportOperator")
        if spec is None:
            spec = stage_spec(
                self.stage, task_id=kwargs.get("task_id", self.stage), image=image or "", stage_config=stage_config,
                volumes=volumes, gpus=gpus, gpu_fallback=gpu_fallback, gpu_param=gpu_stage,
                allow_floating_tag=allow_floating_tag, user=user, shm_size=shm_size, mem_limit=mem_limit,
                network_mode=network_mode, environment=environment, private_environment=private_environment,
                cpus=cpus, timezone=timezone, jemalloc=jemalloc)
        elif spec.stage != self.stage:
            raise TfpipeConfigError(f"spec: a {spec.stage!r} spec cannot make a {self.stage!r} operator. "
                                    f"Fix: use the operator of stage {spec.stage!r}.")
        from docker.utils import parse_bytes

        self.spec = spec
        self.volumes = spec.volumes
        self.prepare_volumes = prepare_volumes
        self.nano_cpus = None if spec.cpus is None else int(round(spec.cpus * 1e9))
        super().__init__(
            image=spec.image,
            command=list(spec.command),
            docker_url=docker_url,
            api_version="auto",
            mounts=[docker_mount(m) for m in spec.mounts],
            mount_tmp_dir=False,
            auto_remove="never",  # removed by execute() after the exit state was read
            user=spec.user,
            shm_size=parse_bytes(spec.shm_size) if spec.shm_size else None,
            mem_limit=spec.mem_limit,
            network_mode=spec.network_mode,
            environment=dict(spec.environment),
            private_environment=dict(spec.private_environment) or None,
            privileged=False,
            tty=False,
            xcom_all=True,
            do_xcom_push=True,
            **kwargs,
        )

    @cached_property
    def hook(self) -> TfpipeDockerHook:
        """The engine's hook: Airflow's ``DockerHook`` with tfpipe's housekeeping."""
        tls_config = TfpipeDockerHook.construct_tls_config(
            ca_cert=self.tls_ca_cert, client_cert=self.tls_client_cert, client_key=self.tls_client_key,
            verify=self.tls_verify, assert_hostname=self.tls_hostname, ssl_version=self.tls_ssl_version,
        )
        return TfpipeDockerHook(docker_url=self.docker_url, docker_conn_id=self.docker_conn_id,
                                version=self.api_version, tls=tls_config, timeout=self.timeout)

    @property
    def log(self) -> Any:  # type: ignore[override]
        """The task logger; with private_environment set, one that writes ``***`` for its values."""
        log = super().log
        secrets = [str(v) for v in (getattr(self, "_private_environment", None) or {}).values() if v]
        return _RedactingLog(log, secrets) if secrets else log

    def _redact(self, text: str) -> str:
        log = self.log
        return log.redact(text) if isinstance(log, _RedactingLog) else text

    # -- execute ---------------------------------------------------------------------------

    def execute(self, context: Any) -> dict[str, Any] | None:
        reject_unknown_conf(context, self.task_id)
        try:
            plan = resolve_try(self.spec, context["ti"], context.get("params"))
        except (TfpipeConfigError, contract.ContractError) as err:
            raise AirflowFailException(f"{self.task_id}: invalid run parameters: {err}") from err

        from airflow.providers.common.compat.sdk import mask_secret

        for value in self.spec.private_environment.values():
            mask_secret(value)  # redacted should a stage ever print it
        self.container_name = plan.name
        self.labels = dict(plan.labels)
        self.log.info("tfpipe %s: run dir %s, container %s", self.stage, plan.run_dir, self.container_name)
        # Where the run's files are, for the api-server's report and TensorBoard (tfpipe.plugins);
        # pushed first so a failed try still leads there.
        context["ti"].xcom_push(key=LOCATION_XCOM_KEY, value=location_record(
            stage=self.stage, docker_url=self.docker_url, image=self.image, volumes=self.volumes))

        self.hook.ping_or_raise()
        plan.config["run"].update(self._image_identity())
        self.environment = {**self.environment, contract.CONFIG_ENV: contract.dumps(plan.config)}
        if plan.gpus:
            self.hook.require_api("1.40", f"{self.stage}: GPU device requests")
        self._remove_leftovers_of(plan)
        if self.prepare_volumes:
            self._prepare_dirs(plan.writable_dirs)
        self.device_requests = device_requests(plan.gpus)
        if plan.gpus:
            self.log.info("requesting %s for %s", plan.gpus.describe(), self.stage)

        lines = [self._redact(str(line)) for line in self._run_with_gpu_fallback(context, plan.gpus) or []]
        result = contract.parse_result_line(lines or [])
        if result is None:
            raise StageFailedError(
                f"{self.stage}: the container exited 0 but printed no result line "
                f"({contract.RESULT_PREFIX.strip()} ...); is the image a tfpipe trainer image?",
                exit_code=0, logs=lines,
            )
        emit_stage_metrics(self.dag_id, self.stage, result)
        self.lineage_inputs = capture(self, context, result, _LINEAGE_STAGES)
        return result

    def _image_identity(self) -> dict[str, Any]:
        """The image's ID and repo digest, as the engine knows them (pulled first if missing,
        as DockerOperator would), for the provenance the trainer writes into metadata.json."""
        from docker.errors import ImageNotFound

        try:
            inspected = self.cli.inspect_image(self.image)
        except ImageNotFound:
            self.log.info("pulling %s", self.image)
            self.cli.pull(self.image)
            inspected = self.cli.inspect_image(self.image)
        return image_identity(self.image, inspected)

    def _run_image_with_mounts(self, target_mounts: Any, add_tmp_variable: bool) -> list[str] | str | None:
        # DockerOperator's ``cpus`` only sets relative CPU shares; a hard limit is HostConfig's
        # NanoCpus, which it never sets: add it to every host config this run creates.
        if self.nano_cpus:
            cli, nano_cpus = self.cli, self.nano_cpus
            create = type(cli).create_host_config.__get__(cli)
            cli.create_host_config = lambda *args, **kw: create(*args, nano_cpus=nano_cpus, **kw)
        return super()._run_image_with_mounts(target_mounts, add_tmp_variable)

    def _run_with_gpu_fallback(self, context: Any, gpus: GpuRequest | None) -> list[str] | None:
        from docker.errors import APIError

        try:
            return self._run_and_map_exit(context)
        except APIError as err:
            if _NO_BIND_SOURCE in str(err):
                raise AirflowFailException(
                    f"{self.stage}: a volume directory does not exist on the Docker engine's host ({err.explanation}). "
                    f"Fix: create it there (volumes: data={self.volumes.data}, work={self.volumes.work}, "
                    f"models={self.volumes.models}); the data volume must hold the raw data."
                ) from err
            if not gpus or _NO_GPU_DRIVER not in str(err):
                raise
            self._remove_container()
            if self.spec.gpu_fallback == "cpu":
                self.log.warning("no NVIDIA runtime on the engine at %s; gpu_fallback='cpu': running %s on the CPU",
                                 self.docker_url, self.stage)
                self.device_requests = None
                return self._run_and_map_exit(context)
            raise GpuUnavailableError(
                f"{self.stage}: {gpus.describe()} requested, but the Docker engine at {self.docker_url} cannot "
                f"provide GPUs ({_NO_GPU_DRIVER!r}). Fix: install the NVIDIA Container Toolkit on the engine's "
                "host and restart dockerd (`nvidia-ctk runtime configure --runtime=docker`), or set "
                "gpu_fallback='cpu' (or gpus=None) to train on the CPU."
            ) from err

    def _run_and_map_exit(self, context: Any) -> list[str] | None:
        try:
            return super().execute(context)
        except DockerContainerFailedException as err:
            state = self._container_state()
            code = state.get("ExitCode")
            logs = [self._redact(str(x)) for x in (err.logs or [])]
            self._raise_for_exit(code, bool(state.get("OOMKilled")), logs, context)
            raise
        finally:
            self._remove_container()

    def _raise_for_exit(self, code: int | None, oom_killed: bool, logs: list[str], context: Any) -> None:
        if code == contract.ExitCode.NOT_BLESSED and self.stage == "evaluate":
            result = contract.parse_result_line(logs)  # a decision too: its figures and lineage count
            emit_stage_metrics(self.dag_id, self.stage, result)
            self.lineage_inputs = capture(self, context, result, _LINEAGE_STAGES)
        raise_for_exit(stage=self.stage, code=code, oom_killed=oom_killed, logs=logs, context=context,
                       downstream=lambda: list(self.get_direct_relative_ids(upstream=False)),
                       mem_limit=self.mem_limit, log=self.log)

    # -- engine housekeeping (the hook does it) ------------------------------------------------

    def _remove_leftovers_of(self, plan: TryPlan) -> None:
        identity = {k: v for k, v in plan.labels.items() if not k.endswith(("try_number", "stage"))}
        self.hook.remove_labelled(identity, name=plan.name, log=self.log)

    def _remove_leftovers(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> None:
        """Stop and remove containers left by earlier tries of this task (found by labels and name)."""
        from tfpipe.specs import TryIdentity

        self._remove_leftovers_of(resolve_try(self.spec, TryIdentity(dag_id, run_id, task_id, 1, map_index)))

    def _prepare_dirs(self, dirs: tuple[str, ...]) -> None:
        """Create ``dirs`` on the engine's host and hand them to the stage's user, from a root container."""
        self.hook.run_helper(
            image=self.image, command=prepare_dirs_command(dirs, self.user or "0:0"),
            binds={m.source: {"bind": m.target, "mode": "rw"} for m in self.spec.mounts if not m.read_only},
            labels=self.labels or {}, role=PREPARE_ROLE, where="the work and models volumes")

    def _container_state(self) -> dict[str, Any]:
        if not getattr(self, "container", None):
            return {}
        try:
            return self.cli.inspect_container(self.container["Id"]).get("State", {})
        except Exception:  # already gone
            return {}

    def _remove_container(self) -> None:
        if not getattr(self, "container", None):
            return
        try:
            self.cli.remove_container(self.container["Id"], force=True)
        except Exception as err:  # already removed
            self.log.debug("container %s already gone: %s", self.container["Id"][:12], err)
        self.container = None

    # -- OpenLineage (used when apache-airflow-providers-openlineage is installed) ---------------

    def _lineage(self, captured: dict[str, Any] | None) -> Any:
        from tfpipe.lineage import stage_lineage, to_operator_lineage

        captured = captured or {}
        return to_operator_lineage(stage_lineage(
            self.stage, volumes=self.volumes, docker_url=self.docker_url, image=self.image,
            data_path=(self.spec.config.get("data") or {}).get("path"),
            result=captured.get("result"), upstream=captured.get("upstream") or {}))

    def get_openlineage_facets_on_start(self) -> Any:
        """Lineage before the stage ran: the inputs this stage will read."""
        return self._lineage(None)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """Lineage of the finished stage: inputs and outputs with fingerprint, metrics, blessing, image."""
        return self._lineage(getattr(self, "lineage_inputs", None))

    def on_kill(self) -> None:
        """Stop and remove the stage container when Airflow kills the task."""
        if self.hook.client_created and getattr(self, "container", None):
            self.log.info("on_kill: stopping and removing %s", self.container["Id"][:12])
            try:
                self.cli.stop(self.container["Id"], timeout=10)
            finally:
                self._remove_container()


class PrepOperator(TfpipeStageOperator):
    """Validate raw data and write sharded TFRecords, schema, stats and fingerprint (cached)."""

    stage = "prep"


class TrainOperator(TfpipeStageOperator):
    """Train with checkpoints; a retried or cleared try resumes from the newest checkpoint."""

    stage = "train"
    ui_color = "#ffd59e"
    operator_extra_links = (RunReportLink(), TensorBoardLink())


class EvaluateOperator(TfpipeStageOperator):
    """Evaluate and apply the blessing gate; not blessed skips the downstream export."""

    stage = "evaluate"
    operator_extra_links = (RunReportLink(), TensorBoardLink())


class ExportOperator(TfpipeStageOperator):
    """Export a versioned SavedModel with raw-feature serving signature and lineage metadata."""

    stage = "export"
    operator_extra_links = (RunReportLink(), TensorBoardLink())


OPERATORS: dict[str, type[TfpipeStageOperator]] = {
    op.stage: op for op in (PrepOperator, TrainOperator, EvaluateOperator, ExportOperator)
}
