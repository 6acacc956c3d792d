"""Backend-neutral stage specs and the pure builders behind them.

A :class:`StageSpec` says everything about one stage run: image, command, the stage config
template, mounts, GPUs, environment and isolation. It knows nothing about Docker's client or
Airflow's operators: :mod:`tfpipe.operators` turns a spec into a ``DockerOperator``, and a
Kubernetes backend could turn the same spec into a pod. Every function here is pure, so unit
tests call them directly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfpipe import contract
from tfpipe.config import (
    STAGE_NAMES,
    PipelineConfig,
    TrainingConfig,
    _fail,
    json_ready,
)
from tfpipe.exceptions import TfpipeConfigError

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
class GpuRequest:
    """GPUs for one container: a count (``-1`` = all) or explicit device ids."""

    count: int = 0
    device_ids: tuple[str, ...] = ()

    @classmethod
    def parse(cls, value: Any, *, field_name: str = "gpus") -> GpuRequest | None:
        """Parse ``None``, ``"all"``, a count, or a list of device ids; raise a config error otherwise."""
        if isinstance(value, str):
            value = value.strip()
            if "," in value:
                value = [v.strip() for v in value.split(",")]
        if value is None or value == 0 or value in ("", "none"):
            return None
        if value == "all":
            return cls(count=-1)
        if isinstance(value, bool):
            raise _fail(field_name, f"{value!r} is not a GPU spec", "use 'all', a count such as 2, or ['0', '1']")
        if isinstance(value, int):
            if value < 0:
                raise _fail(field_name, f"GPU count must be >= 1, got {value}", "use 'all', a count, or device ids")
            return cls(count=value)
        if isinstance(value, str) and value.isdigit():
            return cls(count=int(value))
        if isinstance(value, (list, tuple)) and value:
            ids = tuple(str(v) for v in value)
            if any(not v or not (v.isdigit() or v.startswith("GPU-") or v.startswith("MIG-")) for v in ids):
                raise _fail(field_name, f"device ids must be indexes or UUIDs, got {list(value)!r}",
                            "e.g. ['0', '1'] or ['GPU-8a3c...']")
            if isinstance(value[0], bool):
                raise _fail(field_name, f"{value!r} is not a GPU spec", "use 'all', a count, or device ids")
            return cls(device_ids=ids)
        raise _fail(field_name, f"{value!r} is not a GPU spec", "use None, 'all', a count such as 2, or ['0', '1']")

    def to_docker(self) -> list:
        """The docker-py ``DeviceRequest`` list (engine API >= 1.40)."""
        from docker.types import DeviceRequest

        if self.device_ids:
            return [DeviceRequest(device_ids=list(self.device_ids), capabilities=[["gpu"]])]
        return [DeviceRequest(count=self.count, capabilities=[["gpu"]])]

    def describe(self) -> str:
        """Human-readable form for logs."""
        if self.device_ids:
            return "GPUs " + ",".join(self.device_ids)
        return "all GPUs" if self.count == -1 else f"{self.count} GPU(s)"


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
    """Everything needed to run one stage, independent of the backend that runs it."""

    stage: str
    task_id: str
    image: str
    command: tuple[str, ...]
    config: Mapping[str, Any]
    mounts: tuple[MountSpec, ...]
    environment: Mapping[str, str]
    writable_dirs: tuple[str, ...]
    user: str
    shm_size: str | None
    mem_limit: str | None
    network_mode: str
    gpus: GpuRequest | None = None
    cpus: float | None = None
    gpu_fallback: str = "fail"
    upstream: tuple[str, ...] = ()
    retries: int = 1
    pool: str | None = None
    doc_md: str = ""
    outlets: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


STAGE_DOCS = {
    "prep": (
        "**prep** reads the raw data under the data volume (CSV or image folders), validates it, "
        "splits it by a hash of each example's key and writes sharded TFRecords, `schema.json`, "
        "`stats.json` and a fingerprint to `work/datasets/<fingerprint>/`. Unchanged data is a cache hit."
    ),
    "train": (
        "**train** streams the TFRecords through tf.data and trains the model, checkpointing every "
        "epoch and every N steps under `work/runs/<dag>/<run>/train/checkpoints`. A retried or cleared "
        "task resumes from the newest readable checkpoint; it never starts over."
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


def stage_command(stage: str) -> tuple[str, ...]:
    """The container command of a stage; the config travels in :data:`contract.CONFIG_ENV`."""
    if stage not in STAGE_NAMES:
        raise TfpipeConfigError(f"stage: unknown stage {stage!r}. Fix: use one of {', '.join(STAGE_NAMES)}.")
    return ("python3", "-m", "trainer", stage)


def config_template(cfg: PipelineConfig, stage: str) -> dict[str, Any]:
    """The stage config without run identity (added at execute time by :func:`resolve_stage_config`)."""
    return {
        "schema_version": contract.SCHEMA_VERSION,
        "stage": stage,
        "data": cfg.data.to_dict(),
        "training": cfg.training.to_dict(),
        "evaluation": cfg.evaluation.to_dict(),
        "export": cfg.export.to_dict(),
    }


def apply_overrides(template: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """Apply per-run training overrides (from Params / ``dag_run.conf``), validated like the config.

    Keys outside :attr:`TrainingConfig.TUNABLE` are ignored here (other Params, such as GPUs,
    are applied elsewhere); ``None`` values mean "keep the configured value".
    """
    resolved = json_ready(template)
    if not overrides:
        return resolved
    chosen = {k: v for k, v in overrides.items() if k in TrainingConfig.TUNABLE and v is not None}
    if chosen:
        merged = {**resolved["training"], **chosen}
        merged["model_kwargs"] = dict(merged.get("model_kwargs") or {})
        resolved["training"] = TrainingConfig.from_dict(merged).to_dict()
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
) -> dict[str, Any]:
    """The full stage config for one try: template + overrides + run identity + container paths.

    ``image_identity`` (``image_id``, ``image_repo_digest``: see :func:`image_identity`) is what
    the engine says the image is; the trainer records it in the exported model's metadata.
    """
    config = apply_overrides(template, overrides)
    config["run"] = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id,
                     "try_number": int(try_number), "image": image, **(image_identity or {})}
    config["paths"] = {
        "data": contract.CONTAINER_DATA,
        "work": contract.CONTAINER_WORK,
        "models": contract.CONTAINER_MODELS,
        "run_dir": contract.run_dir(dag_id, run_id),
    }
    return contract.validate_stage_config(config)


def image_identity(reference: str, inspected: Mapping[str, Any]) -> dict[str, Any]:
    """The image ID and registry digest of ``reference`` from the engine's ``inspect_image``.

    The repo digest is the one of the reference's own repository (an image pushed to several
    registries has several), or the reference itself when it is pinned by digest; None when the
    image never came from or went to a registry (a local build).
    """
    digests = list(inspected.get("RepoDigests") or [])
    repository = reference.split("@", 1)[0]
    last = repository.rsplit("/", 1)[-1]
    if ":" in last:
        repository = repository[: len(repository) - len(last)] + last.split(":", 1)[0]
    if "@" in reference and reference in digests:
        digest = reference
    else:
        digest = next((d for d in digests if d.split("@", 1)[0] == repository), None)
    return {"image_id": inspected.get("Id"), "image_repo_digest": digest}


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
    """Container directories a stage writes, which must exist and belong to the stage's user."""
    model_name = (cfg_or_template.export.model_name if isinstance(cfg_or_template, PipelineConfig)
                  else cfg_or_template["export"]["model_name"])
    work, models = contract.CONTAINER_WORK, contract.CONTAINER_MODELS
    dirs = [f"{work}/cache", f"{work}/cache/cuda", run_dir]
    if stage == "prep":
        dirs.append(f"{work}/datasets")
    if stage == "export":
        dirs.append(f"{models}/{model_name}")
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


