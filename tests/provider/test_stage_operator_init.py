"""A stage operator takes the arguments ``ResumableJobMixin`` + ``DockerOperator`` + ``BaseOperator``
take, from the task or from ``default_args``, keeps their defaults, and does no I/O when constructed.

Runs on the newest and the oldest supported Airflow (``make test``), where the mixin is Airflow's
own or the ``common.compat`` stand-in.
"""

from __future__ import annotations

import datetime
import sys
import warnings

from airflow.providers.common.compat.sdk import DAG, Param, ResumableJobMixin
from airflow.providers.docker.operators.docker import DockerOperator

from tfpipe import PipelineConfig
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


def test_each_task_gets_the_dags_params_with_its_own_param_winning():
    """The DAG's Params, with a task's own Param winning, each task holding its own copies."""
    with _dag():
        a = TrainOperator(task_id="a", params={"epochs": Param(7, type="integer")}, **SPEC_ARGS)
        b = TrainOperator(task_id="b", **SPEC_ARGS)
    assert set(a.params) == set(b.params) == {"epochs", "gpus"}
    assert a.params["epochs"] == 7 and b.params["epochs"] == 5
    assert a.params.get_param("gpus") is not b.params.get_param("gpus")
    assert a.params.get_param("gpus") is not a.dag.params.get_param("gpus")


def test_dockeroperators_own_arguments_come_from_default_args():
    """DockerOperator's own arguments (``extra_hosts``, ``dns``) and BaseOperator's (``retries``) are
    filled from default_args, unless the task gives them."""
    hosts = {"registry.internal": "10.0.0.5"}
    with _dag(default_args={"extra_hosts": hosts, "dns": ["10.0.0.2"], "retries": 4}), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_defaults = TrainOperator(task_id="train", **SPEC_ARGS)
        given = TrainOperator(task_id="train_2", dns=["10.0.0.3"], **SPEC_ARGS)
    assert isinstance(from_defaults, DockerOperator)
    assert from_defaults.extra_hosts == hosts and from_defaults.dns == ["10.0.0.2"]
    assert given.dns == ["10.0.0.3"] and given.extra_hosts == hosts
    assert from_defaults.retries == 4  # BaseOperator's own, by its wrapper


#: Audit events (``sys.addaudithook``) of network and process I/O, recorded while _RECORDING is set.
_IO_EVENTS = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "urllib.Request")
_RECORDING: list[list[str]] = []


def _record_io(event: str, args: tuple) -> None:
    if _RECORDING and event.startswith(_IO_EVENTS):
        _RECORDING[-1].append(event)


sys.addaudithook(_record_io)  # an audit hook cannot be removed: it records only inside the test below


def test_constructing_a_stage_operator_opens_no_connection_or_process():
    """DAG files parse offline: building every stage's operator, sharded prep's mapped one included,
    against an engine that does not exist and with no image Variable, touches no socket or process."""
    from tfpipe.operators import OPERATORS, PrepShardOperator

    specs = {spec.stage: spec for spec in plan_pipeline(PipelineConfig.from_dict({
        "dag_id": "init_layers", "image": {"ref": None}, "data": {"path": "digits/digits.csv", "shards": 2},
        "volumes": {"data": "/srv/data", "work": "/srv/work", "models": "/srv/models"}}))}
    events: list[str] = []
    _RECORDING.append(events)
    try:
        with _dag():
            made = [OPERATORS[stage](task_id=stage, spec=spec, docker_url="tcp://engine.invalid:2376")
                    for stage, spec in specs.items() if stage != "prep_shard"]
            PrepShardOperator.partial(task_id="prep_shard", spec=specs["prep_shard"],
                                      docker_url="tcp://engine.invalid:2376").expand(shard_index=[0, 1])
    finally:
        _RECORDING.pop()
    assert {op.stage for op in made} == {"prep_merge", "validate", "train", "evaluate", "export"}
    assert events == []
