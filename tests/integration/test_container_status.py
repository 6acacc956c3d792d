"""How a try judges the container an earlier try left, against the real engine (the re-attach table)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from docker.errors import NotFound

from tfpipe.operators import TrainOperator
from tfpipe.specs import config_template

pytestmark = [pytest.mark.integration, pytest.mark.resume]

LABELS = {"tfpipe.dag_id": "status_dag", "tfpipe.run_id": "run-1", "tfpipe.task_id": "train"}


@pytest.fixture
def operator(trainer_image, tmp_path):
    from tfpipe.config import PipelineConfig

    cfg = PipelineConfig(dag_id="status_dag", image={"ref": trainer_image},
                         volumes={"data": f"{tmp_path}/d", "work": f"{tmp_path}/w", "models": f"{tmp_path}/m"},
                         data={"path": "x.csv"})
    return TrainOperator(task_id="train", image=trainer_image, stage_config=config_template(cfg, "train"),
                         volumes=cfg.volumes)


def _context(task_id: str = "train"):
    return {"ti": SimpleNamespace(dag_id="status_dag", run_id="run-1", task_id=task_id)}


def test_status_of_an_earlier_tries_container(operator, docker_client, trainer_image):
    container = docker_client.containers.create(trainer_image, ["sleep", "60"], labels=LABELS, entrypoint=[])
    try:
        cid = container.id
        assert operator.get_job_status(cid, _context()) == "created"
        container.start()
        status = operator.get_job_status(cid, _context())
        assert status == "running" and operator.is_job_active(status)
        container.pause()
        status = operator.get_job_status(cid, _context())
        assert status == "paused" and operator.is_job_active(status), "a paused writer must not get a twin"
        container.unpause()
        # never someone else's work, even with a known id
        assert operator.get_job_status(cid, _context("evaluate")) == "gone"
        container.kill()
        container.wait()
        status = operator.get_job_status(cid, _context())
        assert status == "exited:137" and not operator.is_job_active(status)
        assert not operator.is_job_succeeded(status)
    finally:
        container.remove(force=True)
    assert operator.get_job_status(cid, _context()) == "gone"


def test_an_unwatched_container_that_exited_0_gives_its_result(operator, docker_client, trainer_image):
    line = 'TFPIPE_RESULT {"epochs": 3}'
    container = docker_client.containers.run(trainer_image, ["sh", "-c", f"echo working; echo '{line}'"],
                                             labels=LABELS, entrypoint=[], detach=True)
    container.wait()
    status = operator.get_job_status(container.id, _context())
    assert operator.is_job_succeeded(status)
    operator._result = None
    assert operator.get_job_result(container.id, _context()) == {"epochs": 3}
    with pytest.raises(NotFound):
        container.reload()  # collected: removed once its result was read
