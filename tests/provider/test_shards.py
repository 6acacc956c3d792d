"""Sharded prep on the Airflow side: ``data.shards`` validation, the mapped DAG shape, the shard's config."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest

from tfpipe import contract
from tfpipe.config import PipelineConfig
from tfpipe.dag_factory import training_pipeline
from tfpipe.exceptions import TfpipeConfigError
from tfpipe.specs import plan_pipeline, writable_dirs
from tfpipe.tries import resolve_try

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
        ("prep_shard", ()), ("prep_merge", ("prep_shard",)), ("validate", ("prep_merge",)),
        ("train", ("validate",)),
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
    assert merge.upstream_task_ids == {"prep_shard"} and train.upstream_task_ids == {"validate"}
    assert dag.get_task("validate").upstream_task_ids == {"prep_merge"}
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
    ({"data": {**GOOD["data"], "shards": 5000}}, ["data.shards", "1024", "Fix:"]),
    ({"data": {**GOOD["data"], "shards": 2, "format": "images"}, "training": {"model": "cnn"}},
     ["data.shards", "CSV", "Fix: set data.shards to 1"]),
    ({"data": {**GOOD["data"], "shards": 2}, "backend": "kubernetes",
      "kubernetes": {"claims": {"work": "w", "models": "m"}}}, ["data.shards", "Kubernetes", "Fix:"]),
    ({"data": {**GOOD["data"], "shard": 2}}, ["data.shard", "did you mean 'shards'"]),
    ({"shard_docker_urls": ["tcp://a:2376"]}, ["shard_docker_urls", "data.shards is 1", "Fix: set data.shards to 2 or more"]),
    ({"data": {**GOOD["data"], "shards": 2}, "shard_docker_urls": ["tcp://a:2376"] * 3},
     ["lists 3 engines but data.shards is 2", "Fix: set data.shards to 3 or more, or list fewer engines"]),
    ({"data": {**GOOD["data"], "shards": 2}, "shard_docker_urls": "tcp://a:2376"},
     ["shard_docker_urls: must be a list of engine URLs", "Fix:"]),
    ({"data": {**GOOD["data"], "shards": 2}, "shard_docker_urls": ["tcp://a:2376", "gpu-2:2376"]},
     ["shard_docker_urls[1]: must be a URL", "'gpu-2:2376'", "Fix:"]),
    ({"shard_docker_urls": ["tcp://a:2376"], "backend": "kubernetes",
      "kubernetes": {"claims": {"work": "w", "models": "m"}}}, ["shard_docker_urls", "Kubernetes", "Fix:"]),
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


ENGINES = ["tcp://gpu-1.example:2376", "unix:///var/run/docker.sock"]


def test_shard_engines_spread_the_mapped_shards_round_robin_and_survive_serialization():
    import json

    from tfpipe.compat import DagSerialization

    cfg = _cfg(3, shard_docker_urls=ENGINES, docker_url="tcp://main.example:2376")
    assert [cfg.shard_engine(k) for k in range(3)] == [ENGINES[0], ENGINES[1], ENGINES[0]]
    dag = training_pipeline(cfg)
    expected = [{"shard_index": 0, "docker_url": ENGINES[0]}, {"shard_index": 1, "docker_url": ENGINES[1]},
                {"shard_index": 2, "docker_url": ENGINES[0]}]
    assert dag.get_task("prep_shard").expand_input.value == expected
    assert "docker_url" not in dag.get_task("prep_shard").partial_kwargs
    # The merge and everything after it stay on the pipeline's engine
    assert {dag.get_task(t).docker_url for t in ("prep_merge", "train", "evaluate", "export")} == {cfg.docker_url}
    back = DagSerialization.from_dict(json.loads(json.dumps(DagSerialization.to_dict(dag))))
    assert back.get_task("prep_shard").expand_input.value == expected
    # Without the list every shard is on docker_url, as before
    assert _cfg(3, docker_url="tcp://main.example:2376").shard_engine(2) == "tcp://main.example:2376"


def test_a_mapped_shard_instance_gets_its_engine_and_only_it_takes_the_deployment_tls(monkeypatch, tmp_path):
    """Unmapping (what a worker does before execute) gives each instance its engine; a tcp:// shard
    engine then presents the deployment's TLS files, while another stage naming its own engine keeps none."""
    from tfpipe.engine_settings import EngineSettings
    from tfpipe.operators import PrepShardOperator, TrainOperator

    files = {}
    for name in ("ca", "cert", "key"):
        (tmp_path / f"{name}.pem").write_text("PEM")
        files[name] = str(tmp_path / f"{name}.pem")
    for option, value in {"docker_url": "tcp://main.example:2376", "tls_ca_cert": files["ca"],
                          "tls_client_cert": files["cert"], "tls_client_key": files["key"],
                          "tls_hostname": "main.example"}.items():
        monkeypatch.setenv(f"AIRFLOW__TFPIPE__{option.upper()}", value)
    dag = training_pipeline(_cfg(2, shard_docker_urls=ENGINES))
    shard = dag.get_task("prep_shard")
    unmapped = [PrepShardOperator(**{**shard.partial_kwargs, **kw, "task_id": "prep_shard"})
                for kw in shard.expand_input.value]
    settings = EngineSettings.from_airflow_config()
    for op in unmapped:
        settings.apply_to(op, tls_for_named_engine=op.engine_from_shard_list)
    tcp, unix = unmapped
    assert (tcp.docker_url, tcp.tls_ca_cert, tcp.tls_client_cert, tcp.tls_client_key) == (
        ENGINES[0], files["ca"], files["cert"], files["key"])
    assert tcp.tls_hostname is None, "the deployment engine's hostname is not the other engine's"
    assert (unix.docker_url, unix.tls_client_cert) == (ENGINES[1], None), "no TLS over a unix socket"
    train = dag.get_task("train")
    assert not train.engine_from_shard_list
    # A shard on the pipeline's own tcp:// engine (no list) is like every other stage: it keeps no TLS
    plain = training_pipeline(_cfg(2, docker_url="tcp://plain.example:2375")).get_task("prep_shard")
    alone = PrepShardOperator(**{**plain.partial_kwargs, **plain.expand_input.value, "shard_index": 0,
                                 "task_id": "prep_shard"})
    settings.apply_to(alone, tls_for_named_engine=alone.engine_from_shard_list)
    assert (alone.docker_url, alone.tls_client_cert) == ("tcp://plain.example:2375", None)
    own = TrainOperator(spec=train.spec, task_id="own", docker_url="tcp://other.example:2376")
    settings.apply_to(own, tls_for_named_engine=own.engine_from_shard_list)
    assert own.tls_client_cert is None


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


