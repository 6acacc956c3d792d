"""Sharded prep on the Airflow side: ``data.shards`` validation, the mapped DAG shape, the shard's config."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from tfpipe import contract
from tfpipe.config import PipelineConfig
from tfpipe.dag_factory import training_pipeline
from tfpipe.exceptions import TfpipeConfigError
from tfpipe.specs import plan_pipeline, resolve_try, writable_dirs

from .test_config import GOOD


def _cfg(shards: int, **overrides) -> PipelineConfig:
    mapping = copy.deepcopy(GOOD)
    mapping["data"]["shards"] = shards
    return PipelineConfig.from_dict({**mapping, **overrides})


def test_one_shard_is_todays_single_prep_task():
    dag = training_pipeline(_cfg(1))
    assert "prep" in dag.task_ids and "prep_shard" not in dag.task_ids and "prep_merge" not in dag.task_ids
    assert [s.stage for s in plan_pipeline(_cfg(1))] == list(contract.STAGES)


def test_shards_make_a_mapped_prep_then_a_merge_before_training():
    cfg = _cfg(4)
    specs = plan_pipeline(cfg)
    assert [(s.stage, s.upstream) for s in specs] == [
        ("prep_shard", ()), ("prep_merge", ("prep_shard",)), ("train", ("prep_merge",)),
        ("evaluate", ("train",)), ("export", ("evaluate",))]
    assert [s.command[-1] for s in specs[:2]] == ["prep_shard", "prep_merge"]
    assert writable_dirs("prep_merge", cfg, "/work/runs/x/y")[-1] == "/work/datasets"

    dag = training_pipeline(cfg)
    assert "prep" not in dag.task_ids
    shard, merge, train = (dag.get_task(t) for t in ("prep_shard", "prep_merge", "train"))
    assert type(shard).__name__ == "MappedOperator"
    assert shard.expand_input.value == {"shard_index": [0, 1, 2, 3]}
    assert shard.partial_kwargs["spec"].stage == "prep_shard"
    assert shard.partial_kwargs["retries"] == 1, "a failed shard is retried on its own"
    assert merge.upstream_task_ids == {"prep_shard"} and train.upstream_task_ids == {"prep_merge"}
    assert shard.upstream_task_ids == set(), "a pipeline without a bucket has no stage-in"
    # With a bucket, Cloud Storage stage-in comes before the shards; its skip must not skip them
    dag = training_pipeline(_cfg(4, gcs_tasks=True))
    shard, stage_in = dag.get_task("prep_shard"), dag.get_task("stage_in")
    assert shard.upstream_task_ids == {"stage_in"} and stage_in.downstream_task_ids == {"prep_shard"}
    assert shard.trigger_rule == "none_failed"


def test_a_shard_try_carries_its_slice_index():
    spec = plan_pipeline(_cfg(3))[0]
    ti = SimpleNamespace(dag_id="digits", run_id="manual__1", task_id="prep_shard", try_number=2, map_index=2)
    plan = resolve_try(spec, ti, {}, shard_index=2)
    assert plan.config[contract.SHARD_INDEX_KEY] == 2 and plan.config["data"]["shards"] == 3
    assert plan.config["stage"] == "prep_shard" and plan.labels["tfpipe.map_index"] == "2"
    other = resolve_try(spec, SimpleNamespace(**{**vars(ti), "map_index": 0}), {}, shard_index=0)
    assert other.name != plan.name, "each mapped instance has its own container"
    for bad in (None, 3, -1, True):
        with pytest.raises(TfpipeConfigError, match=r"shard_index: must be a slice index in 0..2.*Fix:"):
            resolve_try(spec, ti, {}, shard_index=bad)
    merge = plan_pipeline(_cfg(3))[1]
    assert contract.SHARD_INDEX_KEY not in resolve_try(merge, ti, {}).config
    with pytest.raises(TfpipeConfigError, match="shard_index: only a prep_shard task"):
        resolve_try(merge, ti, {}, shard_index=1)


@pytest.mark.parametrize("change, words", [
    ({"data": {**GOOD["data"], "shards": 0}}, ["data.shards", ">= 1", "Fix:"]),
    ({"data": {**GOOD["data"], "shards": "4"}}, ["data.shards", "Fix:"]),
    ({"data": {**GOOD["data"], "shards": 2.5}}, ["data.shards", "Fix:"]),
    ({"data": {**GOOD["data"], "shards": 5000}}, ["data.shards", "plausible", "Fix:"]),
    ({"data": {**GOOD["data"], "shards": 2, "format": "images"}, "training": {"model": "cnn"}},
     ["data.shards", "CSV", "Fix: set data.shards to 1"]),
    ({"data": {**GOOD["data"], "shards": 2}, "backend": "kubernetes",
      "kubernetes": {"claims": {"work": "w", "models": "m"}}}, ["data.shards", "Kubernetes", "Fix:"]),
    ({"data": {**GOOD["data"], "shard": 2}}, ["data.shard", "did you mean 'shards'"]),
])
def test_bad_shards_are_refused_when_the_dag_is_parsed(change, words):
    with pytest.raises(TfpipeConfigError) as err:
        training_pipeline(PipelineConfig.from_dict({**copy.deepcopy(GOOD), **change}))
    for word in words:
        assert word in str(err.value)


def test_the_scheduler_reads_the_mapped_task_and_no_secret_is_serialized():
    import json

    from tfpipe.compat import DagSerialization

    resources = {"private_environment": {"TOKEN": "s3cr3t-value"}}
    dag = training_pipeline(_cfg(4, resources=resources))
    text = json.dumps(DagSerialization.to_dict(dag))
    assert "s3cr3t-value" not in text
    back = DagSerialization.from_dict(json.loads(text))
    shard = back.get_task("prep_shard")
    assert shard.expand_input.value == {"shard_index": [0, 1, 2, 3]}
    assert back.get_task("prep_merge").upstream_task_ids == {"prep_shard"}


def test_the_merge_stands_for_prep_in_gauges_and_lineage():
    from tfpipe.lineage import stage_lineage
    from tfpipe.metrics import stage_gauges

    merged = {"fingerprint": "ab" * 32, "dataset_dir": "/work/datasets/" + "ab" * 32,
              "examples": {"train": 30, "eval": 10}, "shards": 4}
    assert stage_gauges("prep_merge", merged) == {"examples": 40.0}
    volumes = _cfg(4).volumes
    merge = stage_lineage("prep_merge", volumes=volumes, docker_url=None, image=None, data_path="digits",
                          result=merged, upstream={})
    assert [d.name for d in merge.outputs] == [f"/srv/tfpipe/work/datasets/{'ab' * 32}"]
    train = stage_lineage("train", volumes=volumes, docker_url=None, image=None, data_path="digits",
                          result={}, upstream={"prep_merge": merged})
    assert [d.name for d in train.inputs] == [f"/srv/tfpipe/work/datasets/{'ab' * 32}"]
