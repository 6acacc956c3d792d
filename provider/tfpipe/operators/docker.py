"""The Docker backend: one thin ``DockerOperator`` subclass per pipeline stage, built from a
:class:`~tfpipe.specs.StageSpec`.

Construction stores the spec (no I/O). ``execute()`` resolves the image and this try, re-attaches to
an earlier try's container that still runs (its id kept in ``task_state_store`` by Airflow 3.3's
``ResumableJobMixin``), else removes leftovers of earlier tries and starts a new container, then maps
its exit code through the contract and returns the stage's JSON result. A stage that finds a
directory it writes not ready for its user exits 13; a short root helper then prepares the run's
directories and the stage starts again, once.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.providers.common.compat.sdk import AirflowFailException, ResumableJobMixin
from airflow.providers.docker.operators.docker import DockerOperator, fetch_logs

from tfpipe import contract
from tfpipe.config import GpuRequest, TfpipeConfigError, trial_training
from tfpipe.links import MlflowRunLink, RunReportLink, TensorBoardLink
from tfpipe.specs import (
    MountSpec,
    StageSpec,
    prepare_dirs_command,
    run_writable_dirs,
    stage_spec,
)

if TYPE_CHECKING:  # task-time modules, imported in execute()
    from tfpipe.hooks.docker import TfpipeDockerHook
    from tfpipe.tries import TryPlan

_NO_GPU_DRIVER = "could not select device driver"
_NO_BIND_SOURCE = "bind source path does not exist"
#: ``tfpipe.role`` of the short container that prepares a stage's directories.
PREPARE_ROLE = "prepare-volumes"
#: Upstream stages whose results a stage's OpenLineage event names (dataset dir, model, blessing).
_LINEAGE_STAGES = ("prep", "prep_merge", "train", "select", "evaluate")
#: Exits that are decisions rather than breakdowns: their result still counts for metrics and lineage.
_DECISIONS = {contract.ExitCode.NOT_BLESSED: "evaluate", contract.ExitCode.DATA_REJECTED: "validate"}


#: The context key a trial's label is put under: mapped train's ``map_index_template`` shows it.
TRIAL_LABEL_KEY = "tfpipe_trial"


def put_trial(config: dict[str, Any], trial: Mapping[str, Any]) -> None:
    """Make a resolved train config one trial's: its settings over the run's, and the trial key the trainer
    keeps its state under."""
    config["training"] = trial_training(config["training"], trial["params"])
    config[contract.TRIAL_KEY] = {"index": trial["index"], "params": dict(trial["params"])}


def trial_label(trial: Mapping[str, Any]) -> str:
    """``trial 2: learning_rate=0.01, batch_size=64``."""
    return f"trial {trial['index']}: " + ", ".join(f"{key}={value}" for key, value in trial["params"].items())


def docker_mount(mount: MountSpec) -> Any:
    """The docker-py bind ``Mount`` of a spec's mount."""
    from docker.types import Mount

    return Mount(target=mount.target, source=mount.source, type="bind", read_only=mount.read_only)


