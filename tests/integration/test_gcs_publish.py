"""Publishing an exported version to the emulator: resumable, idempotent, marker last."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.integration.conftest import fake_context, object_names
from tfpipe.hooks.gcs import TfpipeGcsHook
from tfpipe.exceptions import PublishConflictError
from tfpipe.gcs.publish import MARKER_NAME, list_published_versions, local_files, publish_version, version_uri
from tfpipe.hooks.gcs import GcsUri
from tfpipe.operators.gcs import GcsPublishOperator

#: The dag_id label of this module's helper containers (tests on the other xdist worker run theirs).
HELPER_DAG = "tfpipe_gcs_publish_test"

pytestmark = [pytest.mark.gcs, pytest.mark.integration]

FILES = {"saved_model.pb": 300_000, "variables/variables.index": 2_000,
         "variables/variables.data-00000-of-00001": 900_000, "metadata.json": 500, "assets/vocab.txt": 0}


def _fake_export(models: Path, name: str, version: int) -> Path:
    """A version directory as export leaves it (owned by the stage user, like a real export)."""
    root = models / name / str(version)
    for rel, size in FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
    for path in [models, *models.rglob("*")]:
        os.chown(path, 1000, 1000)
    return root


def test_interrupted_upload_is_completed_by_a_retry(tmp_path, trainer_image, bucket, gcs_client, docker_client):
    version_dir = _fake_export(tmp_path / "models", "digits", 7)
    base = f"gs://{bucket.name}/models"
    dest = version_uri(GcsUri.parse(base), "digits", 7)
    hook = TfpipeGcsHook()

    # try 1 dies after two uploads: its third file vanishes from the worker's copy before it is read
    files = local_files(shutil.copytree(version_dir, tmp_path / "worker-copy"))
    os.remove(files[2].path)
    with pytest.raises(FileNotFoundError):
        publish_version(hook, dest, files, max_workers=1)
    landed = object_names(gcs_client, bucket.name, dest.prefix)
    assert 2 <= len(landed) < len(FILES) and f"{dest.prefix}{MARKER_NAME}" not in landed
    assert list_published_versions(base, "digits") == [], "a version without its marker is invisible"
    generations = {b.name: b.generation for b in gcs_client.list_blobs(bucket.name, prefix=dest.prefix)}
    # debris of a crashed try: a half-written file under another name, and a corrupted one
    bucket.blob(f"{dest.prefix}saved_model.pb.partial").upload_from_string(b"junk")
    corrupt = next(rel for rel in FILES if f"{dest.prefix}{rel}" not in landed)
    bucket.blob(f"{dest.prefix}{corrupt}").upload_from_string(b"truncated")

    # try 2, through the operator: reads the version out of the volume via the engine and completes it
    op = GcsPublishOperator(task_id="publish", models_volume=str(tmp_path / "models"), model_name="digits",
                            image=trainer_image, destination_uri=base, max_workers=4)
    result = op.execute(fake_context("publish", xcom={"version": 7, "model_name": "digits",
                                                      "model_dir": "/models/digits/7"}, dag_id=HELPER_DAG))
    assert (result["files"], result["skipped"], result["uploaded"], result["deleted_stray"]) == (
        5, len(landed), 5 - len(landed), 1), "only the missing and the corrupted files are uploaded"
    names = object_names(gcs_client, bucket.name, dest.prefix)
    assert names == sorted([f"{dest.prefix}{rel}" for rel in FILES] + [f"{dest.prefix}{MARKER_NAME}"])
    for name, generation in generations.items():
        assert gcs_client.bucket(bucket.name).get_blob(name).generation == generation, f"{name} re-uploaded"
    for rel in FILES:
        assert bucket.blob(f"{dest.prefix}{rel}").download_as_bytes() == (version_dir / rel).read_bytes()
    marker = json.loads(bucket.blob(f"{dest.prefix}{MARKER_NAME}").download_as_bytes())
    assert sorted(f["name"] for f in marker["files"]) == sorted(FILES)
    blobs = {b.name: b for b in gcs_client.list_blobs(bucket.name, prefix=dest.prefix)}
    assert all(blobs[f"{dest.prefix}{f['name']}"].crc32c == f["crc32c"] for f in marker["files"])
    assert {f["name"]: f["size"] for f in marker["files"]} == {rel: (version_dir / rel).stat().st_size for rel in FILES}
    assert marker["version"] == 7 and marker["model_name"] == "digits"
    assert list_published_versions(base, "digits") == [7]
    assert docker_client.containers.list(all=True, filters={"label": ["tfpipe.role=gcs-publish",
                                                                      f"tfpipe.dag_id={HELPER_DAG}"]}) == []

    # try 3 (say, a cleared task): nothing to do; a different export under the same version is refused
    again = op.execute(fake_context("publish", params={"publish_uri": base}, xcom={"version": 7}))
    assert again["already_published"] is True and again["uploaded"] == 0
    (version_dir / "metadata.json").write_bytes(b"{}")
    with pytest.raises(PublishConflictError, match="immutable"):
        publish_version(hook, dest, local_files(str(version_dir)))


def test_listing_ignores_versions_without_marker(bucket):
    for name in ("m/digits/1/saved_model.pb", "m/digits/1/_COMPLETE", "m/digits/2/saved_model.pb",
                 "m/digits/10/_COMPLETE", "m/digits/latest/_COMPLETE", "m/digits-old/3/_COMPLETE"):
        bucket.blob(name).upload_from_string(b"{}")
    assert list_published_versions(f"gs://{bucket.name}/m", "digits") == [1, 10]
    assert list_published_versions(f"gs://{bucket.name}/m/", "nothing") == []


def test_no_uri_or_no_export_skips(tmp_path, trainer_image, emulator_env):
    from airflow.providers.common.compat.sdk import AirflowSkipException

    op = GcsPublishOperator(task_id="publish", models_volume=str(tmp_path), model_name="digits", image=trainer_image)
    with pytest.raises(AirflowSkipException, match="no publish URI"):
        op.execute(fake_context("publish", xcom={"version": 1}))
    with pytest.raises(AirflowSkipException, match="exported no version"):
        op.execute(fake_context("publish", params={"publish_uri": "gs://models-x/m"}, xcom=None))