def volume_mounts(cfg: PipelineConfig) -> tuple[MountSpec, ...]:
    """Data read-only, work and models read-write."""
    return (
        MountSpec(cfg.volumes.data, contract.CONTAINER_DATA, True),
        MountSpec(cfg.volumes.work, contract.CONTAINER_WORK, False),
        MountSpec(cfg.volumes.models, contract.CONTAINER_MODELS, False),
    )


def plan_pipeline(cfg: PipelineConfig) -> list[StageSpec]:
    """The pipeline as plain specs, in order: prep -> train -> evaluate -> export."""
    gpus = GpuRequest.parse(cfg.resources.gpus, field_name="resources.gpus")
    mounts = volume_mounts(cfg)
    specs = []
    previous: tuple[str, ...] = ()
    for stage in STAGE_NAMES:
        specs.append(
            StageSpec(
                stage=stage,
                task_id=stage,
                image=cfg.image.ref,
                command=stage_command(stage),
                config=config_template(cfg, stage),
                mounts=mounts,
                environment=stage_environment(cfg.resources),
                writable_dirs=(),  # depends on the run: computed at execute time
                user=cfg.resources.user,
                shm_size=cfg.resources.shm_size,
                mem_limit=cfg.resources.mem_limit,
                network_mode=cfg.resources.network_mode,
                gpus=gpus if stage in cfg.resources.gpu_stages else None,
                gpu_fallback=cfg.resources.gpu_fallback,
                cpus=cfg.resources.cpus,
                upstream=previous,
                retries=cfg.retries if stage == "train" else 1,
                pool=cfg.gpu_pool if stage == "train" else None,
                doc_md=STAGE_DOCS[stage],
                outlets=(cfg.model_asset_uri,) if stage == "export" else (),
            )
        )
        previous = (stage,)
    return specs
