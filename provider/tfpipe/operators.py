"""Stage operators: one thin ``DockerOperator`` subclass per pipeline stage.

Construction only stores and validates arguments (no I/O: DAG files parse fast and offline).
``execute()`` then, against the Docker engine at ``docker_url``:

1. resolves the stage config for this try (Params/``dag_run.conf`` overrides, run identity);
2. removes any leftover container of an earlier try of the same task (a worker killed with
   SIGKILL never ran ``on_kill``), so two containers never write one checkpoint directory;
3. prepares the directories the stage writes, from a short root container on the engine
   (the worker may not see the engine's disks);
4. runs the stage container (deterministic name, ``tfpipe.*`` labels, non-root user, GPUs);
5. maps the exit code through the contract (:class:`tfpipe.contract.ExitCode`) and returns
   the stage's JSON result through XCom.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from airflow.providers.common.compat.sdk import AirflowFailException, DownstreamTasksSkipped
from airflow.providers.docker.exceptions import DockerContainerFailedException
from airflow.providers.docker.operators.docker import DockerOperator

from tfpipe import contract
from tfpipe.config import ResourcesConfig, VolumesConfig, check_image_ref
from tfpipe.debug import RunReportLink, TensorBoardLink
from tfpipe.engine import EngineSettings, diagnose, engine_error_message
from tfpipe.exceptions import (
    DockerEngineRefusedError,
    DockerEngineUnreachableError,
    GpuUnavailableError,
    StageFailedError,
    StageRejectedError,
    TfpipeConfigError,
)
from tfpipe.specs import (
    TF_DEFAULT_ENV,
    GpuRequest,
    MountSpec,
    container_labels,
    container_name,
    prepare_dirs_command,
    resolve_stage_config,
    stage_command,
    writable_dirs,
)

_NO_GPU_DRIVER = "could not select device driver"
_NO_BIND_SOURCE = "bind source path does not exist"
_LOG_TAIL = 30


def _tail(lines: list[str] | None) -> str:
    lines = [str(line) for line in (lines or [])][-_LOG_TAIL:]
    return "\n".join(lines)


class TfpipeStageOperator(DockerOperator):
    """Run one tfpipe stage (``python3 -m trainer <stage>``) in the trainer image.

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
    :param docker_url: the Docker engine, local or remote.
    :param prepare_volumes: create and chown the directories the stage writes before it runs.
    :param kwargs: passed to ``BaseOperator`` (``task_id``, ``retries``, ``pool``, ...).
    """

    stage: ClassVar[str] = ""
    template_fields = tuple(f for f in DockerOperator.template_fields if f not in ("container_name", "mounts"))
    ui_color = "#fbe9d0"

    def __init__(
        self,
        *,
        image: str,
        stage_config: Mapping[str, Any],
        volumes: VolumesConfig | Mapping[str, str],
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
        docker_url: str = "unix://var/run/docker.sock",
        prepare_volumes: bool = True,
        **kwargs: Any,
    ) -> None:
        if not self.stage:
            raise TypeError("use one of PrepOperator, TrainOperator, EvaluateOperator, ExportOperator")
        check_image_ref("image", image, allow_floating_tag=allow_floating_tag)
        volumes = VolumesConfig.from_dict(volumes, where="volumes")
        resources = ResourcesConfig(gpus=gpus, gpu_fallback=gpu_fallback, user=user, shm_size=shm_size or "64m",
                                    mem_limit=mem_limit, network_mode=network_mode)
        if not isinstance(stage_config, Mapping) or "data" not in stage_config or "export" not in stage_config:
            raise TfpipeConfigError(
                "stage_config: must be a stage config template with data, training, evaluation and export "
                "sections. Fix: build it with tfpipe.specs.config_template(pipeline_config, stage)."
            )
        from docker.utils import parse_bytes

        self.volumes = volumes
        self.gpu_request = GpuRequest.parse(gpus)
        self.gpu_fallback = resources.gpu_fallback
        self.gpu_stage = self.stage in resources.gpu_stages if gpu_stage is None else bool(gpu_stage)
        self.stage_config = dict(stage_config)
        self.prepare_volumes = prepare_volumes
        mounts = [
            MountSpec(volumes.data, contract.CONTAINER_DATA, True),
            MountSpec(volumes.work, contract.CONTAINER_WORK, False),
            MountSpec(volumes.models, contract.CONTAINER_MODELS, False),
        ]
        self.mount_specs = tuple(mounts)
        super().__init__(
            image=image,
            command=list(stage_command(self.stage)),
            docker_url=docker_url,
            api_version="auto",
            mounts=[m.to_docker() for m in mounts],
            mount_tmp_dir=False,
            auto_remove="never",  # removed by execute() after the exit state was read
            user=user,
            shm_size=parse_bytes(shm_size) if shm_size else None,
            mem_limit=mem_limit,
            network_mode=network_mode,
            environment={**TF_DEFAULT_ENV, **(environment or {})},
            private_environment=private_environment,
            privileged=False,
            tty=False,
            xcom_all=True,
            do_xcom_push=True,
            **kwargs,
        )

    # -- execute ---------------------------------------------------------------------------

    def execute(self, context: Any) -> dict[str, Any] | None:
        ti = context["ti"]
        params = dict(context.get("params") or {})
        map_index = getattr(ti, "map_index", -1)
        map_index = -1 if map_index is None else map_index
        try:
            config = resolve_stage_config(
                {**self.stage_config, "stage": self.stage},
                dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                try_number=ti.try_number, image=self.image, overrides=params,
            )
            gpus = self.gpu_request
            if self.gpu_stage and params.get("gpus") not in (None, ""):
                gpus = GpuRequest.parse(params["gpus"], field_name="params.gpus")
        except (TfpipeConfigError, contract.ContractError) as err:
            raise AirflowFailException(f"{self.task_id}: invalid run parameters: {err}") from err
        try:
            EngineSettings.from_airflow_config().apply_to(self)
        except TfpipeConfigError as err:
            raise AirflowFailException(f"{self.task_id}: {err}") from err

        from airflow.providers.common.compat.sdk import mask_secret

        for value in (self._private_environment or {}).values():
            mask_secret(value)  # redacted should a stage ever print it
        self.container_name = container_name(ti.dag_id, ti.run_id, ti.task_id, map_index)
        self.labels = container_labels(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                                       try_number=ti.try_number, stage=self.stage, map_index=map_index)
        self.environment = {**self.environment, contract.CONFIG_ENV: contract.dumps(config)}
        self.log.info("tfpipe %s: run dir %s, container %s", self.stage, config["paths"]["run_dir"],
                      self.container_name)

        self._check_engine(gpus)
        self._remove_leftovers(ti.dag_id, ti.run_id, ti.task_id, map_index)
        if self.prepare_volumes:
            self._prepare_dirs(writable_dirs(self.stage, config, config["paths"]["run_dir"]))
        self.device_requests = gpus.to_docker() if gpus else None
        if gpus:
            self.log.info("requesting %s for %s", gpus.describe(), self.stage)

        lines = self._run_with_gpu_fallback(context, gpus)
        result = contract.parse_result_line(lines or [])
        if result is None:
            raise StageFailedError(
                f"{self.stage}: the container exited 0 but printed no result line "
                f"({contract.RESULT_PREFIX.strip()} ...); is the image a tfpipe trainer image?",
                exit_code=0, logs=lines,
            )
        return result

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
            if self.gpu_fallback == "cpu":
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
            logs = [str(x) for x in (err.logs or [])]
            self._raise_for_exit(code, bool(state.get("OOMKilled")), logs, context)
            raise
        finally:
            self._remove_container()

    def _raise_for_exit(self, code: int | None, oom_killed: bool, logs: list[str], context: Any) -> None:
        what = contract.ExitCode.describe(code)
        if code == contract.ExitCode.NOT_BLESSED and self.stage == "evaluate":
            result = contract.parse_result_line(logs)
            context["ti"].xcom_push(key="return_value", value=result)
            downstream = sorted(self.get_direct_relative_ids(upstream=False))
            self.log.info("candidate not blessed: skipping %s", ", ".join(downstream) or "nothing")
            raise DownstreamTasksSkipped(tasks=downstream)
        if code in contract.ExitCode.NO_RETRY:
            raise StageRejectedError(
                f"{self.stage} rejected its input: {what} (exit {code}); retrying cannot fix this.\n{_tail(logs)}",
                exit_code=code, logs=logs,
            )
        if oom_killed:
            raise StageFailedError(
                f"{self.stage} was killed by the out-of-memory killer (exit {code}, mem_limit={self.mem_limit}). "
                "Fix: raise resources.mem_limit or lower training.batch_size.\n" + _tail(logs),
                exit_code=code, oom_killed=True, logs=logs,
            )
        raise StageFailedError(f"{self.stage} failed: {what} (exit {code}).\n{_tail(logs)}",
                               exit_code=code, logs=logs)

    # -- engine helpers ----------------------------------------------------------------------

    def _check_engine(self, gpus: GpuRequest | None) -> None:
        try:
            cli = self.cli
            cli.ping()
        except Exception as err:  # docker-py raises several types; all mean "not reachable"
            from airflow.providers.docker.hooks.docker import DockerHook

            tls = DockerHook.construct_tls_config(
                ca_cert=self.tls_ca_cert, client_cert=self.tls_client_cert, client_key=self.tls_client_key,
                verify=self.tls_verify, assert_hostname=self.tls_hostname, ssl_version=self.tls_ssl_version)
            message, retryable = engine_error_message(self.docker_url, diagnose(self.docker_url, tls) or err)
            raise (DockerEngineUnreachableError if retryable else DockerEngineRefusedError)(
                f"{self.stage}: {message}") from err
        if gpus:
            from docker.utils import version_lt

            if version_lt(cli.api_version, "1.40"):
                raise GpuUnavailableError(
                    f"{self.stage}: GPU device requests need Docker API >= 1.40; the engine at {self.docker_url} "
                    f"speaks {cli.api_version}. Fix: upgrade Docker to 19.03 or newer."
                )

    def _remove_leftovers(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> None:
        """Stop and remove containers left by earlier tries of this task (found by labels and name)."""
        filters = {"label": [f"tfpipe.dag_id={dag_id}", f"tfpipe.run_id={run_id}", f"tfpipe.task_id={task_id}",
                             f"tfpipe.map_index={map_index}"]}
        found = {c["Id"]: c for c in self.cli.containers(all=True, filters=filters)}
        for c in self.cli.containers(all=True, filters={"name": f"^/{self.container_name}$"}):
            found.setdefault(c["Id"], c)
        for cid, c in found.items():
            labels = c.get("Labels") or {}
            self.log.warning(
                "removing leftover container %s (%s, try %s, state %s) of an earlier try before starting",
                (c.get("Names") or [cid[:12]])[0].lstrip("/"), labels.get("tfpipe.stage", "?"),
                labels.get("tfpipe.try_number", "?"), c.get("State"),
            )
            self.cli.remove_container(cid, force=True)

    def _prepare_dirs(self, dirs: tuple[str, ...]) -> None:
        """Create ``dirs`` on the engine's host and hand them to ``self.user``, from a root container."""
        # Binds (unlike mounts) make the engine create a missing source directory, so a fresh
        # host needs no set-up; the stage containers then mount the prepared directories.
        host_config = self.cli.create_host_config(
            binds={m.source: {"bind": m.target, "mode": "rw"} for m in self.mount_specs if not m.read_only},
            network_mode="none", auto_remove=False,
        )
        helper = self.cli.create_container(
            image=self.image, command=prepare_dirs_command(dirs, self.user or "0:0"), user="0:0",
            host_config=host_config, labels={**(self.labels or {}), "tfpipe.role": "prepare-volumes"},
            entrypoint=[],
        )
        try:
            self.cli.start(helper["Id"])
            status = self.cli.wait(helper["Id"]).get("StatusCode")
            if status != 0:
                out = self.cli.logs(helper["Id"]).decode("utf-8", "replace")
                raise StageFailedError(f"preparing volume directories failed (exit {status}): {out}",
                                       exit_code=status)
        finally:
            self.cli.remove_container(helper["Id"], force=True)

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
