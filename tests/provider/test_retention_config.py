"""Retention settings and the cleanup task's place in the DAG (no engine needed)."""

from __future__ import annotations

import pytest

from tfpipe import PipelineConfig, training_pipeline
from tfpipe.config import RetentionConfig
from tfpipe.exceptions import TfpipeConfigError
from tfpipe.operators.retention import retention_request

BASE = {"dag_id": "nightly", "image": {"ref": "tfpipe/trainer:0.1.0"},
        "volumes": {"data": "/srv/d", "work": "/srv/w", "models": "/srv/m"}, "data": {"path": "x.csv"}}


def test_safe_defaults():
    retention = PipelineConfig.from_dict(BASE).retention
    assert retention == RetentionConfig(enabled=True, keep_runs=10, min_idle_minutes=60.0)


@pytest.mark.parametrize("settings,message", [
    ({"keep_runs": 0}, "retention.keep_runs: must be a whole number >= 1"),
    ({"min_idle_minutes": -1}, "retention.min_idle_minutes: must be a number >= 0"),
    ({"enabled": "yes"}, "retention.enabled: must be true or false"),
    ({"keep_run": 3}, "retention.keep_run: unknown key. Fix: remove it (did you mean 'keep_runs'?)"),
])
def test_bad_settings_name_the_field(settings, message):
    with pytest.raises(TfpipeConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        PipelineConfig.from_dict({**BASE, "retention": settings})


def test_cleanup_is_a_teardown_beside_training_once_the_data_set_is_ready():
    dag = training_pipeline(PipelineConfig.from_dict({**BASE, "retention": {"keep_runs": 4}}))
    cleanup = dag.get_task("cleanup")
    assert cleanup.is_teardown and not cleanup.on_failure_fail_dagrun
    assert str(cleanup.trigger_rule.value) == "all_done_setup_success"  # all done: no setup tasks here
    # after what train waits for (the data set), off the run's critical path: nothing waits for it
    assert cleanup.upstream_task_ids == dag.get_task("train").upstream_task_ids == {"validate"}
    assert cleanup.downstream_task_ids == set()
    with_buckets = training_pipeline(PipelineConfig.from_dict({**BASE, "dag_id": "n3", "gcs_tasks": True}))
    assert with_buckets.get_task("cleanup").upstream_task_ids == {"validate"}
    assert cleanup.retention.keep_runs == 4 and cleanup.model_name == "model"
    assert "cleanup" not in training_pipeline(
        PipelineConfig.from_dict({**BASE, "dag_id": "n2", "retention": {"enabled": False}})).task_ids


def test_request_carries_settings_and_protected_runs():
    request = retention_request(dag_id="d", run_id="r3", model_name="m",
                                retention=RetentionConfig(keep_runs=2, min_idle_minutes=1.5),
                                protect_run_ids=["r1", "r1", "r0"])
    assert request == {"dag_id": "d", "run_id": "r3", "model_name": "m", "keep_runs": 2, "min_idle_seconds": 90.0,
                       "protect_run_ids": ["r0", "r1"], "work": "/work", "models": "/models"}


def test_state_names_from_the_task_sdk():
    from airflow.sdk.api.datamodels._generated import DagRunState, TaskInstanceState

    from tfpipe.compat import state_name

    assert state_name(DagRunState.RUNNING) == "running" and state_name("queued") == "queued"
    assert state_name(TaskInstanceState.UP_FOR_RETRY) == "up_for_retry" and state_name(None) is None
