"""The Kubernetes backend: the same stage specs (:class:`~tfpipe.specs.StageSpec`) as ``KubernetesPodOperator`` tasks.

Needs the ``kubernetes`` extra; the DAG factory imports this module only for ``backend="kubernetes"``.
A pod gets the spec's image, command, config and environment (secrets from Kubernetes Secrets),
``nvidia.com/gpu`` limits by count, memory and CPU limits, ``/dev/shm`` as a memory ``emptyDir``,
claims or hostPaths at the same mount points as on Docker, a non-root security context and, unless
``kubernetes.prepare_volumes`` is off, an init container that hands over the directories the stage
writes. Exit codes mean what they mean on Docker; the result is read from the end of the pod's log.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException

from tfpipe import contract
from tfpipe.config import GpuRequest, KubernetesConfig, TfpipeConfigError
from tfpipe.links import RunReportLink, TensorBoardLink
from tfpipe.operators.exits import raise_for_exit
from tfpipe.run_params import reject_unknown_conf
from tfpipe.settings import resolve_image
from tfpipe.specs import StageSpec, prepare_dirs_command
from tfpipe.tries import TryPlan, resolve_try

#: The resource name of NVIDIA's device plugin.
GPU_RESOURCE = "nvidia.com/gpu"
#: How many log lines are read back for the result line and error messages.
LOG_LINES = 200
_VOLUME_NAMES = {contract.CONTAINER_DATA: "data", contract.CONTAINER_WORK: "work", contract.CONTAINER_MODELS: "models"}
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(value: Any) -> str:
    """A Kubernetes label value (at most 63 of ``[A-Za-z0-9._-]``, alphanumeric at both ends)."""
    return _LABEL_VALUE.sub("_", str(value))[:63].strip("._-") or "x"


def pod_name(container_name: str) -> str:
    """A DNS-1123 pod name from the backend-neutral container name of a try."""
    return re.sub(r"[^a-z0-9-]+", "-", container_name.lower()).strip("-")[:63].rstrip("-")


def memory_quantity(size: str) -> str:
    """A Docker size (``"8g"``, ``"512m"``: powers of 1024) as a Kubernetes quantity in bytes."""
    from docker.utils import parse_bytes

    return str(parse_bytes(size))


def gpu_limit(gpus: GpuRequest | None, field_name: str = "gpus") -> int:
    """The ``nvidia.com/gpu`` count of a GPU request; Kubernetes has no "all" and no device ids."""
    if gpus is None:
        return 0
    if gpus.count == -1 or gpus.device_ids:
        raise TfpipeConfigError(f"{field_name}: {gpus.describe()} cannot be asked of Kubernetes, which schedules "
                                "GPUs by count (nvidia.com/gpu). Fix: give a count such as 1 or 2.")
    return gpus.count


def cpu_quantity(cpus: float) -> str:
    """A CPU count (Docker's ``--cpus``: ``4``, ``1.5``) as a Kubernetes quantity: whole CPUs as
    they are, fractions in millicores (``"1500m"``), the finest unit Kubernetes takes."""
    millis = round(cpus * 1000)
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def container_resources(spec: StageSpec, gpus: GpuRequest | None) -> Any:
    """Memory, CPU and GPU limits of the stage container."""
    from kubernetes.client import models as k8s

    limits: dict[str, str] = {}
    if spec.mem_limit:
        limits["memory"] = memory_quantity(spec.mem_limit)
    if spec.cpus is not None:
        # A limit alone: Kubernetes then requests the same, so the pod is scheduled where the CPUs
        # are free and its cgroup quota is what Docker's NanoCpus gives a container.
        limits["cpu"] = cpu_quantity(spec.cpus)
    count = gpu_limit(gpus)
    if count:
        limits[GPU_RESOURCE] = str(count)
    return k8s.V1ResourceRequirements(limits=limits or None)


def pod_volumes(spec: StageSpec, kube: KubernetesConfig) -> tuple[list[Any], list[Any]]:
    """``(volumes, volume_mounts)``: the three volumes (claims or hostPaths, data read-only) and ``/dev/shm``."""
    from kubernetes.client import models as k8s

    volumes, mounts = [], []
    for mount in spec.mounts:
        name = _VOLUME_NAMES[mount.target]
        claim = kube.claims.get(name)
        if claim:
            volumes.append(k8s.V1Volume(name=name, persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(
                claim_name=claim, read_only=mount.read_only)))
        else:
            kind = "Directory" if mount.read_only else "DirectoryOrCreate"
            volumes.append(k8s.V1Volume(name=name, host_path=k8s.V1HostPathVolumeSource(path=mount.source, type=kind)))
        mounts.append(k8s.V1VolumeMount(name=name, mount_path=mount.target, read_only=mount.read_only))
    if spec.shm_size:
        volumes.append(k8s.V1Volume(name="shm", empty_dir=k8s.V1EmptyDirVolumeSource(
            medium="Memory", size_limit=memory_quantity(spec.shm_size))))
        mounts.append(k8s.V1VolumeMount(name="shm", mount_path="/dev/shm"))
    return volumes, mounts


def security_contexts(spec: StageSpec) -> tuple[Any, Any]:
    """``(pod, container)`` security contexts: the stage's non-root user, nothing privileged."""
    from kubernetes.client import models as k8s

    uid, _, gid = spec.user.partition(":")
    uid_n, gid_n = int(uid), int(gid or uid)
    if uid_n == 0:
        raise TfpipeConfigError("resources.user: the Kubernetes backend runs stages as non-root. "
                                "Fix: use a non-zero uid such as '1000:1000'.")
    pod = k8s.V1PodSecurityContext(run_as_user=uid_n, run_as_group=gid_n, fs_group=gid_n, run_as_non_root=True)
    container = k8s.V1SecurityContext(allow_privilege_escalation=False, privileged=False, run_as_non_root=True,
                                      capabilities=k8s.V1Capabilities(drop=["ALL"]))
    return pod, container


def tolerations(spec: StageSpec) -> list[Any]:
    """The spec's tolerations as ``V1Toleration``."""
    from kubernetes.client import models as k8s

    return [k8s.V1Toleration(**t) for t in spec.tolerations]


def prepare_container(spec: StageSpec, plan: TryPlan, volume_mounts: list[Any]) -> Any:
    """The init container that creates and hands over the directories the try writes: root (it must
    ``chown``) with only ``CHOWN``, ``DAC_OVERRIDE`` and ``FOWNER``, mounting only the writable volumes."""
    from kubernetes.client import models as k8s

    return k8s.V1Container(
        name="prepare-volumes", image=plan.config["run"]["image"], command=prepare_dirs_command(plan.writable_dirs, spec.user),
        volume_mounts=[m for m in volume_mounts if not m.read_only and m.name != "shm"],
        security_context=k8s.V1SecurityContext(
            run_as_user=0, run_as_non_root=False, allow_privilege_escalation=False, privileged=False,
            capabilities=k8s.V1Capabilities(drop=["ALL"], add=["CHOWN", "DAC_OVERRIDE", "FOWNER"])),
    )


def pod_exit(remote_pod: Any, container: str) -> tuple[int | None, bool]:
    """``(exit code, OOM-killed)`` of ``container`` in a pod's status; ``(None, False)`` if not terminated."""
    statuses = (remote_pod.status.container_statuses if remote_pod is not None and remote_pod.status else None) or []
    for status in statuses:
        if status.name == container and status.state and status.state.terminated:
            terminated = status.state.terminated
            return terminated.exit_code, terminated.reason == "OOMKilled"
    return None, False


class TfpipeStagePodOperator(KubernetesPodOperator):
    """Run one tfpipe stage as a pod, built from a :class:`~tfpipe.specs.StageSpec`.

    :param spec: the stage's spec.
    :param kubernetes: namespace, claims, connection (:class:`~tfpipe.config.KubernetesConfig`).
    :param kwargs: passed to ``BaseOperator`` (``task_id``, ``retries``, ``pool``, ...).
    """

    stage: ClassVar[str] = ""
    ui_color = "#d9e8fb"

    def __init__(self, *, spec: StageSpec, kubernetes: KubernetesConfig | None = None, **kwargs: Any) -> None:
        if not self.stage or spec.stage != self.stage:
            raise TfpipeConfigError(f"spec: a {spec.stage!r} spec needs the operator of stage {spec.stage!r}. "
                                    "Fix: take it from tfpipe.operators.kubernetes.POD_OPERATORS.")
        kube = KubernetesConfig.from_dict(kubernetes, where="kubernetes")
        volumes, volume_mounts = pod_volumes(spec, kube)
        pod_context, container_context = security_contexts(spec)
        gpu_limit(spec.gpus, "resources.gpus")  # refused at parse time, not when the pod starts
        if spec.private_environment:
            raise TfpipeConfigError(
                "resources.private_environment: the Kubernetes backend takes secrets from Kubernetes Secrets "
                "only (values in a DAG file would be rendered in the pod spec). Fix: store them in a Secret and "
                "name it in kubernetes.secret_env ({'VAR': 'secret-name:key'}).")
        from airflow.providers.cncf.kubernetes.secret import Secret

        secrets = [Secret("env", var, *ref.split(":", 1)) for var, ref in sorted(kube.secret_env.items())]
        self.spec = spec
        self.kube = kube
        super().__init__(
            image=spec.image,
            cmds=list(spec.command),
            namespace=kube.namespace,
            kubernetes_conn_id=kube.kubernetes_conn_id,
            in_cluster=kube.in_cluster,
            config_file=kube.config_file,
            service_account_name=kube.service_account_name,
            image_pull_policy=kube.image_pull_policy,
            env_vars=dict(spec.environment),
            secrets=secrets,
            volumes=volumes,
            volume_mounts=volume_mounts,
            node_selector=dict(spec.node_selector) or None,
            tolerations=tolerations(spec) or None,
            security_context=pod_context,
            container_security_context=container_context,
            container_resources=container_resources(spec, spec.gpus),
            labels={"tfpipe.stage": spec.stage},
            get_logs=True,
            do_xcom_push=False,
            reattach_on_restart=True,
            on_finish_action="delete_pod",
            termination_message_policy="FallbackToLogsOnError",
            **kwargs,
        )
        self._result: dict[str, Any] | None = None

    # -- one try --------------------------------------------------------------------------------

    def prepare_try(self, context: Any) -> TryPlan:
        """Set the pod's per-try parts from :func:`~tfpipe.tries.resolve_try`: config, GPUs,
        name, labels and the init container. :meth:`execute` calls it before building the pod."""
        # A spec without an image takes the deployment's (the Airflow Variable tfpipe_image).
        self.image = resolve_image(self.spec.image, task=self.task_id)
        try:
            plan = resolve_try(self.spec, context["ti"], context.get("params"), image=self.image)
            self.container_resources = container_resources(self.spec, plan.gpus)
        except (TfpipeConfigError, contract.ContractError) as err:
            raise AirflowFailException(f"{self.task_id}: invalid run parameters: {err}") from err
        self.env_vars = {**dict(self.spec.environment), contract.CONFIG_ENV: contract.dumps(plan.config)}
        self.name = pod_name(plan.name)
        self.labels = {"tfpipe.stage": self.spec.stage,
                       **{key: label_value(value) for key, value in plan.labels.items()}}
        self.annotations = {key: str(value) for key, value in plan.labels.items()}
        self.init_containers = ([prepare_container(self.spec, plan, self.volume_mounts)]
                                if self.kube.prepare_volumes else [])
        self.log.info("tfpipe %s: run dir %s, pod %s%s", self.stage, plan.run_dir, self.name,
                      f", {plan.gpus.describe()}" if plan.gpus else "")
        return plan

    def execute(self, context: Any) -> dict[str, Any] | None:
        reject_unknown_conf(context, self.task_id)
        self.prepare_try(context)
        self._result = None
        super().execute(context)
        return self._result

    def cleanup(self, pod: Any, remote_pod: Any, xcom_result: dict | None = None, context: Any = None) -> None:
        """Map the stage container's exit code through the contract, then let the pod go."""
        code, _ = pod_exit(remote_pod, self.base_container_name)
        logs = self._read_logs(pod) if code is not None else []
        try:
            super().cleanup(pod, remote_pod, xcom_result, context)
        except AirflowException:
            if not code:  # no exit code (the pod never ran), or 0 with a pod-level failure
                raise
        self.raise_for_pod_exit(remote_pod, logs, context)

    def raise_for_pod_exit(self, remote_pod: Any, logs: list[str], context: Any) -> None:
        """Raise what the stage container's exit code means (see :mod:`tfpipe.operators.exits`);
        on success keep the stage's JSON result for :meth:`execute` to return."""
        code, oom_killed = pod_exit(remote_pod, self.base_container_name)
        if code is None:
            return
        if code != 0:
            raise_for_exit(stage=self.stage, code=code, oom_killed=oom_killed, logs=logs, context=context,
                           downstream=lambda: list(self.get_direct_relative_ids(upstream=False)),
                           mem_limit=self.spec.mem_limit, log=self.log)
        self._result = contract.parse_result_line(logs)
        if self._result is None:
            raise AirflowException(f"{self.stage}: the pod exited 0 but its log has no result line "
                                   f"({contract.RESULT_PREFIX.strip()} ...); is the image a tfpipe trainer image?")

    def _read_logs(self, pod: Any) -> list[str]:
        try:
            stream = self.pod_manager.read_pod_logs(pod, self.base_container_name, tail_lines=LOG_LINES,
                                                    follow=False)
            return [line.decode("utf-8", "replace").rstrip("\n") if isinstance(line, bytes) else str(line)
                    for line in stream]
        except Exception as err:  # the pod may be gone: map the exit code without its log
            self.log.warning("could not read the log of %s: %s", getattr(pod.metadata, "name", "?"), err)
            return []


class PrepPodOperator(TfpipeStagePodOperator):
    """prep as a pod."""

    stage = "prep"


class ValidatePodOperator(TfpipeStagePodOperator):
    """validate (the data gate) as a pod; anomalies fail it without a retry."""

    stage = "validate"
    operator_extra_links = (RunReportLink(),)


class TrainPodOperator(TfpipeStagePodOperator):
    """train as a pod; a retried try resumes from the checkpoints on the work volume."""

    stage = "train"
    operator_extra_links = (RunReportLink(), TensorBoardLink())


class EvaluatePodOperator(TfpipeStagePodOperator):
    """evaluate as a pod; not blessed skips the downstream export."""

    stage = "evaluate"
    operator_extra_links = (RunReportLink(), TensorBoardLink())


class ExportPodOperator(TfpipeStagePodOperator):
    """export as a pod."""

    stage = "export"
    operator_extra_links = (RunReportLink(), TensorBoardLink())


POD_OPERATORS: dict[str, type[TfpipeStagePodOperator]] = {
    op.stage: op for op in (PrepPodOperator, ValidatePodOperator, TrainPodOperator, EvaluatePodOperator,
                            ExportPodOperator)
}