def test_a_two_slash_unix_shard_entry_means_the_deployment_engine_and_three_slashes_stay_local(monkeypatch):
    """``unix://var/run/docker.sock`` (the local default's spelling) in ``shard_docker_urls`` is the
    deployment's engine (``[tfpipe] docker_url``), as for ``docker_url``; ``unix:///var/run/docker.sock``
    names the worker's own socket and is kept."""
    from tfpipe.engine_settings import DEFAULT_DOCKER_URL, EngineSettings
    from tfpipe.operators import PrepShardOperator

    monkeypatch.setenv("AIRFLOW__TFPIPE__DOCKER_URL", "tcp://deployment.example:2375")
    engines = [DEFAULT_DOCKER_URL, "unix:///var/run/docker.sock"]
    assert engines[0] == "unix://var/run/docker.sock"
    shard = training_pipeline(_cfg(2, shard_docker_urls=engines)).get_task("prep_shard")
    default, local = (PrepShardOperator(**{**shard.partial_kwargs, **kw, "task_id": "prep_shard"})
                      for kw in shard.expand_input.value)
    settings = EngineSettings.from_airflow_config()
    for op in (default, local):
        settings.apply_to(op, tls_for_named_engine=op.engine_from_shard_list)
    assert default.docker_url == "tcp://deployment.example:2375"
    assert local.docker_url == "unix:///var/run/docker.sock"


def test_the_shell_finds_a_shard_instance_and_its_engine_and_refuses_a_missing_or_bad_index():
    """``tfpipe shell DAG prep_shard --map-index K`` reproduces instance K as a worker unmaps it (its
    shard index, map index and engine); ``prep_merge`` is a plain task. Wrong indexes name the fix."""
    from tfpipe import reproduce
    from tfpipe.cli.common import stage_task
    from tfpipe.operators import PrepShardOperator

    dag = training_pipeline(_cfg(3, shard_docker_urls=ENGINES))
    run_id = "manual__2026-12-02T00:00:00+00:00"
    for k in range(3):
        shard = stage_task(dag, "prep_shard", k)
        assert isinstance(shard, PrepShardOperator) and shard.shard_index == k
        assert shard.docker_url == ENGINES[k % 2] and shard.engine_from_shard_list
        plan = reproduce.task_plan(shard, dag_id=dag.dag_id, run_id=run_id, try_number=2, params=dag.params.dump(),
                               map_index=k)
        assert plan.config[contract.SHARD_INDEX_KEY] == k and plan.config["stage"] == "prep_shard"
        assert plan.labels["tfpipe.map_index"] == str(k) and plan.docker_url == ENGINES[k % 2]
        # the container name and labels a worker gives that instance's try
        ti = SimpleNamespace(dag_id=dag.dag_id, run_id=run_id, task_id="prep_shard", try_number=2, map_index=k)
        executed = resolve_try(shard.spec, ti, dag.params.dump(), shard_index=k)
        assert (plan.name, dict(plan.labels), plan.config) == (executed.name, dict(executed.labels),
                                                                executed.config)
    merge = stage_task(dag, "prep_merge")
    plan = reproduce.task_plan(merge, dag_id=dag.dag_id, run_id=run_id, try_number=1, params=dag.params.dump())
    assert plan.config["stage"] == "prep_merge"
    ti = SimpleNamespace(dag_id=dag.dag_id, run_id=run_id, task_id="prep_merge", try_number=1, map_index=-1)
    executed = resolve_try(merge.spec, ti, dag.params.dump())
    assert (plan.name, dict(plan.labels), plan.config) == (executed.name, dict(executed.labels), executed.config)
    # One engine for all shards (expand over the indexes alone) unmaps as well
    plain = stage_task(training_pipeline(_cfg(2)), "prep_shard", 1)
    assert plain.shard_index == 1 and not plain.engine_from_shard_list
    for task_id, index, words in [
            ("prep_shard", None, "prep_shard is a mapped task (one instance per shard, 0..2). Fix: add --map-index N"),
            ("prep_shard", 3, "--map-index 3: prep_shard has instances 0..2. Fix:"),
            ("prep_shard", -1, "--map-index -1: prep_shard has instances 0..2. Fix:"),
            ("train", 0, "--map-index 0: train is not a mapped task. Fix: leave --map-index out."),
            ("prep", None, "has no tfpipe stage task 'prep' (stage tasks: prep_shard, prep_merge, validate, "
                           "train, evaluate, export)")]:
        with pytest.raises(SystemExit) as err:
            stage_task(dag, task_id, index)
        assert words in str(err.value), str(err.value)
