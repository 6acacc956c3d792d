"""Stage-in from the emulator into a data volume, through the Docker engine (real containers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import fake_context
from tfpipe.gcs.plan import MANIFEST_NAME
from tfpipe.operators.gcs import GcsStageInOperator

pytestmark = [pytest.mark.gcs, pytest.mark.integration]


def _operator(home: Path, image: str, data_path: str, **kwargs) -> GcsStageInOperator:
    return GcsStageInOperator(task_id="stage_in", data_volume=str(home / "data"), data_path=data_path,
                              image=image, max_workers=4, **kwargs)


def test_second_sync_downloads_only_the_changed_object(tmp_path, trainer_image, bucket, docker_client, capsys):
    for name, body in {"raw/digits/a.csv": b"x,label\n1,0\n", "raw/digits/b.csv": b"x,label\n2,1\n",
                       "raw/digits/2024/c.csv": b"x,label\n3,0\n", "raw/digits/": b"",
                       "raw/digits-old/d.csv": b"not ours\n"}.items():
        bucket.blob(name).upload_from_string(body)
    uri = f"gs://{bucket.name}/raw/digits"
    op = _operator(tmp_path, trainer_image, "digits/", source_uri=uri)
    target = tmp_path / "data" / "digits"

    first = op.execute(fake_context("stage_in"))
    assert (first["objects"], first["downloaded"], first["deleted"]) == (3, 3, 0)
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
        MANIFEST_NAME, "2024/c.csv", "a.csv", "b.csv"]
    assert (target / "b.csv").read_bytes() == b"x,label\n2,1\n"
    assert (target / "a.csv").stat().st_uid == 1000, "staged files belong to the stage user"
    assert "staged 3/3 objects" in capsys.readouterr().out  # the task log (Airflow logs to stdout)
    manifest = json.loads((target / MANIFEST_NAME).read_text())
    assert manifest["source"] == uri and sorted(manifest["objects"]) == ["2024/c.csv", "a.csv", "b.csv"]
    a_inode = (target / "a.csv").stat().st_ino

    # change one object, delete another; a file that never came from the bucket stays
    bucket.blob("raw/digits/b.csv").upload_from_string(b"x,label\n2,1\n5,0\n")
    bucket.blob("raw/digits/2024/c.csv").delete()
    (target / "local-notes.txt").write_text("mine")
    second = op.execute(fake_context("stage_in"))
    assert (second["downloaded"], second["unchanged"], second["deleted"], second["untracked"]) == (1, 1, 1, 1)
    assert (target / "b.csv").read_bytes() == b"x,label\n2,1\n5,0\n"
    assert not (target / "2024").exists(), "the deleted object's file and its empty folder are removed"
    assert (target / "a.csv").stat().st_ino == a_inode, "the unchanged object was not staged again"
    assert (target / "local-notes.txt").exists() and "left in place" in capsys.readouterr().out

    # nothing changed: nothing moves; a run Param wins over source_uri
    third = op.execute(fake_context("stage_in", params={"data_uri": uri}))
    assert (third["downloaded"], third["deleted"]) == (0, 0)
    assert docker_client.containers.list(all=True, filters={"label": "tfpipe.role=gcs-stage-in"}) == []


def test_one_object_replaces_the_data_file(tmp_path, trainer_image, bucket):
    bucket.blob("exports/digits.csv").upload_from_string(b"x,label\n1,0\n")
    (tmp_path / "data" / "digits").mkdir(parents=True)
    (tmp_path / "data" / "digits" / "digits.csv").write_text("stale")
    op = _operator(tmp_path, trainer_image, "digits/digits.csv")
    result = op.execute(fake_context("stage_in", params={"data_uri": f"gs://{bucket.name}/exports/digits.csv"}))
    assert result["target"] == f"{tmp_path}/data/digits/digits.csv" and result["downloaded"] == 1
    assert (tmp_path / "data" / "digits" / "digits.csv").read_bytes() == b"x,label\n1,0\n"
    assert (tmp_path / "data" / "digits" / f".digits.csv{MANIFEST_NAME}").is_file()


def test_no_uri_skips(tmp_path, trainer_image):
    from airflow.providers.common.compat.sdk import AirflowSkipException

    with pytest.raises(AirflowSkipException, match="no data URI"):
        _operator(tmp_path, trainer_image, "digits/").execute(fake_context("stage_in", params={"data_uri": None}))
