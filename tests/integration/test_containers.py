"""Container hygiene against the real engine: leftovers of earlier tries, volume preparation."""

from __future__ import annotations

import pytest
from airflow.sdk import DAG

from tfpipe.config import PipelineConfig
from tfpipe.operators.docker import TrainOperator
from tfpipe.specs import config_template, container_labels, container_name

pytestmark = pytest.mark.integration


def _train_operator(image: str, home) -> TrainOperator:
    cfg = PipelineConfig.from_dict({
        "dag_id": "hygiene", "image": {"ref": image}, "data": {"path": "digits/digits.csv"},
        "volumes": {"data": f"{home}/data", "work": f"{home}/work", "models": f"{home}/models"},
    })
    with DAG("hygiene", schedule=None):
        return TrainOperator(task_id="train", image=image, stage_config=config_template(cfg, "train"),
                             volumes=cfg.volumes)


def test_leftover_container_of_an_earlier_try_is_removed(trainer_image, tfpipe_home, docker_client):
    """A worker killed with SIGKILL never runs on_kill: its container is still running on retry."""
    op = _train_operator(trainer_image, tfpipe_home)
    run_id = "manual__2026-11-29T00:00:00+00:00"
    op.container_name = container_name("hygiene", run_id, "train")
    labels = container_labels(dag_id="hygiene", run_id=run_id, task_id="train", try_number=1, stage="train")
    leftover = docker_client.containers.run(trainer_image, ["sleep", "600"], name=op.container_name,
                                            labels=labels, detach=True)
    other_run = docker_client.containers.run(
        trainer_image, ["sleep", "600"], detach=True,
        labels=container_labels(dag_id="hygiene", run_id="another", task_id="train", try_number=1, stage="train"))
    try:
        op._remove_leftovers("hygiene", run_id, "train", -1)
        names = [c.name for c in docker_client.containers.list(all=True)]
        assert op.container_name not in names
        assert other_run.name in names, "containers of other runs must be left alone"
    finally:
        for c in (leftover, other_run):
            try:
                c.remove(force=True)
            except Exception:
                pass


def test_prepare_dirs_hands_directories_to_the_stage_user(trainer_image, tfpipe_home):
    op = _train_operator(trainer_image, tfpipe_home)
    op._prepare_dirs(("/work/runs/hygiene/r1", "/work/cache", "/models/m"))
    for path in (tfpipe_home / "work" / "runs" / "hygiene" / "r1", tfpipe_home / "models" / "m"):
        stat = path.stat()
        assert (stat.st_uid, stat.st_gid) == (1000, 1000)
    # the parents were created but not chowned recursively
    assert (tfpipe_home / "work" / "runs").stat().st_uid == 0
