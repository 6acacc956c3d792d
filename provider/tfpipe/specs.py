"""Backend-neutral stage specs and the pure builders behind them.

A :class:`StageSpec` says everything about one stage run: image, command, the stage config
template, mounts, GPUs, environment and isolation. It knows nothing about Docker's client or
Airflow's operators: :mod:`tfpipe.operators.docker` turns a spec into a ``DockerOperator``, and a
Kubernetes backend could turn the same spec into a pod. Every function here is pure, so unit
tests call them directly. What one try of a spec runs with, resolved when the task runs, is
:mod:`tfpipe.tries`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any

from tfpipe import contract
from tfpipe.config import (
    STAGE_SECTIONS,
    GpuRequest,
    PipelineConfig,
    ResourcesConfig,
    TfpipeConfigError,
    VolumesConfig,
    check_image_ref,
    json_ready,
)
from dataclasses import dataclass

#: Environment every stage container gets (GPU-safe TensorFlow defaults).
#: Memory growth stops TF from grabbing all GPU memory at start; the CUDA cache on the work
#: volume keeps the PTX JIT (minutes on Ampere/Hopper for TF 2.9's sm_35..sm_75 builds) from
#: being paid again on every run.
TF_DEFAULT_ENV = {
    "TF_FORCE_GPU_ALLOW_GROWTH": "true",
    "CUDA_CACHE_PATH": f"{contract.CONTAINER_WORK}/cache/cuda",
    "CUDA_CACHE_MAXSIZE": "4294967296",
    "TF_CPP_MIN_LOG_LEVEL": "1",
    "PYTHONUNBUFFERED": "1",
}

LABEL_PREFIX = "tfpipe."


def stage_environment(resources: Any) -> dict[str, str]:
    """The environment of a stage container: TF defaults, the time zone, the allocator, then
    the user's ``resources.environment`` (which wins).

    The image preloads jemalloc (``LD_PRELOAD`` in its config); an empty ``LD_PRELOAD`` turns it
    off. ``TZ`` needs the image's time zone database (tzdata is in both roots).
    """
    env = {**TF_DEFAULT_ENV, "TZ": resources.timezone}
    if not resources.jemalloc:
        env["LD_PRELOAD"] = ""
    return {**env, **resources.environment}


@dataclass(frozen=True)
class MountSpec:
    """A bind mount: ``source`` on the engine's host, ``target`` in the container."""

    source: str
    target: str
    read_only: bool

    def to_docker(self):
        """The docker-py ``Mount``."""
        from docker.types import Mount

        return Mount(target=self.target, source=self.source, type="bind", read_only=self.read_only)


