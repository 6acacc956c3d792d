"""Claims of the docs' "Data at scale", "GPUs" and "Retention" that need no engine: the CUDA JIT cache's bound
on every stage container, and the upper bound of ``data.shards``."""

from __future__ import annotations

import copy

import pytest

from tests.provider.test_kubernetes import SETTINGS as KUBE_SETTINGS
from tests.provider.test_kubernetes import _pod, _stage_container
from tfpipe import contract
from tfpipe.config import PipelineConfig
from tfpipe.dag_factory import training_pipeline
from tfpipe.exceptions import TfpipeConfigError

BASE = {"dag_id": "cuda_cache_and_shards", "image": {"ref": "tfpipe/trainer:0.1.0"},
        "volumes": {"data": "/srv/d", "work": "/srv/w", "models": "/srv/m"}, "data": {"path": "x.csv"}}

#: the docs, GPUs (the CUDA cache): "every stage container gets CUDA_CACHE_MAXSIZE=4294967296 (4 GiB, the
#: driver's maximum)", the cache living in ``work/cache/cuda``.
CUDA_MAXSIZE = str(4 * 2**30)


def _stage_environments(dag) -> dict[str, dict[str, str]]:
    """What each stage task of a Docker-backend DAG hands the engine as the container's environment
    (a mapped ``prep_shard`` carries its spec in its partial arguments)."""
    envs = {}
    for task_id in dag.task_ids:
        task = dag.get_task(task_id)
        spec = getattr(task, "partial_kwargs", {}).get("spec")
        if spec is not None:
            envs[task_id] = dict(spec.environment)
        elif getattr(task, "environment", None) is not None:
            envs[task_id] = dict(task.environment)
    return envs


@pytest.mark.parametrize("shards", [1, 3])
def test_every_docker_stage_container_gets_the_4_gib_cuda_cache_on_the_work_volume(shards):
    dag = training_pipeline(PipelineConfig.from_dict({**BASE, "data": {"path": "x.csv", "shards": shards}}))
    envs = _stage_environments(dag)
    stages = ["prep_shard", "prep_merge"] if shards > 1 else ["prep"]
    assert sorted(envs) == sorted(stages + ["validate", "train", "evaluate", "export"]), sorted(envs)
    for stage, env in envs.items():
        assert env["CUDA_CACHE_MAXSIZE"] == CUDA_MAXSIZE, (stage, env.get("CUDA_CACHE_MAXSIZE"))
        assert env["CUDA_CACHE_PATH"] == f"{contract.CONTAINER_WORK}/cache/cuda", stage
    # /work is the work volume, read-write, so the cache is work/cache/cuda on the engine's host
    train = dag.get_task("train")
    work = [m for m in train.spec.mounts if m.target == contract.CONTAINER_WORK]
    assert len(work) == 1 and work[0].source == "/srv/w" and not work[0].read_only


def test_every_kubernetes_stage_pod_gets_the_4_gib_cuda_cache():
    dag = training_pipeline(PipelineConfig.from_dict(copy.deepcopy(KUBE_SETTINGS)))
    for stage in contract.STAGES:
        env = {e["name"]: e.get("value") for e in _stage_container(_pod(dag, stage))["env"]}
        assert env["CUDA_CACHE_MAXSIZE"] == CUDA_MAXSIZE, (stage, env.get("CUDA_CACHE_MAXSIZE"))
        assert env["CUDA_CACHE_PATH"] == f"{contract.CONTAINER_WORK}/cache/cuda", stage


def test_data_shards_up_to_1024_are_taken_and_1025_is_refused_naming_the_field():
    """The docs, Data at scale: "What is refused when the DAG is parsed, naming `data.shards` and the
    fix: a value below 1 or above 1024"."""
    dag = training_pipeline(PipelineConfig.from_dict({**BASE, "data": {"path": "x.csv", "shards": 1024}}))
    assert "prep_shard" in dag.task_ids and "prep_merge" in dag.task_ids
    with pytest.raises(TfpipeConfigError, match=r"data\.shards") as err:
        training_pipeline(PipelineConfig.from_dict({**BASE, "data": {"path": "x.csv", "shards": 1025}}))
    assert "Fix:" in str(err.value) and "1024" in str(err.value), str(err.value)
