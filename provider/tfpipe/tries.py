"""One try of a stage, resolved when its task runs: the config with the run's identity and
overrides, its GPUs, container name, labels and the directories it writes (:func:`resolve_try`).

Pure, as :mod:`tfpipe.specs` is, and apart from it because a DAG file's parse never resolves a
try: only running tasks, the shell tooling and the bench import this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tfpipe import contract
from tfpipe.config import GpuRequest, TfpipeConfigError
from tfpipe.specs import StageSpec, container_labels, container_name, resolve_stage_config, writable_dirs


@dataclass(frozen=True)
class TryPlan:
    """What one try of a stage runs with, on any backend (see :func:`resolve_try`).

    :param config: the full stage config (run identity, container paths, the run's overrides).
    :param gpus: the GPUs of this try (the run's ``gpus`` Param wins on a GPU stage).
    :param name: the container name, the same for every try of a task (a leftover is findable).
    :param labels: the ``tfpipe.*`` identity labels.
    :param writable_dirs: container directories that must exist and belong to the stage's user.
    """

    config: Mapping[str, Any]
    gpus: GpuRequest | None
    name: str
    labels: Mapping[str, str]
    writable_dirs: tuple[str, ...]

    @property
    def run_dir(self) -> str:
        """The run directory in the container."""
        return self.config["paths"]["run_dir"]


def resolve_try(spec: StageSpec, ti: Any, params: Mapping[str, Any] | None = None, *,
                image: str | None = None, shard_index: int | None = None) -> TryPlan:
    """Resolve one try of ``spec``: config, GPUs, name, labels and the directories it writes.

    ``ti``: a task instance or a :class:`TryIdentity`; ``params``: the run's params (DAG defaults updated
    with ``dag_run.conf``); ``image`` replaces the spec's; ``shard_index``: the slice a ``prep_shard`` try
    prepares (:data:`contract.SHARD_INDEX_KEY`), refused for other stages. Bad run parameters raise
    :class:`~tfpipe.exceptions.TfpipeConfigError`.
    """
    params = dict(params or {})
    map_index = getattr(ti, "map_index", -1)
    map_index = -1 if map_index is None else map_index
    windowed = bool(spec.config["data"].get("window_days"))
    config = resolve_stage_config(
        {**spec.config, "stage": spec.stage}, dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
        try_number=ti.try_number, image=image or spec.image, overrides=params,
        data_interval_end=window_end(ti) if windowed else None)
    if spec.stage == "prep_shard" or shard_index is not None:
        config[contract.SHARD_INDEX_KEY] = check_shard_index(spec, shard_index)
    gpus = spec.gpus
    if spec.gpu_param and params.get("gpus") not in (None, ""):
        gpus = GpuRequest.parse(params["gpus"], field_name="params.gpus")
    return TryPlan(
        config=config, gpus=gpus, name=container_name(ti.dag_id, ti.run_id, ti.task_id, map_index),
        labels=container_labels(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                                try_number=ti.try_number, stage=spec.stage, map_index=map_index),
        writable_dirs=writable_dirs(spec.stage, config, config["paths"]["run_dir"]),
    )


def window_end(ti: Any) -> str | None:
    """Where a date window of ``ti``'s run ends (ISO 8601, UTC): the run's data interval end, else (a
    manual run without a logical date) when it was triggered (``run_after``); None when ``ti`` knows neither.
    """
    end = getattr(ti, "data_interval_end", None)
    if end is None and callable(getattr(ti, "get_template_context", None)):
        context = ti.get_template_context()
        end = context.get("data_interval_end") or getattr(context.get("dag_run"), "run_after", None)
    return utc_iso(end)


def utc_iso(moment: Any) -> str | None:
    """A datetime (naive: UTC) or an ISO 8601 text as ISO 8601 in UTC; None stays None."""
    if moment is None:
        return None
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat()


def check_shard_index(spec: StageSpec, shard_index: Any) -> int:
    """``shard_index`` when it names a slice of ``spec``'s ``data.shards``; a config error otherwise."""
    count = spec.config["data"].get("shards", 1)
    if spec.stage != "prep_shard":
        raise TfpipeConfigError(f"shard_index: only a prep_shard task prepares a slice, this is {spec.stage!r}. "
                                "Fix: leave shard_index out.")
    if not isinstance(shard_index, int) or isinstance(shard_index, bool) or not 0 <= shard_index < count:
        raise TfpipeConfigError(f"shard_index: must be a slice index in 0..{count - 1} (data.shards is {count}), "
                                f"got {shard_index!r}. Fix: map the prep_shard task over range(data.shards).")
    return shard_index


@dataclass(frozen=True)
class TryIdentity:
    """The identity of one try, where no task instance exists (shell tooling, the bench)."""

    dag_id: str
    run_id: str
    task_id: str
    try_number: int = 1
    map_index: int = -1
    #: where a date window ends (:func:`window_end`): a datetime or ISO 8601 text, or None
    data_interval_end: Any = None


def image_identity(reference: str, inspected: Mapping[str, Any]) -> dict[str, Any]:
    """The image ID and registry digest of ``reference`` from the engine's ``inspect_image``.

    The repo digest is the one of the reference's own repository (an image pushed to several
    registries has several), or the reference itself when it is pinned by digest; None when the
    image never came from or went to a registry (a local build).
    """
    from docker.utils import parse_repository_tag

    digests = list(inspected.get("RepoDigests") or [])
    repository, _tag = parse_repository_tag(reference.split("@", 1)[0])
    if "@" in reference and reference in digests:
        digest = reference
    else:
        digest = next((d for d in digests if d.split("@", 1)[0] == repository), None)
    return {"image_id": inspected.get("Id"), "image_repo_digest": digest}