@dataclass(frozen=True)
class StageSpec:
    """Everything needed to run one stage, independent of the backend that runs it.

    A backend builds its operator from a spec alone (:mod:`tfpipe.operators.docker`,
    :mod:`tfpipe.operators.kubernetes`); what changes per try (the run identity in the config,
    the GPUs a run asks for, names, labels) comes from :func:`resolve_try`.

    :param stage: ``prep``, ``train``, ``evaluate`` or ``export``.
    :param task_id: the Airflow task id.
    :param image: the trainer image, pinned; ``None`` = the Airflow Variable ``tfpipe_image``, read
        when the task runs (:func:`tfpipe.settings.resolve_image`).
    :param command: the container command (the config travels in :data:`contract.CONFIG_ENV`).
    :param config: the stage config template (no run identity yet).
    :param mounts: data (read-only), work and models.
    :param environment: environment variables of the container (no secrets).
    :param user: ``uid:gid`` the stage runs as.
    :param shm_size: ``/dev/shm`` size (``"1g"``).
    :param mem_limit: memory limit (``"8g"``), or ``None``.
    :param network_mode: Docker network (``"none"``: no network); Kubernetes ignores it.
    :param gpus: the GPUs of this stage, or ``None``.
    :param gpu_fallback: ``"fail"`` or ``"cpu"`` when the backend has no GPUs.
    :param gpu_param: whether a run's ``gpus`` Param applies to this stage.
    :param private_environment: secrets for the container; never rendered, logged or in XCom.
    :param cpus: CPU limit (Docker ``--cpus``), or ``None``.
    :param node_selector: Kubernetes node labels the pod must match.
    :param tolerations: Kubernetes tolerations (mappings as in a pod spec).
    :param upstream: task ids this stage runs after.
    :param retries: retries of the task.
    :param retry_delay_seconds: first retry delay (doubles for the training task).
    :param pool: the Airflow pool, or ``None`` for the default.
    :param doc_md: the task's documentation.
    :param outlets: asset URIs the task emits.
    """

    stage: str
    task_id: str
    image: str | None
    command: tuple[str, ...]
    config: Mapping[str, Any]
    mounts: tuple[MountSpec, ...]
    environment: Mapping[str, str]
    user: str
    shm_size: str | None
    mem_limit: str | None
    network_mode: str
    gpus: GpuRequest | None = None
    gpu_fallback: str = "fail"
    gpu_param: bool = False
    private_environment: Mapping[str, str] = field(default_factory=dict, repr=False)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    cpus: float | None = None
    upstream: tuple[str, ...] = ()
    retries: int = 1
    retry_delay_seconds: float = 30.0
    pool: str | None = None
    doc_md: str = ""
    outlets: tuple[str, ...] = ()

    @property
    def volumes(self) -> VolumesConfig:
        """The three volumes as host paths (from the mounts)."""
        by_target = {m.target: m.source for m in self.mounts}
        return VolumesConfig(data=by_target[contract.CONTAINER_DATA], work=by_target[contract.CONTAINER_WORK],
                             models=by_target[contract.CONTAINER_MODELS])


STAGE_DOCS = {
    "prep": (
        "**prep** reads the raw data under the data volume (CSV or image folders), validates it, "
        "splits it by a hash of each example's key and writes sharded TFRecords, `schema.json`, "
        "`stats.json` and a fingerprint to `work/datasets/<fingerprint>/`. Unchanged data is a cache hit."
    ),
    "prep_shard": (
        "**prep_shard** is prep for one slice of the input files (`data.shards` > 1): mapped task k reads the "
        "k-th contiguous slice of the sorted table files (CSV or Parquet), validates, splits and encodes it, and "
        "commits its part under `work/runs/<dag>/<run>/prep_shards/` on its own, so a retry redoes only its "
        "slice. Unchanged data is a cache hit: no shard parses anything."
    ),
    "prep_merge": (
        "**prep_merge** makes the one data set of sharded prep from the shards' parts: the same records, split, "
        "`schema.json`, `stats.json` and fingerprint under `work/datasets/<fingerprint>/` as a single prep task "
        "writes for the same input, then removes the parts."
    ),
    "validate": (
        "**validate** is the data gate: it compares the prepared data set with the one the production model (the "
        "newest blessed version) trained on: columns gone, new or retyped, missing values, numeric and text "
        "drift, label shift and row count. An anomaly stops the run here (`validation.on_anomaly: fail`), before "
        "any GPU time, and the production model stays; the findings are in the log, `validation.json` and the run "
        "report. Trigger with `accept_data_change` to let a real change through."
    ),
    "train": (
        "**train** streams the TFRecords through tf.data and trains the model, checkpointing every "
        "epoch and every N steps under `work/runs/<dag>/<run>/train/checkpoints`. A retried or cleared "
        "task resumes from the newest readable checkpoint; it never starts over."
    ),
    "select": (
        "**select** picks the sweep's best trial by `tuning.metric` at its final weights, among the trials that "
        "finished, and makes its training output the run's: evaluate, export and the report then read that "
        "trial. `selection.json` and the run report list every trial's settings, metric, epochs and time."
    ),
    "evaluate": (
        "**evaluate** computes loss, accuracy, per-class precision/recall and the confusion matrix on "
        "the held-out split, then applies the blessing gate (threshold, and no worse than the current "
        "production model by more than the tolerance). Not blessed: export is skipped."
    ),
    "export": (
        "**export** writes a SavedModel whose serving signature takes raw features to "
        "`models/<name>/<version>/` (temp dir, then atomic rename), reloads and checks it, and writes "
        "`metadata.json` with lineage and every training attempt."
    ),
}


