"""Claims of the docs' "Deploying" and "Your pipeline" pages (the learning-rate schedule's warm-up,
gradient clipping), checked where a running task acts:

- A run whose conf lowers ``epochs`` below the warm-up "fails its train task at once, naming both fields
  and the fix"; the conf's patience and clip are "checked like the DAG file" (a bad one fails the task
  without retries too, naming the field); a good one passes on to the engine.
- The Airflow Variable ``tfpipe_image`` is read "when each task runs, never when the DAG file is
  parsed": a Variable changed between the parse and the run is the one the task uses.

Each task runs its real ``execute()`` with a context as Airflow hands it (the run's params merged
with the conf by Airflow's own ``process_params``), against an engine URL that leads nowhere: a task
that got past its checks fails there, retryably, so the checks are told apart from the engine.
"""

from __future__ import annotations

import copy
import re
from types import SimpleNamespace

import pytest

from tests.provider.test_config import GOOD
from tests.provider.test_image_setting import _runners_no_retry_exception, no_image_variable  # noqa: F401  (a fixture)
from tfpipe.cli.common import run_params
from tfpipe.config import PipelineConfig
from tfpipe.dag_factory import training_pipeline
from tfpipe.exceptions import DockerEngineUnreachableError
from tfpipe.plugins.paths import LOCATION_XCOM_KEY

NOWHERE = "tcp://nowhere.invalid:2376"


def _execute(dag, task_id: str, conf: dict, pushed: list[tuple[str, object]]) -> None:
    """Run ``task_id``'s ``execute()`` for a run with ``conf``; what it pushes to XCom goes to
    ``pushed`` (the exception ``execute()`` raises propagates)."""
    task = dag.get_task(task_id)
    ti = SimpleNamespace(dag_id=dag.dag_id, run_id="manual__1", task_id=task_id, try_number=1, map_index=-1,
                         xcom_push=lambda key, value: pushed.append((key, value)))
    context = {"ti": ti, "run_id": "manual__1", "dag": dag, "task": task,
               "dag_run": SimpleNamespace(conf=conf, run_id="manual__1"),
               "params": run_params(dag, task, conf)}
    task.execute(context)


def _warm_up_dag():
    return training_pipeline(PipelineConfig.from_dict({
        **copy.deepcopy(GOOD), "docker_url": NOWHERE,
        "training": {"epochs": 10, "learning_rate_warmup_epochs": 2}}))


@pytest.mark.parametrize("conf, named", [
    ({"epochs": 2}, [r"training\.learning_rate_warmup_epochs", r"training\.epochs"]),
    ({"early_stopping_patience": -2}, [r"training\.early_stopping_patience"]),
    ({"gradient_clip_norm": -1}, [r"training\.gradient_clip_norm"]),
    ({"gradient_clip_norm": "1"}, [r"training\.gradient_clip_norm"]),
])
def test_a_run_s_bad_conf_fails_the_train_task_at_once_naming_the_fields_and_the_fix(conf, named):
    dag = _warm_up_dag()
    assert dag.get_task("train").retries > 0, "the task has retries, and this failure must not use them"
    pushed: list[tuple[str, object]] = []
    with pytest.raises(_runners_no_retry_exception()) as err:
        _execute(dag, "train", conf, pushed)
    message = str(err.value)
    assert message.startswith("train: invalid run parameters: "), message
    for field in named:
        assert re.search(field, message), (field, message)
    assert "Fix: " in message, message
    assert pushed == [], "it failed before anything else: not even the run's location was recorded"


@pytest.mark.parametrize("conf", [{"epochs": 3}, {"early_stopping_patience": 4}, {"gradient_clip_norm": 1.0}])
def test_a_run_s_good_conf_passes_the_checks_and_goes_on_to_the_engine(conf):
    """The same DAG and a conf within bounds: the task gets past its checks and fails only at the
    engine, which retries can fix (so the refusals above are the checks', not the engine's)."""
    dag = _warm_up_dag()
    pushed: list[tuple[str, object]] = []
    with pytest.raises(DockerEngineUnreachableError) as err:
        _execute(dag, "train", conf, pushed)
    assert not isinstance(err.value, _runners_no_retry_exception())
    assert [key for key, _ in pushed] == [LOCATION_XCOM_KEY]


@pytest.mark.usefixtures("no_image_variable")
def test_the_image_variable_is_read_when_the_task_runs_not_when_the_dag_is_parsed(monkeypatch):
    at_parse = "reg.example/tfpipe/trainer:aaaaaaaaaaaa"
    at_run = "reg.example/tfpipe/trainer@sha256:" + "b" * 64
    monkeypatch.setenv("AIRFLOW_VAR_TFPIPE_IMAGE", at_parse)
    dag = training_pipeline(PipelineConfig.from_dict({**copy.deepcopy(GOOD), "image": {"ref": None},
                                                      "docker_url": NOWHERE}))
    monkeypatch.setenv("AIRFLOW_VAR_TFPIPE_IMAGE", at_run)  # a new image rolled out after the parse
    for task_id in ("prep", "train"):
        pushed: list[tuple[str, object]] = []
        with pytest.raises(DockerEngineUnreachableError):
            _execute(dag, task_id, {}, pushed)
        (key, location), = pushed
        assert key == LOCATION_XCOM_KEY and location["image"] == at_run, location
        assert dag.get_task(task_id).image == at_run
    # and with no Variable at run time, the parsed DAG does not fall back to the one it was parsed with
    monkeypatch.delenv("AIRFLOW_VAR_TFPIPE_IMAGE")
    with pytest.raises(_runners_no_retry_exception(), match=r"^train: no trainer image"):
        _execute(dag, "train", {}, [])


def test_the_engine_setting_is_read_when_the_task_runs_not_when_the_dag_is_parsed(monkeypatch):
    """``[tfpipe] docker_url`` (here ``AIRFLOW__TFPIPE__DOCKER_URL``) is read in ``execute()`` on the
    worker, as the docs say: the DAG processor, which holds no client keys and may be configured
    without the section, parses with another value (here an unusable one) without an error, and
    the task goes to the engine its worker names when it runs."""
    from tfpipe.engine_settings import DEFAULT_DOCKER_URL

    monkeypatch.setenv("AIRFLOW_VAR_TFPIPE_IMAGE", "reg.example/tfpipe/trainer:aaaaaaaaaaaa")
    monkeypatch.setenv("AIRFLOW__TFPIPE__DOCKER_URL", "not a url")  # refused by the task, were it read
    dag = training_pipeline(PipelineConfig.from_dict(copy.deepcopy(GOOD)))
    assert dag.get_task("train").docker_url == DEFAULT_DOCKER_URL
    monkeypatch.setenv("AIRFLOW__TFPIPE__DOCKER_URL", NOWHERE)  # the worker's setting
    pushed: list[tuple[str, object]] = []
    with pytest.raises(DockerEngineUnreachableError) as err:
        _execute(dag, "train", {}, pushed)
    assert dag.get_task("train").docker_url == NOWHERE
    assert "nowhere.invalid" in str(err.value), err.value
    # and an unusable setting on the worker fails the task there, naming the option and the fix
    monkeypatch.setenv("AIRFLOW__TFPIPE__DOCKER_URL", "not a url")
    fresh = training_pipeline(PipelineConfig.from_dict(copy.deepcopy(GOOD)))
    with pytest.raises(_runners_no_retry_exception(), match=r"^train: \[tfpipe\] docker_url: must be a URL"):
        _execute(fresh, "train", {}, [])