class TfpipeStageOperator(ResumableJobMixin, DockerOperator):
    """Run one tfpipe stage (``python3 -m trainer <stage>``) in the trainer image.

    Built from a :class:`~tfpipe.specs.StageSpec`; used on its own, it builds the spec from the
    arguments below with :func:`tfpipe.specs.stage_spec`, validated as a pipeline config is.

    :param spec: the stage's spec; when given, the spec arguments below must be left out.
    :param docker_url: the Docker engine, local or remote.
    :param prepare_volumes: when the stage finds a directory it writes not ready for its user, prepare
        them from a root helper container and run the stage once more; off, such a stage fails.
    :param image: the trainer image, pinned by version tag or digest; ``None`` = the Airflow
        Variable ``tfpipe_image``, read when the task runs.
    :param stage_config: the stage config template (see :func:`tfpipe.specs.config_template`).
    :param volumes: host directories on the engine's host: ``data`` (read-only), ``work`` and
        ``models``; a :class:`~tfpipe.config.VolumesConfig` or mapping.
    :param gpus: ``None``, ``"all"``, a count, or a list of device ids; a run's ``gpus`` Param overrides it.
    :param gpu_fallback: ``"fail"`` or ``"cpu"`` when GPUs are requested but the engine has no NVIDIA runtime.
    :param gpu_stage: whether a run's ``gpus`` Param applies to this task (default: train and evaluate).
    :param allow_floating_tag: accept an unpinned image such as ``:latest`` (also the Variable's).
    :param user: ``uid:gid`` the stage runs as (non-root, so files on mounts belong to the user).
    :param shm_size: ``/dev/shm`` size, e.g. ``"1g"`` (tf.data needs more than Docker's 64 MB).
    :param mem_limit: memory limit, e.g. ``"8g"``; an out-of-memory kill is reported as such.
    :param network_mode: Docker network; ``"none"`` cuts the stage off the network.
    :param environment: extra environment variables (templated).
    :param private_environment: secrets for the container; never rendered or logged.
    :param cpus: CPU limit (Docker's ``--cpus``); ``None`` = no limit.
    :param timezone: the container's ``TZ``.
    :param jemalloc: preload jemalloc in place of glibc malloc.
    :param kwargs: passed on to ``ResumableJobMixin`` (``durable=False``: a new container on every
        try), ``DockerOperator`` and ``BaseOperator``; each also takes its own from ``default_args``.
    """

    stage: ClassVar[str] = ""
    shard_index: int | None = None  # see PrepShardOperator
    trial: dict[str, Any] | None = None  # see TrainOperator
    engine_from_shard_list: bool = False
    #: task_state_store key of the container id; renaming it breaks re-attaching for tries in flight.
    external_id_key = "tfpipe_container_id"
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
            raise TypeError("use the operator of a stage: " + ", ".join(op.__name__ for op in OPERATORS.values()))
        if spec is None:
            spec = stage_spec(
                self.stage, task_id=kwargs.get("task_id", self.stage), image=image, stage_config=stage_config,
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
        self.allow_floating_tag = allow_floating_tag
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
        from tfpipe.hooks.docker import TfpipeDockerHook

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
        if not secrets:
            return log
        from tfpipe.redact import RedactingLog  # only a task with secrets, when it runs

        return RedactingLog(log, secrets)

    def _redact(self, text: str) -> str:
        log = self.log
        from tfpipe.redact import RedactingLog

        return log.redact(text) if isinstance(log, RedactingLog) else text

    # -- execute ---------------------------------------------------------------------------

    def execute(self, context: Any) -> dict[str, Any] | None:
        from tfpipe.engine_settings import EngineSettings
        from tfpipe.lineage import capture
        from tfpipe.metrics import emit_stage_metrics
        from tfpipe.plugins.paths import LOCATION_XCOM_KEY, location_record
        from tfpipe.run_params import reject_unknown_conf
        from tfpipe.settings import resolve_image
        from tfpipe.tries import resolve_try

        reject_unknown_conf(context, self.task_id)
        self.image = resolve_image(self.spec.image, task=self.task_id, allow_floating_tag=self.allow_floating_tag)
        try:
            plan = resolve_try(self.spec, context["ti"], context.get("params"), image=self.image,
                               shard_index=self.shard_index)
            if self.trial is not None:
                put_trial(plan.config, self.trial)
                context[TRIAL_LABEL_KEY] = trial_label(self.trial)  # the mapped instance's name in the UI
        except (TfpipeConfigError, contract.ContractError) as err:
            raise AirflowFailException(f"{self.task_id}: invalid run parameters: {err}") from err
        try:
            # before the hook is first built
            EngineSettings.from_airflow_config().apply_to(self, tls_for_named_engine=self.engine_from_shard_list)
        except TfpipeConfigError as err:
            raise AirflowFailException(f"{self.task_id}: {err}") from err

        from airflow.providers.common.compat.sdk import mask_secret

        for value in self.spec.private_environment.values():
            mask_secret(value)  # redacted should a stage ever print it
        self.container_name = plan.name
        self.labels = dict(plan.labels)
        self._plan = plan
        self._result: dict[str, Any] | None = None
        self._fresh = False
        self._dirs_ready = not self.prepare_volumes  # False: this try may still prepare them, once
        self.log.info("tfpipe %s: run dir %s, container %s", self.stage, plan.run_dir, self.container_name)
        # Where the run's files are, for the api-server's report and TensorBoard (tfpipe.plugins);
        # pushed first so a failed try still leads there.
        context["ti"].xcom_push(key=LOCATION_XCOM_KEY, value=location_record(
            stage=self.stage, docker_url=self.docker_url, image=self.image, volumes=self.volumes))

        self.hook.ping_or_raise(what=self.stage)
        if plan.gpus:
            self.hook.require_api("1.40", f"{self.stage}: GPU device requests")
        result = self.execute_resumable(context)
        emit_stage_metrics(self.dag_id, self.stage, result)
        self.lineage_inputs = capture(self, context, result, _LINEAGE_STAGES)
        return result

    # -- ResumableJobMixin: the "job" is the stage container, its external id the container id --------

    def submit_job(self, context: Any) -> str:
        """Start a new stage container (after removing any of an earlier try); return its id."""
        from tfpipe.tries import image_identity

        plan = self._plan
        self._remove_leftovers_of(plan)
        # Provenance for metadata.json: the image's ID and repo digest as this engine knows them.
        plan.config["run"].update(image_identity(self.image, self._ensure_image()))
        self.environment = {**self.environment, contract.CONFIG_ENV: contract.dumps(plan.config)}
        self.device_requests = plan.gpus.to_docker() if plan.gpus else None
        if plan.gpus:
            self.log.info("requesting %s for %s", plan.gpus.describe(), self.stage)
        self.container = self._start_with_gpu_fallback(plan.gpus)
        self._fresh = True
        return self.container["Id"]

    def get_job_status(self, external_id: Any, context: Any) -> str:
        """``running``, ``exited:<code>``, another Docker state, or ``gone`` (removed, another engine)."""
        from docker.errors import NotFound

        try:
            info = self.cli.inspect_container(str(external_id))
        except NotFound:
            return "gone"
        ti = context["ti"]
        labels = (info.get("Config") or {}).get("Labels") or {}
        mine = {"tfpipe.dag_id": ti.dag_id, "tfpipe.run_id": ti.run_id, "tfpipe.task_id": ti.task_id}
        if any(labels.get(k) != v for k, v in mine.items()):
            return "gone"  # not this task's container: never attach to someone else's work
        state = info.get("State") or {}
        status = str(state.get("Status") or "unknown")
        return f"exited:{state.get('ExitCode')}" if status in ("exited", "dead") else status

    def is_job_active(self, status: str) -> bool:
        # A paused container still holds the run's checkpoint directory: wait for it, never start a
        # second writer beside it.
        return status in ("running", "paused")

    def is_job_succeeded(self, status: str) -> bool:
        return status == "exited:0"

    def poll_until_complete(self, external_id: Any, context: Any) -> dict[str, Any]:
        """Follow the container's output (a re-attached one from now) until it exits; map its exit code."""
        cid = str(external_id)
        fresh = getattr(self, "_fresh", False)
        self.container = {"Id": cid}
        if not fresh:
            self._remove_leftovers_of(self._plan, keep=cid)
            self.log.info("re-attached to the running %s container %s of an earlier try: following its output "
                          "from here, no second container is started", self.stage, cid[:12])
        stream = self.cli.logs(cid, stdout=True, stderr=True, stream=True, follow=True,
                               **({} if fresh else {"tail": 0}))
        lines = [self._redact(str(line)) for line in fetch_logs(stream, self.log)]
        # The stream also ends when the engine goes away: an exception here leaves the container
        # in place, so that the next try can re-attach to it if it survived.
        code = self.cli.wait(cid).get("StatusCode")
        if not fresh or contract.parse_result_line(lines) is None:
            lines = lines + self._tail_lines(cid, exclude=lines)
        if code == contract.ExitCode.DIRS_NOT_READY and not getattr(self, "_dirs_ready", True):
            return self._prepare_and_start_again(context)
        try:
            if code != 0:  # only a failure needs the state (was it the OOM killer?)
                self._raise_for_exit(code, bool(self._container_state().get("OOMKilled")), lines, context)
            self._result = self._result_from(lines)
            return self._result
        finally:
            self._remove_container()

    def get_job_result(self, external_id: Any, context: Any) -> dict[str, Any]:
        """The result of this try's container, or of an earlier try's that exited 0 unwatched."""
        if getattr(self, "_result", None) is not None:
            return self._result
        cid = str(external_id)
        self.container = {"Id": cid}
        self.log.info("the %s container %s of an earlier try already exited 0: taking its result", self.stage,
                      cid[:12])
        try:
            self._result = self._result_from(self._tail_lines(cid))
            return self._result
        finally:
            self._remove_container()

    def _result_from(self, lines: list[str]) -> dict[str, Any]:
        result = contract.parse_result_line(lines)
        if result is None:
            from tfpipe.exceptions import StageFailedError

            raise StageFailedError(
                f"{self.stage}: the container exited 0 but printed no result line "
                f"({contract.RESULT_PREFIX.strip()} ...); is the image a tfpipe trainer image?",
                exit_code=0, logs=lines,
            )
        return result

    def _tail_lines(self, cid: str, exclude: list[str] | None = None) -> list[str]:
        """The container's last output lines (for the result line and error messages)."""
        from tfpipe.operators.exits import _LOG_TAIL

        raw = self.cli.logs(cid, stdout=True, stderr=True, tail=_LOG_TAIL).decode("utf-8", "replace")
        lines = [self._redact(line.rstrip()) for line in raw.splitlines()]
        seen = set(exclude or [])
        return [line for line in lines if line not in seen]

    # -- starting a container ----------------------------------------------------------------

    def _ensure_image(self) -> dict[str, Any]:
        """The engine's ``inspect_image`` of the image; pulled first when missing, or an error that
        says how to provide it."""
        from docker.errors import APIError, NotFound

        from tfpipe.exceptions import ImageNotFoundError
        from tfpipe.settings import HOW_TO_SET_IMAGE

        try:
            return self.cli.inspect_image(self.image)
        except NotFound:
            pass
        self.log.info("pulling %s on the engine at %s", self.image, self.docker_url)
        try:
            for _ in self.cli.pull(self.image, stream=True, decode=True):
                pass
        except APIError as err:
            raise ImageNotFoundError(
                f"{self.stage}: the Docker engine at {self.docker_url} has no image {self.image} and cannot pull "
                f"it ({err.explanation or err}). Fix: build it (`make image`) or push it to a registry that "
                f"engine can reach, and point the pipeline at it: {HOW_TO_SET_IMAGE}."
            ) from err
        try:
            return self.cli.inspect_image(self.image)
        except NotFound as err:
            raise ImageNotFoundError(
                f"{self.stage}: pulling {self.image} on the engine at {self.docker_url} left no such image. "
                f"Fix: {HOW_TO_SET_IMAGE}."
            ) from err

    def _create_and_start(self) -> dict[str, Any]:
        """Create and start the stage container with this operator's settings (as DockerOperator would)."""
        from docker.types import LogConfig

        container = self.cli.create_container(
            command=self.format_command(self.command),
            name=self.container_name,
            environment={**self.environment, **self._private_environment},
            host_config=self.cli.create_host_config(
                auto_remove=False,
                mounts=self.mounts,
                network_mode=self.network_mode,
                shm_size=self.shm_size,
                cpu_shares=round(self.cpus * 1024),
                # a hard limit (DockerOperator's ``cpus`` alone only sets relative shares)
                nano_cpus=self.nano_cpus,
                mem_limit=self.mem_limit,
                privileged=False,
                device_requests=self.device_requests,
                log_config=LogConfig(config={}),
            ),
            image=self.image,
            user=self.user,
            working_dir=self.working_dir,
            tty=False,
            labels=self.labels,
        )
        self.container = container
        try:
            self.cli.start(container["Id"])
        except Exception:
            self._remove_container()  # a container that never started is nobody's to keep
            raise
        return container

    def _start_with_gpu_fallback(self, gpus: GpuRequest | None) -> dict[str, Any]:
        from docker.errors import APIError

        try:
            return self._create_and_start()
        except APIError as err:
            self._remove_container()
            if _NO_BIND_SOURCE in str(err) and not getattr(self, "_dirs_ready", True):
                # A fresh engine host: the helper's binds create the missing volume directories.
                self._prepare_dirs(run_writable_dirs(self._plan.config, self._plan.run_dir))
                self._dirs_ready = True
                return self._start_with_gpu_fallback(gpus)
            if _NO_BIND_SOURCE in str(err):
                raise AirflowFailException(
                    f"{self.stage}: a volume directory does not exist on the Docker engine's host ({err.explanation}). "
                    f"Fix: create it there (volumes: data={self.volumes.data}, work={self.volumes.work}, "
                    f"models={self.volumes.models}); the data volume must hold the raw data."
                ) from err
            if not gpus or _NO_GPU_DRIVER not in str(err):
                raise
            if self.spec.gpu_fallback == "cpu":
                self.log.warning("no NVIDIA runtime on the engine at %s; gpu_fallback='cpu': running %s on the CPU",
                                 self.docker_url, self.stage)
                self.device_requests = None
                return self._create_and_start()
            from tfpipe.exceptions import GpuUnavailableError

            raise GpuUnavailableError(
                f"{self.stage}: {gpus.describe()} requested, but the Docker engine at {self.docker_url} cannot "
                f"provide GPUs ({_NO_GPU_DRIVER!r}). Fix: install the NVIDIA Container Toolkit on the engine's "
                "host and restart dockerd (`nvidia-ctk runtime configure --runtime=docker`), or set "
                "gpu_fallback='cpu' (or gpus=None) to train on the CPU."
            ) from err

    def _raise_for_exit(self, code: int | None, oom_killed: bool, logs: list[str], context: Any) -> None:
        from tfpipe.lineage import capture
        from tfpipe.metrics import emit_stage_metrics
        from tfpipe.operators.exits import raise_for_exit

        if _DECISIONS.get(code) == self.stage:
            result = contract.parse_result_line(logs)  # a decision: its figures and lineage count
            emit_stage_metrics(self.dag_id, self.stage, result)
            self.lineage_inputs = capture(self, context, result, _LINEAGE_STAGES)
        raise_for_exit(stage=self.stage, code=code, oom_killed=oom_killed, logs=logs, context=context,
                       downstream=lambda: list(self.get_direct_relative_ids(upstream=False)),
                       mem_limit=self.mem_limit, log=self.log)

    # -- engine housekeeping (the hook does it) ------------------------------------------------

    def _remove_leftovers_of(self, plan: TryPlan, keep: str | None = None) -> None:
        """Stop and remove containers left by earlier tries of this task (by labels and name), except ``keep``."""
        identity = {k: v for k, v in plan.labels.items() if not k.endswith(("try_number", "stage"))}
        self.hook.remove_labelled(identity, name=plan.name, keep=keep, log=self.log)

    def _remove_leftovers(self, dag_id: str, run_id: str, task_id: str, map_index: int,
                          keep: str | None = None) -> None:
        """:meth:`_remove_leftovers_of` for a try identified by hand (shell tooling, tests)."""
        from tfpipe.specs import container_labels, container_name

        labels = container_labels(dag_id=dag_id, run_id=run_id, task_id=task_id, try_number=1, stage=self.stage,
                                  map_index=map_index)
        identity = {k: v for k, v in labels.items() if not k.endswith(("try_number", "stage"))}
        self.hook.remove_labelled(identity, name=container_name(dag_id, run_id, task_id, map_index), keep=keep,
                                  log=self.log)

    def _prepare_dirs(self, dirs: tuple[str, ...]) -> None:
        """Create ``dirs`` on the engine's host and hand them to the stage's user, from a root container."""
        self.hook.run_helper(
            image=self.image, command=prepare_dirs_command(dirs, self.user or "0:0"),
            binds={m.source: {"bind": m.target, "mode": "rw"} for m in self.spec.mounts if not m.read_only},
            labels=self.labels or {}, role=PREPARE_ROLE, where="the work and models volumes")

    def _prepare_and_start_again(self, context: Any) -> dict[str, Any]:
        """After exit 13 (a directory not ready for the stage's user): prepare the run's directories and
        run the stage once more (a second exit 13 fails the task)."""
        self._remove_container()
        self.log.info("%s: a directory it writes is not ready for %s: preparing the run's directories on the "
                      "engine's host, then starting the stage again", self.stage, self.user or "root")
        self._prepare_dirs(run_writable_dirs(self._plan.config, self._plan.run_dir))
        self._dirs_ready = True
        container_id = self.submit_job(context)
        from tfpipe.compat import task_state_store

        store = task_state_store(context)
        if store is not None:  # a worker lost from here on finds this container, as execute_resumable records one
            store.set(self.external_id_key, container_id)
        return self.poll_until_complete(container_id, context)

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


class ValidateOperator(TfpipeStageOperator):
    """The data gate: compare the prepared data with the production model's; anomalies fail the task
    without a retry (or only warn), before any training."""

    stage = "validate"
    operator_extra_links = (RunReportLink(),)


class TrainOperator(TfpipeStageOperator):
    """Train with checkpoints; a retried or cleared try resumes from the newest checkpoint.

    :param trial: one trial of a sweep, ``{"index": k, "params": {setting: value}}`` (the DAG maps train over
        :meth:`~tfpipe.config.TuningConfig.trial_plan`): its settings win over the run's, and its state lives
        in its own directory, so each trial resumes on its own.
    """

    stage = "train"
    ui_color = "#ffd59e"
    operator_extra_links = (RunReportLink(), TensorBoardLink(), MlflowRunLink())

    def __init__(self, *, trial: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.trial = trial


class SelectOperator(TfpipeStageOperator):
    """Pick a sweep's best trial and make its training output the run's (evaluate and export read it)."""

    stage = "select"
    operator_extra_links = (RunReportLink(),)


class EvaluateOperator(TfpipeStageOperator):
    """Evaluate and apply the blessing gate; not blessed skips the downstream export."""

    stage = "evaluate"
    operator_extra_links = (RunReportLink(), TensorBoardLink())


class ExportOperator(TfpipeStageOperator):
    """Export a versioned SavedModel with raw-feature serving signature and lineage metadata."""

    stage = "export"
    operator_extra_links = (RunReportLink(), TensorBoardLink())


class PrepShardOperator(TfpipeStageOperator):
    """Prep one slice of the input files (``data.shards`` > 1); mapped over the slice indexes.

    :param shard_index: the slice, 0 .. ``data.shards`` - 1 (``.expand(shard_index=range(n))``).
    :param engine_from_shard_list: ``docker_url`` is one of the pipeline's ``shard_docker_urls``; a
        ``tcp://`` one then presents the deployment's ``[tfpipe] tls_*`` files.
    """

    stage = "prep_shard"

    def __init__(self, *, shard_index: int, engine_from_shard_list: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard_index = shard_index
        self.engine_from_shard_list = engine_from_shard_list


class PrepMergeOperator(TfpipeStageOperator):
    """Merge the prep_shard parts into the one data set train and evaluate read (cached)."""

    stage = "prep_merge"


#: The operator of each stage (``contract.RUNNABLE_STAGES``: an unsharded pipeline's five and
#: sharded prep's two).
OPERATORS: dict[str, type[TfpipeStageOperator]] = {
    op.stage: op for op in (PrepOperator, PrepShardOperator, PrepMergeOperator, ValidateOperator, TrainOperator,
                            SelectOperator, EvaluateOperator, ExportOperator)
}


def stage_operator(stage: str) -> type[TfpipeStageOperator]:
    """The operator class of ``stage`` (any of ``contract.RUNNABLE_STAGES``)."""
    return OPERATORS[stage]
