"""The example DAG with Cloud Storage tasks through Airflow: raw data staged in from gs://, the blessed model
published to gs:// (``tfpipe_digits_manual``: ``gcs_tasks=True``, the buckets chosen per run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import DIGITS_CSV, run_dag
from tests.integration.conftest import object_names
from tfpipe.gcs.publish import MARKER_NAME, list_published_versions

pytestmark = [pytest.mark.gcs, pytest.mark.integration]

DAG_ID = "tfpipe_digits_manual"
MODEL = "digits_experiments"  # its export.model_name


def test_digits_dag_stages_in_and_publishes(tmp_path: Path, trainer_image, bucket, gcs_client, emulator_env):
    if not DIGITS_CSV.exists():
        pytest.fail(f"{DIGITS_CSV} is missing: run `make data`")
    bucket.blob("raw/digits.csv").upload_from_filename(str(DIGITS_CSV))
    home = tmp_path / "home"  # an empty data volume: the data comes from the bucket only
    conf = {"data_uri": f"gs://{bucket.name}/raw/digits.csv", "publish_uri": f"gs://{bucket.name}/models"}

    summary, log = run_dag(DAG_ID, conf, home=home, image=trainer_image,
                           extra_env={"STORAGE_EMULATOR_HOST": emulator_env}, timeout=600)
    assert summary["state"] == "success", log[-8000:]
    assert {t: s["state"] for t, s in summary["tasks"].items()} == {
        **{t: "success" for t in ("stage_in", "prep", "validate", "train", "evaluate", "export", "publish", "cleanup")},
        "register": "skipped"}  # no MLflow connection here
    assert (home / "data" / "digits" / "digits.csv").read_bytes() == DIGITS_CSV.read_bytes()
    assert "staged 1/1 objects" in log

    # prep's inputs are the CSV alone: the manifest beside it is no input (fingerprint = content)
    fingerprints = list((home / "work" / "datasets").glob("*/fingerprint.json"))
    assert len(fingerprints) == 1
    assert [i["path"] for i in json.loads(fingerprints[0].read_text())["inputs"]] == ["digits.csv"]

    # the version is in the bucket: every exported file, and the marker listing them with CRC32Cs
    version = Path(summary["model_dir"]).name
    prefix = f"models/{MODEL}/{version}/"
    model_dir = Path(summary["model_dir"])
    exported = sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file())
    assert "saved_model.pb" in exported and "metadata.json" in exported
    assert object_names(gcs_client, bucket.name, prefix) == sorted(
        [prefix + rel for rel in exported] + [prefix + MARKER_NAME])
    marker = json.loads(bucket.blob(prefix + MARKER_NAME).download_as_bytes())
    blobs = {b.name: b for b in gcs_client.list_blobs(bucket.name, prefix=prefix)}
    assert [f["name"] for f in marker["files"]] == exported
    assert all(blobs[prefix + f["name"]].crc32c == f["crc32c"] for f in marker["files"])
    assert marker["run_id"] == summary["run_id"]
    assert list_published_versions(conf["publish_uri"], MODEL) == [int(version)]
    assert summary["published"] == f"gs://{bucket.name}/{prefix}"

    # a second run on the unchanged bucket: stage-in moves nothing, so prep finds the same
    # fingerprint and reuses its data set (a cache hit); no new data set is written
    again, log2 = run_dag(DAG_ID, conf, home=home, image=trainer_image,
                          extra_env={"STORAGE_EMULATOR_HOST": emulator_env}, timeout=600)
    assert again["state"] == "success", log2[-8000:]
    assert again["tasks"]["stage_in"]["state"] == "success" and again["tasks"]["prep"]["state"] == "success"
    assert "0 to download, 1 unchanged, 0 to delete" in log2 and "is up to date" in log2
    assert "cache hit" in log2
    assert list((home / "work" / "datasets").glob("*/fingerprint.json")) == fingerprints
