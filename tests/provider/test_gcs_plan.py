"""Cloud Storage without a network: URIs, sync planning, config and DAG wiring, credential errors."""

from __future__ import annotations

import copy
import json
import os
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest

from tfpipe.config import PipelineConfig
from tfpipe.exceptions import TfpipeConfigError
from tfpipe.hooks.gcs import GcsAccessError, GcsUri, TfpipeGcsHook
from tfpipe.exceptions import StageInError
from tfpipe.gcs.plan import MANIFEST_NAME, plan_layout, plan_sync
from tfpipe.gcs.publish import version_uri
from tfpipe.operators.gcs import GcsPublishOperator, GcsStageInOperator

pytestmark = pytest.mark.gcs

IMAGE = "tfpipe/trainer:0.1.0"
BASE = {"dag_id": "gcs_unit", "image": {"ref": IMAGE},
        "volumes": {"data": "/srv/data", "work": "/srv/work", "models": "/srv/models"},
        "data": {"path": "digits/digits.csv"}}


def blob(name: str, *, generation: int = 1, crc32c: str = "AAAAAA==", size: int = 10):
    """An object as listed (the attributes the planner reads), not a client stand-in."""
    return SimpleNamespace(name=name, generation=generation, crc32c=crc32c, size=size,
                           updated=datetime(2026, 1, 1, tzinfo=timezone.utc))


# -- URIs and config --------------------------------------------------------------------------------

@pytest.mark.parametrize("uri, bucket, prefix", [
    ("gs://raw-data", "raw-data", ""), ("gs://raw-data/", "raw-data", ""),
    ("gs://raw.data.example/a/b.csv", "raw.data.example", "a/b.csv"), ("gs://raw_data/a/", "raw_data", "a/"),
])
def test_uris_parse(uri, bucket, prefix):
    parsed = GcsUri.parse(uri)
    assert (parsed.bucket, parsed.prefix) == (bucket, prefix)


@pytest.mark.parametrize("uri, words", [
    ("s3://bucket/x", ["not a gs:// URI", "Fix"]), ("gs://", ["names no bucket"]),
    ("gs://My_Bucket/x", ["not a valid bucket name"]), ("gs://ab/x", ["not a valid bucket name"]),
    ("gs://bucket//x", ["empty, '.' or '..' segment"]), ("gs://bucket/a/../b", ["'..'"]),
    ("gs://bucket/a\nb", ["control characters"]), ("bucket/x", ["gs://BUCKET/PREFIX"]),
])
def test_malformed_uris_name_the_problem_and_fix(uri, words):
    with pytest.raises(TfpipeConfigError) as err:
        PipelineConfig.from_dict({**BASE, "data_uri": uri})
    message = str(err.value)
    assert message.startswith("data_uri:") and "Fix:" in message
    for word in words:
        assert word in message
    with pytest.raises(TfpipeConfigError, match="^publish_uri:"):
        PipelineConfig.from_dict({**BASE, "publish_uri": uri})


def test_config_defaults_and_conn_id():
    cfg = PipelineConfig.from_dict(BASE)
    assert (cfg.data_uri, cfg.publish_uri, cfg.gcp_conn_id) == (None, None, "google_cloud_default")
    cfg = PipelineConfig.from_dict({**BASE, "data_uri": "gs://raw-data/digits/", "publish_uri": "gs://models-x",
                                    "gcp_conn_id": "gcs_prod"})
    assert cfg.data_uri == "gs://raw-data/digits/" and cfg.gcp_conn_id == "gcs_prod"
    with pytest.raises(TfpipeConfigError, match="gcp_conn_id"):
        PipelineConfig.from_dict({**BASE, "gcp_conn_id": ""})


def test_version_uri():
    assert str(version_uri(GcsUri.parse("gs://models-x"), "digits", 3)) == "gs://models-x/digits/3/"
    assert str(version_uri(GcsUri.parse("gs://models-x/prod/"), "digits", 12)) == "gs://models-x/prod/digits/12/"


# -- layout and sync plan ---------------------------------------------------------------------------

def test_one_object_becomes_the_data_file():
    uri = GcsUri.parse("gs://b-1/raw/digits.csv")
    layout = plan_layout(uri, [blob("raw/digits.csv"), blob("raw/digits.csv.bak")], "digits/digits.csv")
    assert (layout.target_dir, list(layout.objects), layout.single) == ("digits", ["digits.csv"], "digits.csv")
    assert layout.manifest_name == ".digits.csv" + MANIFEST_NAME and layout.ignored == ("raw/digits.csv.bak",)
    # a data path with a trailing slash is a folder: the object keeps its name in it
    layout = plan_layout(uri, [blob("raw/digits.csv")], "incoming/")
    assert (layout.target_dir, list(layout.objects)) == ("incoming", ["digits.csv"])


