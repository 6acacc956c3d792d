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


def test_missing_everywhere_says_how_to_set_it(no_image_variable):
    with pytest.raises(ImageNotSetError) as err:
        resolve_image(None, task="train")
    message = str(err.value)
    assert message.startswith("train: no trainer image")
    assert "airflow variables set tfpipe_image" in message and "make image" in message


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
