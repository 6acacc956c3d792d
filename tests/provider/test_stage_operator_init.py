"""A stage operator's construction skips the redundant Params merges of the ``__init__`` wrappers of
the mixin (Airflow 3.3) and of ``DockerOperator``, and still behaves as ``ResumableJobMixin`` +
``DockerOperator`` say.

Runs on the newest and the oldest supported Airflow (``make test``), where the mixin is Airflow's
own or the ``common.compat`` stand-in.
"""

from __future__ import annotations

import datetime
import warnings

from airflow.providers.common.compat.sdk import DAG, Param, ResumableJobMixin

from tfpipe import PipelineConfig
from airflow.providers.docker.operators.docker import DockerOperator

from tfpipe.operators.docker import TrainOperator
from tfpipe.specs import plan_pipeline

NATIVE = ResumableJobMixin.__module__.startswith("airflow.sdk")  # Airflow >= 3.3
SPEC_ARGS = {"spec": next(spec for spec in plan_pipeline(PipelineConfig.from_dict({
    "dag_id": "init_layers", "image": {"ref": "tfpipe/trainer:0.1.0"}, "data": {"path": "digits/digits.csv"},
    "volumes": {"data": "/srv/data", "work": "/srv/work", "models": "/srv/models"}})) if spec.stage == "train")}


def _dag(**kwargs) -> DAG:
    return DAG("init_layers", schedule=None, start_date=datetime.datetime(2026, 1, 1),
               params={"epochs": Param(5, type="integer", minimum=1), "gpus": Param(None, type=["null", "string"])},
               **kwargs)


def test_durable_keeps_the_mixins_default_and_takes_an_explicit_value():
    with _dag():
        default = TrainOperator(task_id="train", **SPEC_ARGS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            explicit = TrainOperator(task_id="train_2", durable=False, **SPEC_ARGS)
    assert default.durable is NATIVE  # True from Airflow 3.3; the stand-in never resumes
    assert explicit.durable is False
    assert any("no effect" in str(w.message) for w in caught) is not NATIVE


def test_durable_comes_from_default_args():
    with _dag(default_args={"durable": False}), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the stand-in's "no effect" warning
        assert TrainOperator(task_id="train", **SPEC_ARGS).durable is False


def test_params_are_merged_once_per_task_as_before():
    """The DAG's Params, with a task's own Param winning, each task holding its own copies."""
    with _dag():
        a = TrainOperator(task_id="a", params={"epochs": Param(7, type="integer")}, **SPEC_ARGS)
        b = TrainOperator(task_id="b", **SPEC_ARGS)
    assert set(a.params) == set(b.params) == {"epochs", "gpus"}
    assert a.params["epochs"] == 7 and b.params["epochs"] == 5
    assert a.params.get_param("gpus") is not b.params.get_param("gpus")
    assert a.params.get_param("gpus") is not a.dag.params.get_param("gpus")


def test_dockeroperators_own_arguments_still_come_from_default_args():
    """What DockerOperator's wrapper did for its own arguments: fill them from default_args, unless
    the task gives them."""
    hosts = {"registry.internal": "10.0.0.5"}
    with _dag(default_args={"extra_hosts": hosts, "dns": ["10.0.0.2"], "retries": 4}), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_defaults = TrainOperator(task_id="train", **SPEC_ARGS)
        given = TrainOperator(task_id="train_2", dns=["10.0.0.3"], **SPEC_ARGS)
    assert isinstance(from_defaults, DockerOperator)
    assert from_defaults.extra_hosts == hosts and from_defaults.dns == ["10.0.0.2"]
    assert given.dns == ["10.0.0.3"] and given.extra_hosts == hosts
    assert from_defaults.retries == 4  # BaseOperator's own, by its wrapper


def test_the_mixins_and_dockeroperators_wrappers_are_skipped():
    """The mixin's and DockerOperator's __init__ run unwrapped; the operator's own wrapper and those
    below DockerOperator still run: as many Params merges as for a DockerOperator of its own (two, or
    three where the Docker provider builds on ``airflow.models.BaseOperator``, as with Airflow 3.0)."""
    import airflow.sdk.bases.operator as operator_module

    calls = []
    merged = operator_module.get_merged_defaults

    def counting(*args, **kwargs):
        calls.append(1)
        return merged(*args, **kwargs)

    operator_module.get_merged_defaults = counting
    try:
        with _dag():
            TrainOperator(task_id="train", **SPEC_ARGS)
            ours = len(calls)
            DockerOperator(task_id="plain", image="tfpipe/trainer:0.1.0")
    finally:
        operator_module.get_merged_defaults = merged
    assert ours >= 2, "the counting missed the wrappers: this test would prove nothing"
    assert ours == len(calls) - ours