def test_a_folder_is_laid_out_by_relative_names():
    uri = GcsUri.parse("gs://b-1/raw/digits")
    blobs = [blob("raw/digits/"), blob("raw/digits/a.csv"), blob("raw/digits/2024/b.csv"),
             blob("raw/digits-old/c.csv"), blob("raw/digits/empty/")]
    layout = plan_layout(uri, blobs, "digits/")
    assert layout.target_dir == "digits" and layout.single is None
    assert sorted(layout.objects) == ["2024/b.csv", "a.csv"]
    assert layout.ignored == ("raw/digits-old/c.csv",) and layout.manifest_name == MANIFEST_NAME
    whole_bucket = plan_layout(GcsUri.parse("gs://b-1"), [blob("x/y.png")], "images")
    assert list(whole_bucket.objects) == ["x/y.png"]


@pytest.mark.parametrize("name", ["raw/a/../../etc/passwd", "raw/a//b.csv", "raw/./a.csv", "raw/a\\b.csv",
                                  f"raw/{MANIFEST_NAME}"])
def test_unsafe_object_names_are_refused(name):
    with pytest.raises(StageInError, match="Fix: rename the object"):
        plan_layout(GcsUri.parse("gs://b-1/raw/"), [blob(name)], "data")


def test_sync_plan_downloads_only_what_changed():
    objects = plan_layout(GcsUri.parse("gs://b-1/raw/"), [
        blob("raw/same.csv", generation=1, crc32c="AAAA"),
        blob("raw/rewritten-same-bytes.csv", generation=9, crc32c="BBBB"),
        blob("raw/changed.csv", generation=5, crc32c="NEW="),
        blob("raw/new.csv"),
        blob("raw/lost-locally.csv", crc32c="CCCC"),
    ], "d").objects
    manifest = {"objects": {
        "same.csv": {"generation": 1, "crc32c": "AAAA", "size": 10},
        "rewritten-same-bytes.csv": {"generation": 2, "crc32c": "BBBB", "size": 10},
        "changed.csv": {"generation": 4, "crc32c": "OLD=", "size": 10},
        "lost-locally.csv": {"generation": 1, "crc32c": "CCCC", "size": 10},
        "deleted.csv": {"generation": 1, "crc32c": "DDDD", "size": 10},
        "deleted-and-gone.csv": {"generation": 1, "crc32c": "EEEE", "size": 10},
    }}
    local = {"same.csv": 10, "rewritten-same-bytes.csv": 10, "changed.csv": 10, "deleted.csv": 10, "mine.csv": 3}
    plan = plan_sync(objects, manifest, local)
    assert sorted(o.rel for o in plan.download) == ["changed.csv", "lost-locally.csv", "new.csv"]
    assert sorted(o.rel for o in plan.unchanged) == ["rewritten-same-bytes.csv", "same.csv"]
    assert plan.delete == ["deleted.csv"] and plan.untracked == ["mine.csv"]
    # no manifest (first sync): everything is downloaded, nothing deleted
    first = plan_sync(objects, None, local)
    assert len(first.download) == len(objects) and first.delete == []


def test_objects_without_crc32c_are_compared_by_generation():
    """An object without a CRC32C (a composite upload has none) cannot be compared by content, so
    the generation the manifest recorded decides: the same generation is the same object, another
    one (or none recorded) may hold other bytes and is downloaded."""
    objects = plan_layout(GcsUri.parse("gs://b-1/raw/"), [
        blob("raw/same-generation.csv", generation=7, crc32c=None),
        blob("raw/new-generation.csv", generation=8, crc32c=None),
        blob("raw/no-generation-recorded.csv", generation=3, crc32c=None),
        blob("raw/never-synced.csv", generation=1, crc32c=None),
    ], "d").objects
    assert all(o.crc32c is None for o in objects.values())
    manifest = {"objects": {
        "same-generation.csv": {"generation": 7, "crc32c": None, "size": 10},
        "new-generation.csv": {"generation": 5, "crc32c": None, "size": 10},
        # a CRC32C recorded without a generation does not stand in for the object's missing one
        "no-generation-recorded.csv": {"crc32c": "AAAAAA==", "size": 10},
    }}
    local = {"same-generation.csv": 10, "new-generation.csv": 10, "no-generation-recorded.csv": 10,
             "never-synced.csv": 10}
    plan = plan_sync(objects, manifest, local)
    assert [o.rel for o in plan.unchanged] == ["same-generation.csv"]
    assert sorted(o.rel for o in plan.download) == ["never-synced.csv", "new-generation.csv",
                                                   "no-generation-recorded.csv"]
    assert plan.delete == [] and plan.untracked == []


