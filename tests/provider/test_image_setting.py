"""The trainer image a task runs: its own, else the Airflow Variable tfpipe_image, read at run time."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tfpipe.exceptions import ImageNotSetError
from tfpipe.settings import IMAGE_VARIABLE, resolve_image


@pytest.fixture
def no_image_variable(monkeypatch):
    """Neither the environment nor the metadata DB holds the Variable (restored afterwards)."""
    from airflow.models.variable import Variable

    monkeypatch.delenv("AIRFLOW_VAR_TFPIPE_IMAGE", raising=False)
    saved = Variable.get(IMAGE_VARIABLE, default_var=None)
    Variable.delete(IMAGE_VARIABLE)
    yield Variable
    Variable.delete(IMAGE_VARIABLE)
    if saved is not None:
        Variable.set(IMAGE_VARIABLE, saved)


def test_a_pinned_image_wins(no_image_variable):
    assert resolve_image("reg.example/tfpipe/trainer:1a2b3c") == "reg.example/tfpipe/trainer:1a2b3c"


def _runners_no_retry_exception() -> type:
    """The exception class Airflow's task runner fails a task for without retrying: the runner's own
    name for it where it has one (3.1 on), else the one it imports from ``airflow.exceptions`` (3.0)."""
    from airflow.sdk.execution_time import task_runner

    found = getattr(task_runner, "AirflowFailException", None)
    if found is None:
        from airflow.exceptions import AirflowFailException as found
    return found


def test_missing_everywhere_says_how_to_set_it(no_image_variable):
    """The task fails at once: the exception is the one the task runner fails without retrying."""
    AirflowFailException = _runners_no_retry_exception()
    with pytest.raises(ImageNotSetError) as err:
        resolve_image(None, task="train")
    assert isinstance(err.value, AirflowFailException), "a missing image must not use the task's retries"
    message = str(err.value)
    assert message.startswith("train: no trainer image: the pipeline names none (image.ref) and the Airflow "
                              "Variable 'tfpipe_image' is not set. Fix:")
    assert "airflow variables set tfpipe_image" in message and "make image" in message


def test_a_stage_task_without_an_image_fails_in_execute_before_any_container(no_image_variable):
    """A pipeline naming no image parses; its task's ``execute()`` raises the no-retry error before it
    asks any engine for anything (the engine URL here leads nowhere, so reaching it would fail otherwise)."""
    import copy
    from types import SimpleNamespace

    from tests.provider.test_config import GOOD
    from tfpipe.config import PipelineConfig
    from tfpipe.dag_factory import training_pipeline

    mapping = {**copy.deepcopy(GOOD), "image": {"ref": None}, "docker_url": "tcp://nowhere.invalid:2376"}
    dag = training_pipeline(PipelineConfig.from_dict(mapping))
    task = dag.get_task("train")
    assert task.retries > 0, "the task has retries, and this failure must not use them"
    ti = SimpleNamespace(dag_id=dag.dag_id, run_id="manual__1", task_id="train", try_number=1, map_index=-1)
    with pytest.raises(_runners_no_retry_exception(), match=r"^train: no trainer image.*Fix:") as err:
        task.execute({"ti": ti, "run_id": "manual__1", "dag": dag, "task": task, "params": dag.params.dump()})
    assert isinstance(err.value, ImageNotSetError)


def test_read_from_the_metadata_db(no_image_variable):
    no_image_variable.set(IMAGE_VARIABLE, "reg.example/tfpipe/trainer:5e6f7a")
    assert resolve_image(None) == "reg.example/tfpipe/trainer:5e6f7a"


def test_read_from_the_environment(no_image_variable, monkeypatch):
    monkeypatch.setenv("AIRFLOW_VAR_TFPIPE_IMAGE", "reg.example/tfpipe/trainer@sha256:" + "ab" * 32)
    assert resolve_image(None).endswith("ab" * 32)


def test_an_unpinned_variable_is_refused(no_image_variable):
    no_image_variable.set(IMAGE_VARIABLE, "tfpipe/trainer:latest")
    with pytest.raises(ImageNotSetError, match="floating"):
        resolve_image(None, task="prep")


def test_no_dag_file_or_default_names_an_image_nothing_builds():
    offenders = [str(p.relative_to(REPO)) for p in [*REPO.glob("dags/*.py"), *REPO.glob("provider/tfpipe/**/*.py")]
                 if "tfpipe/trainer:0.1.0" in p.read_text()]
    assert offenders == []
