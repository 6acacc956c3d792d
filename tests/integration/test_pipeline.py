"""The example pipeline through Airflow (dag.test) with every stage a real TF 2.9 container."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import run_dag, write_dag

pytestmark = pytest.mark.integration


class CreatedContainers(threading.Thread):
    """Collects the engine's container "create" events of one DAG as they happen, and its
    "archive-path" events (a read through the archive API, as the provider's directory checks do).

    Read live, not afterwards with ``since``/``until``: the engine keeps only its last 256 events,
    which other users of a shared engine overrun during a long run."""

    def __init__(self, client, dag_id: str):
        super().__init__(daemon=True)
        self.created: list[dict] = []
        self.archive_reads: list[dict] = []
        self.stream = client.events(decode=True, filters={"type": "container", "event": ["create", "archive-path"],
                                                          "label": f"tfpipe.dag_id={dag_id}"})

    def run(self):
        try:
            for event in self.stream:
                kind = self.created if event.get("Action") == "create" else self.archive_reads
                kind.append(event["Actor"]["Attributes"])
        except Exception:  # the stream was closed
            pass

    def stop(self) -> list[dict]:
        time.sleep(1)  # events of the last containers reach the stream
        self.stream.close()
        self.join(timeout=10)
        return self.created


def run_watching(docker_client, dag_id: str, home: Path, image: str, archive_reads: list | None = None
                 ) -> tuple[dict, str, list[dict]]:
    """``run_dag`` with the containers the engine creates for the DAG meanwhile (and, into
    ``archive_reads`` when given, the archive reads of its containers)."""
    events = CreatedContainers(docker_client, dag_id)
    events.start()
    try:
        summary, log = run_dag(dag_id, {}, home=home, image=image)
    finally:
        created = events.stop()
    if archive_reads is not None:
        archive_reads.extend(events.archive_reads)
    return summary, log, created


@pytest.mark.compat
def test_digits_pipeline_end_to_end(tfpipe_home: Path, trainer_image: str, docker_client):
    summary, log, created = run_watching(docker_client, "tfpipe_digits", tfpipe_home, trainer_image)
    assert summary["state"] == "success", log[-8000:]
    # no bucket configured: no stage_in/publish tasks at all
    assert summary["tasks"] == {**{t: {"state": "success", "try_number": 1}
                                   for t in ("prep", "validate", "train", "evaluate", "export", "cleanup")},
                                "register": {"state": "skipped", "try_number": 1}}  # no MLflow connection
    assert summary["metrics"]["accuracy"] >= 0.95

    model_dir = Path(summary["model_dir"])
    assert model_dir.parent == tfpipe_home / "models" / "digits" and model_dir.name == "1"
    assert (model_dir / "saved_model.pb").is_file()
    metadata = json.loads((model_dir / "metadata.json").read_text())
    assert metadata["run_id"] == summary["run_id"] and metadata["dag_id"] == "tfpipe_digits"
    assert metadata["evaluation"]["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["accuracy"])
    assert len(metadata["attempts"]) == 1

    # provenance: what the engine ran, and what the image was built on
    inspected = docker_client.api.inspect_image(trainer_image)
    labels = inspected["Config"]["Labels"]
    image = metadata["image"]
    assert image["reference"] == trainer_image
    assert image["id"] == inspected["Id"] and image["id"].startswith("sha256:")
    assert image["content_id"] == labels["io.tfpipe.content-id"] == trainer_image.rsplit(":", 1)[1]
    if image["repo_digest"] is not None:
        assert image["repo_digest"] in inspected["RepoDigests"]
    else:
        # a local build that never went through a registry, or one the deployment tests pushed to their
        # registry while this run went on (the engine knew no digest when the run asked)
        assert not inspected["RepoDigests"] or all(d.startswith("127.0.0.1:") for d in inspected["RepoDigests"])
    root = image["root"]
    assert root["kind"] == labels["io.tfpipe.root.kind"] and root["kind"] in ("offline", "official")
    assert root["reference"] == labels["io.tfpipe.root.reference"]
    assert root["id"] == labels["io.tfpipe.root.id"] == docker_client.api.inspect_image(root["reference"])["Id"]
    assert root["repo_digest"] == (labels["io.tfpipe.root.repo-digest"] or None)
    assert root["variant"] == labels["io.tfpipe.variant"] and root["variant"] in ("gpu", "cpu")

    # every stage ran in a labelled, deterministically named container, and none is left behind
    created = [a for a in created if a.get("tfpipe.run_id") == summary["run_id"]]
    helpers = [a for a in created if a.get("tfpipe.role") == "prepare-volumes"]
    created = [a for a in created if "tfpipe.role" not in a]
    assert [a["tfpipe.stage"] for a in helpers] == ["prep"], \
        "the first stage prepares the run's directories from one container on the engine; the others find them ready"
    assert sorted(a["tfpipe.stage"] for a in created) == ["evaluate", "export", "prep", "train", "validate"]
    for attrs in created:
        assert attrs["tfpipe.run_id"] == summary["run_id"] and attrs["tfpipe.try_number"] == "1"
        assert attrs["name"].startswith(f"tfpipe-tfpipe_digits-{attrs['tfpipe.task_id']}-")
    # this run's only: a test on the other xdist worker may be running tfpipe_digits right now
    assert docker_client.containers.list(all=True, filters={"label": [
        "tfpipe.dag_id=tfpipe_digits", f"tfpipe.run_id={summary['run_id']}"]}) == []

    # export emitted the model asset a deploy DAG can schedule on
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        events = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                                 .where(AssetModel.uri == "tfpipe://models/digits",
                                        AssetEvent.source_run_id == summary["run_id"])).all()
    assert len(events) == 1

    # a second run on unchanged data: prep's fingerprint cache hit, a new version, nothing overwritten.
    # Same settings and seed as the first run: the same model, so it is blessed against version 1
    # (accuracy equal to the baseline, within the tolerance) and export always runs.
    v1_files = {p.relative_to(model_dir): p.read_bytes() for p in model_dir.rglob("*") if p.is_file()}
    reads2: list[dict] = []
    summary2, log2, created2 = run_watching(docker_client, "tfpipe_digits", tfpipe_home, trainer_image, reads2)
    assert summary2["state"] == "success", log2[-8000:]
    created2 = [a for a in created2 if a.get("tfpipe.run_id") == summary2["run_id"]]
    assert sorted(a.get("tfpipe.role", a.get("tfpipe.stage")) for a in created2) == \
        ["evaluate", "export", "prep", "retention", "train", "validate"], \
        "the first run handed the DAG's runs dir to the stages' user: the second run's prep makes its run dir itself"
    # no stage asks the engine about the run's directories (each archive read costs the engine a mount
    # and a tar process): each stage checks the ones it writes itself, in its own container
    reads2 = [a for a in reads2 if a.get("tfpipe.run_id") == summary2["run_id"]]
    assert reads2 == [], reads2
    assert "cache hit" in log2
    assert summary2["run_id"] != summary["run_id"]
    assert summary2["blessed"] is True and summary2["tasks"]["export"]["state"] == "success"
    assert summary2["metrics"]["accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=0.02)
    assert Path(summary2["model_dir"]) == model_dir.parent / "2"
    assert {p.relative_to(model_dir): p.read_bytes() for p in model_dir.rglob("*") if p.is_file()} == v1_files, \
        "version 1 was changed by the second run"


def test_not_blessed_skips_export_and_gpu_fallback_runs_on_cpu(tfpipe_home, trainer_image, tmp_path, docker_client):
    dags = tmp_path / "dags"
    # GPUs requested with CPU fallback, and a gate no model passes
    write_dag(dags, "tfpipe_test_gate", training={"model": "mlp", "epochs": 2},
              evaluation={"threshold": 0.9999}, resources={"gpus": "all", "gpu_fallback": "cpu"})
    summary, log = run_dag("tfpipe_test_gate", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert summary["state"] == "success", log[-8000:]
    assert summary["tasks"]["evaluate"]["state"] == "success"
    assert summary["tasks"]["export"]["state"] == "skipped"
    assert summary["blessed"] is False and summary["model_dir"] is None
    assert "requesting all GPUs for train" in log
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):  # the GPUs are there: no fallback
        assert "gpu_fallback='cpu'" not in log
    else:  # no NVIDIA runtime: the request fails at container start and the stage reruns on the CPU
        assert "no NVIDIA runtime on the engine" in log and "gpu_fallback='cpu': running train on the CPU" in log
    assert not (tfpipe_home / "models" / "gate").exists() or not any(
        p.name.isdigit() for p in (tfpipe_home / "models" / "gate").iterdir())


def test_gpu_request_without_nvidia_runtime_names_the_fix(tfpipe_home, trainer_image, docker_client):
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("this engine has an NVIDIA runtime; the missing-GPU path cannot be shown here")
    summary, log = run_dag("tfpipe_digits_manual", {"gpus": "all", "epochs": 1}, home=tfpipe_home,
                           image=trainer_image)
    assert summary["state"] == "failed"
    assert summary["tasks"]["train"]["state"] == "failed"
    assert summary["tasks"]["train"]["try_number"] == 1, "a missing GPU runtime must not be retried"
    assert "NVIDIA Container Toolkit" in log and "gpu_fallback='cpu'" in log


@pytest.mark.gpu
def test_training_on_gpus_through_airflow(tfpipe_home, trainer_image, docker_client):
    """Where the engine has the NVIDIA runtime and the image a CUDA root, training uses the GPUs."""
    if "nvidia" not in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("no GPU visible: the Docker engine has no NVIDIA runtime (install the NVIDIA Container Toolkit)")
    summary, log = run_dag("tfpipe_digits_manual", {"gpus": "all", "epochs": 2}, home=tfpipe_home,
                           image=trainer_image)
    assert summary["state"] == "success", log[-6000:]
    assert "requesting all GPUs for train" in log
    assert re.search(r"tensorflow 2\.9\.3, [1-9][0-9]* GPU\(s\)", log), "the training container saw no GPU"


def test_early_stopping_through_airflow_with_the_patience_from_the_run_s_conf(tfpipe_home, trainer_image, tmp_path):
    """The DAG sets a min_delta no val_loss change reaches and a patience of 5; the run's conf asks for
    1: training stops after epoch 2 of 8, and the exported model carries epoch 1's weights and says so."""
    dags = tmp_path / "dags"
    write_dag(dags, "tfpipe_test_early", training={
        "model": "mlp", "epochs": 8, "batch_size": 64, "early_stopping_patience": 5,
        "early_stopping_min_delta": 100}, evaluation={"threshold": 0.0, "tolerance": 1.0})  # one epoch's model
    summary, log = run_dag("tfpipe_test_early", {"early_stopping_patience": 1}, home=tfpipe_home,
                           image=trainer_image, dags_folder=dags)
    assert summary["state"] == "success", log[-8000:]
    assert "early stopping after epoch 2: val_loss has not improved by more than 100 for 1 epoch(s)" in log
    run_dir = next((tfpipe_home / "work" / "runs" / "tfpipe_test_early").iterdir())
    assert json.loads((run_dir / "config" / "train.json").read_text())["training"]["early_stopping_patience"] == 1
    history = json.loads((run_dir / "metrics.json").read_text())
    assert [(h["epoch"], h.get("best", False)) for h in history] == [(1, True), (2, False)]
    assert summary["blessed"] is True
    training = json.loads((Path(summary["model_dir"]) / "metadata.json").read_text())["training"]
    assert (training["epochs"], training["best_epoch"], training["stopped_early"]) == (2, 1, True)
    assert training["final_val_accuracy"] == history[0]["val_accuracy"]
    # evaluate scored epoch 1's weights on the same eval split
    assert summary["metrics"]["accuracy"] == pytest.approx(history[0]["val_accuracy"], abs=1e-6)