# -- prep never reads the manifest ------------------------------------------------------------------

def test_prep_inputs_exclude_the_manifest(tmp_path: Path):
    from trainer.sources import input_files

    (tmp_path / "csvdir").mkdir()
    for name in ("a.csv", MANIFEST_NAME, ".digits.csv" + MANIFEST_NAME):
        (tmp_path / "csvdir" / name).write_text("x,label\n1,0\n")
    (tmp_path / "imgs" / "cat").mkdir(parents=True)
    (tmp_path / "imgs" / "cat" / "1.png").write_bytes(b"png")
    (tmp_path / "imgs" / MANIFEST_NAME).write_text("{}")

    def files(path, fmt):
        cfg = {"paths": {"data": str(tmp_path)}, "data": {"path": path, "format": fmt}}
        return [rel for rel, _ in input_files(cfg)]

    assert files("csvdir", "csv") == ["a.csv"]
    assert files("csvdir/a.csv", "csv") == ["a.csv"]
    assert files("imgs", "images") == ["cat/1.png"]


# -- DAG wiring -------------------------------------------------------------------------------------

@pytest.mark.parametrize("settings,tasks", [
    ({}, set()),
    ({"data_uri": "gs://raw-data/digits/"}, {"stage_in"}),
    ({"publish_uri": "gs://models-x/prod"}, {"publish"}),
    ({"gcs_tasks": True}, {"stage_in", "publish"}),
])
def test_bucket_tasks_and_params_only_where_a_bucket_is_used(settings, tasks):
    """Each Cloud Storage task, with its run Param, exists where its URI is configured, or with gcs_tasks."""
    from tfpipe import training_pipeline

    dag = training_pipeline(PipelineConfig.from_dict({**BASE, **settings}))
    assert set(dag.task_ids) - {"prep", "validate", "train", "evaluate", "export", "cleanup", "register"} == tasks
    params = {"stage_in": "data_uri", "publish": "publish_uri"}
    assert {p for p in params.values() if p in dag.params} == {params[t] for t in tasks}
    assert dag.get_task("prep").trigger_rule == ("none_failed" if "stage_in" in tasks else "all_success")
    assert ("Google Cloud Storage" in dag.doc_md) == bool(tasks)


def test_gcs_tasks_must_be_a_bool():
    with pytest.raises(TfpipeConfigError, match="^gcs_tasks: must be true or false"):
        PipelineConfig.from_dict({**BASE, "gcs_tasks": "yes"})


def test_pipeline_has_stage_in_and_publish():
    from tfpipe import training_pipeline

    dag = training_pipeline(PipelineConfig.from_dict({**BASE, "publish_uri": "gs://models-x/prod", "gcs_tasks": True}))
    assert [t.task_id for t in dag.topological_sort() if t.task_id != "cleanup"] == [
        "stage_in", "prep", "validate", "train", "evaluate", "export", "publish", "register"]
    assert dag.get_task("prep").trigger_rule == "none_failed", "a skipped stage-in must not skip prep"
    assert dag.get_task("publish").trigger_rule == "all_success", "publish only after a successful export"
    assert dag.get_task("publish").destination_uri == "gs://models-x/prod"
    assert dag.get_task("stage_in").source_uri is None
    for task in (dag.get_task("stage_in"), dag.get_task("publish")):
        assert "gcp_conn_id" not in task.template_fields and task.doc_md
    params = copy.deepcopy(dag.params)
    params["data_uri"] = "gs://raw-data/digits/"
    params.validate()
    from airflow.providers.common.compat.sdk import ParamValidationError

    for bad in ("s3://raw/digits", "/srv/raw"):
        params = copy.deepcopy(dag.params)
        with pytest.raises(ParamValidationError):
            params["publish_uri"] = bad
            params.validate()


