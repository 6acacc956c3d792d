"""README claims of "Google Cloud Storage" and "Retention" checked against the real engine, image
and emulator: the stage-in's task log at the operator's own sizes, the publish helper's
isolation, and the cleanup teardown's place in a run that fails or whose cleanup fails."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.conftest import run_dag, write_dag
from tests.engine_watch import InspectOnCreate
from tests.integration.conftest import fake_context
from tfpipe.gcs.plan import MANIFEST_NAME
from tfpipe.operators.gcs import GcsPublishOperator, GcsStageInOperator

pytestmark = pytest.mark.integration

#: The dag_id label of this module's helper containers (tests on the other xdist worker run theirs).
HELPER_DAG = "tfpipe_gcs_helpers_test"
HOUR = 3600.0


# -- Google Cloud Storage ------------------------------------------------------------------------

@pytest.mark.gcs
def test_a_stage_in_logs_its_plan_download_and_progress_and_a_resync_moves_only_changes(tmp_path, trainer_image,
                                                                                       bucket, capsys):
    """README: the task log says what the sync does (`stage-in ... N to download`), how the objects
    came down (the transfer manager's threads) and how far it got (`staged 64/64 objects, ... MB`);
    a resync after two objects changed downloads those two only. Nothing is patched: the
    operator's own sizes."""
    # about 50 kB each, so the progress line's size is not 0.0 MB
    bodies = {f"raw/many/part-{i:03d}.csv": f"x,label\n{i},{i % 10}\n".encode() + b"\n" * (50_000 + i)
              for i in range(64)}
    for name, body in bodies.items():
        bucket.blob(name).upload_from_string(body)
    op = GcsStageInOperator(task_id="stage_in", data_volume=str(tmp_path / "data"), data_path="many/",
                            image=trainer_image, source_uri=f"gs://{bucket.name}/raw/many")  # max_workers: 8
    total = sum(len(body) for body in bodies.values())
    capsys.readouterr()

    first = op.execute(fake_context("stage_in", dag_id=HELPER_DAG))
    out = capsys.readouterr().out  # the task log (Airflow logs to stdout)
    assert (first["objects"], first["downloaded"]) == (64, 64)
    assert "64 object(s), " in out and "64 to download, 0 unchanged, 0 to delete" in out, out[-3000:]
    assert f"downloading 64 object(s), {total / 1e6:.1f} MB, in 8 threads" in out, out[-3000:]
    assert f"staged 64/64 objects, {total / 1e6:.1f} MB" in out, out[-3000:]
    target = tmp_path / "data" / "many"
    for name, body in bodies.items():
        assert (target / name[len("raw/many/"):]).read_bytes() == body, name

    for i in (3, 40):
        bucket.blob(f"raw/many/part-{i:03d}.csv").upload_from_string(b"x,label\n99,9\n")
    second = op.execute(fake_context("stage_in", dag_id=HELPER_DAG))
    out = capsys.readouterr().out
    assert (second["downloaded"], second["unchanged"]) == (2, 62)
    assert "downloading 2 object(s), 0.0 MB, in 2 threads" in out, out[-3000:]
    assert (target / "part-040.csv").read_bytes() == b"x,label\n99,9\n"
    assert (target / MANIFEST_NAME).is_file()


@pytest.mark.gcs
def test_the_publish_helper_is_labelled_has_no_network_and_is_removed(tmp_path, trainer_image, bucket, docker_client):
    """README: the export leaves the volume through "short-lived helper containers of the trainer
    image (labelled `tfpipe.role=gcs-stage-in` / `gcs-publish`, no network) that bind-mount the
    volume, with ... `get_archive` (exported model out)"."""
    models = tmp_path / "models"
    version_dir = models / "digits" / "3"
    files = {"saved_model.pb": os.urandom(20_000), "variables/variables.index": os.urandom(300),
             "metadata.json": b"{}"}
    for rel, body in files.items():
        (version_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (version_dir / rel).write_bytes(body)
    for path in [models, *models.rglob("*")]:
        os.chown(path, 1000, 1000)
    op = GcsPublishOperator(task_id="publish", models_volume=str(models), model_name="digits", image=trainer_image,
                            destination_uri=f"gs://{bucket.name}/models")
    helpers = InspectOnCreate(docker_client, f"tfpipe.dag_id={HELPER_DAG}", "tfpipe.role=gcs-publish")
    helpers.start()
    try:
        result = op.execute(fake_context("publish", xcom={"version": 3, "model_name": "digits",
                                                          "model_dir": "/models/digits/3"}, dag_id=HELPER_DAG))
    finally:
        inspected = list(helpers.stop().values())
    assert result["uploaded"] == len(files)
    for rel, body in files.items():
        assert bucket.blob(f"models/digits/3/{rel}").download_as_bytes() == body, rel
    assert helpers.created, "no gcs-publish helper container was created"
    assert not helpers.missed, f"helper containers gone before they could be inspected: {helpers.missed}"
    for helper in inspected:
        assert helper["Config"]["Image"] == trainer_image
        assert helper["Config"]["Labels"]["tfpipe.role"] == "gcs-publish"
        assert helper["HostConfig"]["NetworkMode"] == "none"
        assert list(helper["NetworkSettings"]["Networks"]) == ["none"]
        assert [m["Source"] for m in helper["Mounts"] if m["Type"] == "bind"] == [str(models)], helper["Mounts"]
    assert docker_client.containers.list(all=True, filters={"label": ["tfpipe.role=gcs-publish",
                                                                      f"tfpipe.dag_id={HELPER_DAG}"]}) == []


# -- Retention: cleanup as a teardown --------------------------------------------------------------

def _age(path: Path, seconds: float) -> None:
    """Set the mtime of ``path`` and everything below it ``seconds`` in the past."""
    when = time.time() - seconds
    for p in [*path.rglob("*"), path]:
        os.utime(p, (when, when))


def _old_run_dir(runs_dir: Path, name: str, age: float) -> Path:
    run = runs_dir / name
    (run / "train" / "tensorboard").mkdir(parents=True)
    (run / "train" / "tensorboard" / "events.out").write_bytes(b"\0" * 4096)
    _age(run, age)
    return run


def test_cleanup_runs_when_prep_fails_and_the_run_stays_failed(tfpipe_home, trainer_image, tmp_path):
    """README: "a pipeline whose data broke fails every night without ever reaching export; both must
    still not fill the disk, so cleanup runs when prep fails too", and "a run that failed stays
    failed although cleanup succeeded". A broken CSV fails prep; cleanup still removes an old run
    dir and its DAG's stale temporary directory."""
    dag_id = "cleanup_after_prep_fails"
    csv = tfpipe_home / "data" / "digits" / "digits.csv"
    lines = csv.read_text().splitlines()
    lines[42] = lines[42].replace(",", ",seven,", 1)
    csv.write_text("\n".join(lines) + "\n")
    runs_dir = tfpipe_home / "work" / "runs" / dag_id
    oldest = _old_run_dir(runs_dir, "scheduled__2026-01-01T00_00_00_00_00", 3 * 24 * HOUR)
    older = _old_run_dir(runs_dir, "scheduled__2026-01-02T00_00_00_00_00", 2 * 24 * HOUR)
    stale = runs_dir / ".tmp-deleted-stale"
    (stale / "x").mkdir(parents=True)
    _age(stale, 2 * HOUR)
    dags = tmp_path / "dags"
    write_dag(dags, dag_id, retention={"keep_runs": 1, "min_idle_minutes": 0})

    summary, log = run_dag(dag_id, {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert summary["state"] == "failed", log[-6000:]
    assert summary["tasks"]["prep"] == {"state": "failed", "try_number": 1}, summary["tasks"]
    assert summary["tasks"]["train"]["state"] == "upstream_failed", summary["tasks"]
    assert summary["tasks"]["cleanup"]["state"] == "success", (summary["tasks"], log[-6000:])
    assert not oldest.exists(), "cleanup did not remove the oldest run dir after prep failed"
    assert f"retention: removed run runs/{dag_id}/{oldest.name}" in log, log[-4000:]
    assert not stale.exists(), "cleanup did not remove its DAG's stale temporary directory"
    # keep_runs 1: the newest of the other dirs stays (the failed run's own, if prep made one, else `older`)
    assert older.exists() or any(p.name not in (oldest.name, older.name) for p in runs_dir.iterdir())


def test_a_failed_cleanup_does_not_fail_a_good_run(tfpipe_home, trainer_image, tmp_path):
    """README: "a failed cleanup (shown as a failed task) does not fail a good run". The cleanup is
    made to fail for real: an old run dir holds a ``dataset.json`` that is a directory, which the
    retention program cannot read; every stage of the run succeeds."""
    dag_id = "cleanup_fails"
    runs_dir = tfpipe_home / "work" / "runs" / dag_id
    broken = _old_run_dir(runs_dir, "scheduled__2026-01-01T00_00_00_00_00", 3 * 24 * HOUR)
    (broken / "dataset.json").mkdir()
    _age(broken, 3 * 24 * HOUR)
    dags = tmp_path / "dags"
    write_dag(dags, dag_id, training={"model": "mlp", "epochs": 1, "checkpoint_every_steps": 1000},
              evaluation={"threshold": 0.0, "tolerance": 1.0}, retention={"keep_runs": 1, "min_idle_minutes": 0})

    summary, log = run_dag(dag_id, {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    tasks = summary["tasks"]
    assert tasks["cleanup"]["state"] == "failed", (tasks, log[-6000:])
    assert "retention failed" in log, log[-4000:]
    assert all(tasks[t]["state"] == "success" for t in ("prep", "train", "evaluate", "export")), tasks
    assert summary["state"] == "success", (tasks, log[-6000:])
    assert summary["model_dir"], "the good run exported its model"
    assert broken.exists(), "nothing was removed by the failed cleanup"