SWEEP_TRAIN_DOC = (
    " In a sweep, train is one mapped task per trial (`tuning.parallel` at once), each with the trial's settings "
    "and its own checkpoints under `work/runs/<dag>/<run>/trials/trial-<k>/`: a killed trial is retried and "
    "resumes alone."
)


def stage_command(stage: str) -> tuple[str, ...]:
    """The container command of a stage; the config travels in :data:`contract.CONFIG_ENV`."""
    if stage not in contract.RUNNABLE_STAGES:
        raise TfpipeConfigError(f"stage: unknown stage {stage!r}. "
                                f"Fix: use one of {', '.join(contract.RUNNABLE_STAGES)}.")
    return ("python3", "-m", "trainer", stage)


def config_template(cfg: PipelineConfig, stage: str, *, with_trials: bool = False) -> dict[str, Any]:
    """The stage config without run identity (added at execute time by :func:`resolve_stage_config`);
    ``with_trials``: with every trial of the sweep (what ``select`` chooses from)."""
    template = {
        "schema_version": contract.SCHEMA_VERSION,
        "stage": stage,
        **{name: getattr(cfg, name).to_dict() for name in contract.SECTIONS},
    }
    if with_trials:
        template[contract.TRIALS_KEY] = cfg.tuning.trial_plan()
    return template