def test_operators_check_arguments_without_io():
    # no engine at this URL and no connection: construction must not touch either
    op = GcsStageInOperator(task_id="s", data_volume="/srv/data", data_path="digits/", image=IMAGE,
                            source_uri="gs://raw-data/digits/", docker_url="tcp://192.0.2.1:2376")
    assert op.data_volume == "/srv/data"
    GcsPublishOperator(task_id="p", models_volume="/srv/models", model_name="digits", image=IMAGE,
                       destination_uri="{{ var.value.models_uri }}")
    with pytest.raises(TfpipeConfigError, match="source_uri"):
        GcsStageInOperator(task_id="s", data_volume="/srv/data", data_path="d", image=IMAGE, source_uri="gs:/x")
    with pytest.raises(TfpipeConfigError, match="data_volume"):
        GcsStageInOperator(task_id="s", data_volume="relative", data_path="d", image=IMAGE)
    with pytest.raises(TfpipeConfigError, match="model_name"):
        GcsPublishOperator(task_id="p", models_volume="/srv/models", model_name="a b", image=IMAGE)


# -- credentials that cannot work (no network needed) ----------------------------------------------

def _conn(monkeypatch, extra: dict, conn_type: str = "google_cloud_platform") -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GCS_BAD", json.dumps({"conn_type": conn_type, "extra": extra}))


@pytest.mark.parametrize("extra, words", [
    ({"key_path": "/nonexistent/key.json"}, ["key_path", "does not exist on the worker", "Fix"]),
    ({"keyfile_dict": '{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----\\nAAAA'},
     ["keyfile_dict", "not valid JSON", "Fix"]),
    ({"extra__google_cloud_platform__keyfile_dict": {"type": "service_account",
                                                     "private_key": "-----BEGIN PRIVATE KEY-----xyz"}},
     ["extra__google_cloud_platform__keyfile_dict", "not a usable service_account key", "Fix"]),
    ({"key_json": {"type": "external_account"}}, ["key type 'external_account' is not supported"]),
    ({"key_path": "/k.json", "keyfile_dict": "{}"}, ["both", "keep only one"]),
])
def test_unusable_keys_fail_without_retry_and_without_the_key(monkeypatch, extra, words):
    _conn(monkeypatch, extra)
    with pytest.raises(GcsAccessError) as err:
        TfpipeGcsHook("gcs_bad").get_conn()
    message = str(err.value)
    for word in words:
        assert word in message
    assert "PRIVATE KEY" not in message and "xyz" not in message
    from airflow.providers.common.compat.sdk import AirflowFailException

    assert isinstance(err.value, AirflowFailException), "bad credentials must not be retried"


def test_a_connection_of_another_type_is_refused(monkeypatch):
    _conn(monkeypatch, {}, conn_type="aws")
    with pytest.raises(GcsAccessError, match="conn type 'aws'"):
        TfpipeGcsHook("gcs_bad").get_conn()


@pytest.mark.parametrize("conn_type", ["google_cloud_platform", "gcp", "generic", ""])
def test_google_and_generic_connections_are_accepted(monkeypatch, conn_type):
    """A key kept in a generic connection (or one whose type is just 'gcp', or left empty) is used
    exactly as from a google_cloud_platform one: its key and project make the client."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    _conn(monkeypatch, {"keyfile_dict": {"type": "authorized_user", "client_id": "c", "client_secret": "s3cr3t",
                                         "refresh_token": "r3fresh"}, "project": "p-1"}, conn_type=conn_type)
    hook = TfpipeGcsHook("gcs_bad")
    client = hook.get_conn()
    assert client.project == "p-1"
    assert hook.credentials_source == "connection 'gcs_bad' (key in extra keyfile_dict)"


def test_key_file_is_read_on_the_worker(tmp_path, monkeypatch):
    key = tmp_path / "key.json"
    key.write_text('{"type": "authorized_user", "client_id": "c", "client_secret": "s3cr3t-value", '
                   '"refresh_token": "r3fresh-token"}')
    os.chmod(key, 0o600)
    _conn(monkeypatch, {"keyfile_path": str(key), "project": "p-1"})
    hook = TfpipeGcsHook("gcs_bad")
    credentials, project = hook.get_credentials()
    assert project == "p-1" and type(credentials).__name__ == "Credentials"
    assert str(key) in hook.credentials_source and "s3cr3t" not in hook.credentials_source


def test_a_key_file_that_is_not_json_names_the_file_and_fix(monkeypatch, tmp_path):
    key = tmp_path / "key.json"
    key.write_text('{"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----xyz')
    _conn(monkeypatch, {"key_path": str(key)})
    with pytest.raises(GcsAccessError) as err:
        TfpipeGcsHook("gcs_bad").get_conn()
    message = str(err.value)
    assert "the key file is not valid JSON" in message and "download the key again" in message
    assert "PRIVATE KEY" not in message and "xyz" not in message