def apply_overrides(template: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Apply per-run overrides (from Params / ``dag_run.conf``), validated like the config.

    Only the fields the contract marks ``override`` are taken (:func:`tfpipe.contract.overridable`);
    other keys are ignored here (other Params, such as GPUs, are applied elsewhere); ``None``
    values mean "keep the configured value".
    """
    resolved = json_ready(template)
    if not overrides:
        return resolved
    sections = contract.overridable()
    chosen: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        if key in sections and value is not None:
            chosen.setdefault(sections[key], {})[key] = value
    for section, values in chosen.items():
        merged = {**resolved[section], **values}
        if section == "training":
            merged["model_kwargs"] = dict(merged.get("model_kwargs") or {})
        resolved[section] = STAGE_SECTIONS[section].from_dict(merged).to_dict()
    return resolved


def resolve_stage_config(
    template: Mapping[str, Any],
    *,
    dag_id: str,
    run_id: str,
    task_id: str,
    try_number: int,
    image: str,
    overrides: Mapping[str, Any] | None = None,
    image_identity: Mapping[str, Any] | None = None,
    data_interval_end: str | None = None,
) -> dict[str, Any]:
    """The full stage config for one try: template + overrides + run identity + container paths.

    ``image_identity`` (``image_id``, ``image_repo_digest``: see :func:`image_identity`) is what
    the engine says the image is; the trainer records it in the exported model's metadata.
    ``data_interval_end`` (ISO 8601, UTC) is where a date window (``data.window_days``) ends.
    """
    config = apply_overrides(template, overrides)
    config["run"] = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id,
                     "try_number": int(try_number), "image": image, **(image_identity or {})}
    if data_interval_end is not None:
        config["run"][contract.WINDOW_END_KEY] = data_interval_end
    config["paths"] = {
        "data": contract.CONTAINER_DATA,
        "work": contract.CONTAINER_WORK,
        "models": contract.CONTAINER_MODELS,
        "run_dir": contract.run_dir(dag_id, run_id),
    }
    return contract.validate_stage_config(config)


def stage_spec(
    stage: str,
    *,
    task_id: str,
    image: str | None,
    stage_config: Mapping[str, Any],
    volumes: VolumesConfig | Mapping[str, str],
    gpus: Any = None,
    gpu_fallback: str = "fail",
    gpu_param: bool | None = None,
    allow_floating_tag: bool = False,
    user: str = "1000:1000",
    shm_size: str | None = "1g",
    mem_limit: str | None = None,
    network_mode: str = "bridge",
    environment: Mapping[str, str] | None = None,
    private_environment: Mapping[str, str] | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Any = (),
    cpus: float | None = None,
    timezone: str = "UTC",
    jemalloc: bool = True,
) -> StageSpec:
    """The spec of one stage from plain arguments, validated as a pipeline config is.

    For operators used on their own (``TrainOperator(image=..., stage_config=..., volumes=...)``);
    :func:`plan_pipeline` builds the specs of a whole pipeline.
    """
    if image is not None:  # None: the Airflow Variable tfpipe_image, read when the task runs
        check_image_ref("image", image, allow_floating_tag=allow_floating_tag)
    volumes = VolumesConfig.from_dict(volumes, where="volumes")
    resources = ResourcesConfig(gpus=gpus, gpu_fallback=gpu_fallback, user=user, shm_size=shm_size or "64m",
                                mem_limit=mem_limit, network_mode=network_mode,
                                environment=dict(environment or {}), private_environment=dict(private_environment or {}),
                                node_selector=dict(node_selector or {}), tolerations=tolerations,
                                cpus=cpus, timezone=timezone, jemalloc=jemalloc)
    if not isinstance(stage_config, Mapping) or "data" not in stage_config or "export" not in stage_config:
        raise TfpipeConfigError(
            "stage_config: must be a stage config template with data, training, evaluation and export "
            "sections. Fix: build it with tfpipe.specs.config_template(pipeline_config, stage)."
        )
    return StageSpec(
        stage=stage, task_id=task_id, image=image, command=stage_command(stage),
        config={**stage_config, "stage": stage}, mounts=volume_mounts(volumes),
        environment=stage_environment(resources), user=resources.user, shm_size=shm_size,
        mem_limit=mem_limit, network_mode=network_mode, gpus=GpuRequest.parse(gpus),
        gpu_fallback=resources.gpu_fallback,
        gpu_param=stage in resources.gpu_stages if gpu_param is None else bool(gpu_param),
        private_environment=dict(resources.private_environment), node_selector=dict(resources.node_selector),
        tolerations=resources.tolerations, cpus=resources.cpus,
    )


def pipeline_stages(cfg: PipelineConfig) -> tuple[str, ...]:
    """The stages of ``cfg``'s pipeline in order: prep is ``prep_shard`` + ``prep_merge`` when
    ``data.shards`` is above 1, and ``select`` follows train in a sweep."""
    stages = contract.STAGES
    if cfg.data.shards > 1:
        stages = contract.SHARDED_PREP_STAGES + stages[1:]
    if cfg.tuning.enabled:
        at = stages.index("train") + 1
        stages = stages[:at] + (contract.SELECT_STAGE,) + stages[at:]
    return stages


def container_name(dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> str:
    """A deterministic container name per (dag, run, task): every try reuses it.

    Reusing the name is what makes a leftover container of an earlier try findable (and
    removable) before the next try starts; the hash keeps it unique and within Docker's limits.
    """
    digest = hashlib.sha1(f"{dag_id}\0{run_id}\0{task_id}\0{map_index}".encode()).hexdigest()[:12]
    return f"tfpipe-{contract.safe_name(dag_id, 40)}-{contract.safe_name(task_id, 40)}-{digest}"


def container_labels(*, dag_id: str, run_id: str, task_id: str, try_number: int, stage: str,
                     map_index: int = -1) -> dict[str, str]:
    """The labels every stage container carries, so tools can find it by run and task."""
    return {
        f"{LABEL_PREFIX}dag_id": dag_id,
        f"{LABEL_PREFIX}run_id": run_id,
        f"{LABEL_PREFIX}task_id": task_id,
        f"{LABEL_PREFIX}map_index": str(map_index),
        f"{LABEL_PREFIX}try_number": str(try_number),
        f"{LABEL_PREFIX}stage": stage,
    }


def writable_dirs(stage: str, cfg_or_template: Mapping[str, Any] | PipelineConfig, run_dir: str) -> tuple[str, ...]:
    """Container directories a stage writes, which must exist and be writable by the stage's user
    (:func:`tfpipe.contract.writable_dirs` for this pipeline's model)."""
    model_name = (cfg_or_template.export.model_name if isinstance(cfg_or_template, PipelineConfig)
                  else cfg_or_template["export"]["model_name"])
    return contract.writable_dirs(stage, run_dir, model_name)


def run_writable_dirs(config: Mapping[str, Any], run_dir: str) -> tuple[str, ...]:
    """Every directory any stage of a run writes (:func:`writable_dirs` of each stage, in order, once):
    what the first stage of a run prepares, so that the later ones find them ready."""
    dirs: dict[str, None] = {}
    for stage in contract.STAGES:
        dirs.update(dict.fromkeys(writable_dirs(stage, config, run_dir)))
    return tuple(dirs)


def prepare_dirs_command(dirs: Sequence[str], user: str) -> list[str]:
    """A shell command, run as root in a short container on the engine, that creates ``dirs``
    and hands them to ``user``.

    The engine may be on another host than the Airflow worker, so the worker never touches the
    mount sources itself. Only the listed directories are chowned, never a whole tree.
    """
    uid, _, gid = user.partition(":")
    owner = f"{uid}:{gid or uid}"
    script = (
        'set -e; for d in "$@"; do mkdir -p "$d"; '
        f'if [ "$(stat -c %u:%g "$d")" != "{owner}" ]; then chown {owner} "$d"; fi; done'
    )
    return ["sh", "-c", script, "tfpipe-prepare", *dirs]


def volume_mounts(volumes: VolumesConfig) -> tuple[MountSpec, ...]:
    """Data read-only, work and models read-write."""
    return (
        MountSpec(volumes.data, contract.CONTAINER_DATA, True),
        MountSpec(volumes.work, contract.CONTAINER_WORK, False),
        MountSpec(volumes.models, contract.CONTAINER_MODELS, False),
    )


def plan_pipeline(cfg: PipelineConfig) -> list[StageSpec]:
    """The pipeline as plain specs, in order: prep -> validate -> train -> evaluate -> export (prep is
    prep_shard -> prep_merge with ``data.shards`` > 1: :func:`pipeline_stages`)."""
    gpus = GpuRequest.parse(cfg.resources.gpus, field_name="resources.gpus")
    mounts = volume_mounts(cfg.volumes)
    resources = cfg.resources
    specs = []
    previous: tuple[str, ...] = ()
    for stage in pipeline_stages(cfg):
        specs.append(
            StageSpec(
                stage=stage,
                task_id=stage,
                image=cfg.image.ref,
                command=stage_command(stage),
                config=config_template(cfg, stage, with_trials=stage == contract.SELECT_STAGE),
                mounts=mounts,
                environment=stage_environment(resources),
                user=resources.user,
                shm_size=resources.shm_size,
                mem_limit=resources.mem_limit,
                network_mode=resources.network_mode,
                gpus=gpus if stage in resources.gpu_stages else None,
                gpu_fallback=resources.gpu_fallback,
                gpu_param=stage in resources.gpu_stages,
                private_environment=dict(resources.private_environment),
                node_selector=dict(resources.node_selector),
                tolerations=resources.tolerations,
                cpus=resources.cpus,
                upstream=previous,
                retries=cfg.retries if stage == "train" else 1,
                retry_delay_seconds=cfg.retry_delay_seconds,
                pool=cfg.gpu_pool if stage == "train" else None,
                doc_md=STAGE_DOCS[stage] + (SWEEP_TRAIN_DOC if stage == "train" and cfg.tuning.enabled else ""),
                outlets=(cfg.model_asset_uri,) if stage == "export" else (),
            )
        )
        previous = (stage,)
    return specs
