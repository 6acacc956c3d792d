"""Stage-in from the emulator into a data volume, through the Docker engine (real containers)."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from tests.integration.conftest import fake_context
from tfpipe.gcs.plan import MANIFEST_NAME
from tfpipe.operators.gcs import GcsStageInOperator

#: The dag_id label of this module's helper containers (tests on the other xdist worker run theirs).
HELPER_DAG = "tfpipe_gcs_stage_in_test"

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

    first = op.execute(fake_context("stage_in", dag_id=HELPER_DAG))
    assert (first["objects"], first["downloaded"], first["deleted"]) == (3, 3, 0)
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == [
        MANIFEST_NAME, "2024/c.csv", "a.csv", "b.csv"]
    assert (target / "b.csv").read_bytes() == b"x,label\n2,1\n"
    assert (target / "a.csv").stat().st_uid == 1000, "staged files belong to the stage user"
    assert "staged 3/3 objects, 0.0 MB" in capsys.readouterr().out  # the task log (Airflow logs to stdout)
    manifest = json.loads((target / MANIFEST_NAME).read_text())
    assert manifest["source"] == uri and sorted(manifest["objects"]) == ["2024/c.csv", "a.csv", "b.csv"]
    a_inode = (target / "a.csv").stat().st_ino

    # change one object, delete another; a file that never came from the bucket stays
    bucket.blob("raw/digits/b.csv").upload_from_string(b"x,label\n2,1\n5,0\n")
    bucket.blob("raw/digits/2024/c.csv").delete()
    (target / "local-notes.txt").write_text("mine")
    second = op.execute(fake_context("stage_in", dag_id=HELPER_DAG))
    assert (second["downloaded"], second["unchanged"], second["deleted"], second["untracked"]) == (1, 1, 1, 1)
    assert (target / "b.csv").read_bytes() == b"x,label\n2,1\n5,0\n"
    assert not (target / "2024").exists(), "the deleted object's file and its empty folder are removed"
    assert (target / "a.csv").stat().st_ino == a_inode, "the unchanged object was not staged again"
    assert (target / "local-notes.txt").exists() and "left in place" in capsys.readouterr().out

    # nothing changed: nothing moves; a run Param wins over source_uri
    third = op.execute(fake_context("stage_in", params={"data_uri": uri}, dag_id=HELPER_DAG))
    assert (third["downloaded"], third["deleted"]) == (0, 0)
    assert docker_client.containers.list(all=True, filters={"label": ["tfpipe.role=gcs-stage-in",
                                                                      f"tfpipe.dag_id={HELPER_DAG}"]}) == []


def test_one_object_replaces_the_data_file(tmp_path, trainer_image, bucket):
    bucket.blob("exports/digits.csv").upload_from_string(b"x,label\n1,0\n")
    (tmp_path / "data" / "digits").mkdir(parents=True)
    (tmp_path / "data" / "digits" / "digits.csv").write_text("stale")
    op = _operator(tmp_path, trainer_image, "digits/digits.csv")
    result = op.execute(fake_context("stage_in", params={"data_uri": f"gs://{bucket.name}/exports/digits.csv"}))
    assert result["target"] == f"{tmp_path}/data/digits/digits.csv" and result["downloaded"] == 1
    assert (tmp_path / "data" / "digits" / "digits.csv").read_bytes() == b"x,label\n1,0\n"
    assert (tmp_path / "data" / "digits" / f".digits.csv{MANIFEST_NAME}").is_file()


def test_objects_in_nested_folders_arrive_intact_owned_by_the_stage_user(tmp_path, trainer_image, bucket):
    """Objects of several sizes (empty to a few kB), some in nested folders: every byte arrives, each
    file and each directory the tar made belongs to the stage user, and the manifest lists them all."""
    bodies = {f"raw/d/{'deep/' * (i % 3)}part-{i}.bin": bytes([i]) * (i * 700) for i in range(7)}
    for name, body in bodies.items():
        bucket.blob(name).upload_from_string(body)
    result = _operator(tmp_path, trainer_image, "d/", source_uri=f"gs://{bucket.name}/raw/d").execute(
        fake_context("stage_in"))
    assert (result["downloaded"], result["bytes_downloaded"]) == (7, sum(map(len, bodies.values())))
    target = tmp_path / "data" / "d"
    for name, body in bodies.items():
        staged = target / name[len("raw/d/"):]
        assert staged.read_bytes() == body, name
        assert (staged.stat().st_uid, staged.stat().st_gid) == (1000, 1000)
    for made in ("deep", "deep/deep"):
        st = (target / made).stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (1000, 1000, 0o755), made
    assert sorted(json.loads((target / MANIFEST_NAME).read_text())["objects"]) == sorted(
        n[len("raw/d/"):] for n in bodies)


def test_a_daemonic_task_process_stages_in(tmp_path, trainer_image, bucket):
    """A Celery worker's pool processes are daemonic, and so is the task process Airflow forks from
    one; multiprocessing refuses children to a daemonic process. The stage-in downloads in threads,
    so it runs there as anywhere: every byte arrives, and the process is still daemonic after."""
    import multiprocessing

    bodies = {f"raw/many/part-{i}.bin": bytes([i]) * (i * 300 + 1) for i in range(6)}
    for name, body in bodies.items():
        bucket.blob(name).upload_from_string(body)
    op = _operator(tmp_path, trainer_image, "many/", source_uri=f"gs://{bucket.name}/raw/many")
    fork = multiprocessing.get_context("fork")
    answers = fork.Queue()

    def task_process() -> None:
        try:
            result = op.execute(fake_context("stage_in", dag_id=HELPER_DAG))
            answers.put(("done", result["downloaded"], multiprocessing.current_process().daemon))
        except BaseException as err:  # handed to the test, which fails naming it
            answers.put(("failed", repr(err), None))

    child = fork.Process(target=task_process, daemon=True)
    child.start()
    try:
        outcome = answers.get(timeout=180)
    finally:
        child.join(timeout=30)
    assert outcome == ("done", len(bodies), True), outcome
    for name, body in bodies.items():
        assert (tmp_path / "data" / "many" / name[len("raw/many/"):]).read_bytes() == body, name


def test_an_object_deleted_after_listing_is_named_and_no_manifest_is_written(tmp_path, trainer_image, bucket,
                                                                             monkeypatch):
    """An object is deleted between the listing and its download: the task fails with an
    error naming the object (retried: the next try lists again), and the manifest, written last, is
    not there, so the half-staged directory never passes for a complete sync."""
    import tfpipe.gcs.sync
    from tfpipe.hooks.gcs import GcsTransferError

    for i in range(4):
        bucket.blob(f"raw/d/part-{i}.csv").upload_from_string(f"x,label\n{i},0\n".encode())
    real_list = tfpipe.gcs.sync.list_objects

    def list_then_delete(*args, **kwargs):
        listed = real_list(*args, **kwargs)
        bucket.blob("raw/d/part-2.csv").delete()  # as another writer would, after the listing
        return listed

    monkeypatch.setattr(tfpipe.gcs.sync, "list_objects", list_then_delete)
    with pytest.raises(GcsTransferError, match=r"downloading gs://[^ ]+/raw/d/part-2\.csv: .*\(404\)"):
        _operator(tmp_path, trainer_image, "d/", source_uri=f"gs://{bucket.name}/raw/d").execute(
            fake_context("stage_in"))
    assert not (tmp_path / "data" / "d" / MANIFEST_NAME).exists()


def test_a_folder_onto_a_data_file_fails_naming_both_and_leaves_the_file(tmp_path, trainer_image, bucket):
    """The engine's survey finds the data path is a file while the objects download: the task fails
    without retry, saying what to change, and the file is left as it was."""
    from tfpipe.exceptions import StageInError

    for i in range(3):
        bucket.blob(f"raw/d/part-{i}.csv").upload_from_string(b"x,label\n1,0\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "d").write_text("mine")
    with pytest.raises(StageInError, match=r"is a folder of objects, but the data path 'd' is a file .* Fix:"):
        _operator(tmp_path, trainer_image, "d/", source_uri=f"gs://{bucket.name}/raw/d").execute(
            fake_context("stage_in"))
    assert (tmp_path / "data" / "d").read_text() == "mine"


def test_a_new_target_directory_is_made_for_the_stage_user_and_later_syncs_move_only_changes(
        tmp_path, trainer_image, bucket, monkeypatch):
    """A target directory that does not exist yet is made with its missing parents, owned by the
    stage user (an existing parent keeps its owner). A second sync downloads nothing; after an
    object's deletion the third only deletes its file and writes the manifest on its own. A file on
    the way to the target directory fails the task and is left as it was."""
    from tfpipe.exceptions import StageFailedError
    from tfpipe.hooks.docker import VolumeHelper

    for i in range(3):
        bucket.blob(f"raw/d/{'sub/' * (i % 2)}part-{i}.csv").upload_from_string(f"x,label\n{i},0\n".encode())
    programs: list[str] = []
    real_run = VolumeHelper.run_program

    def recording(self, program, payload, **kwargs):
        programs.append(program)
        return real_run(self, program, payload, **kwargs)

    monkeypatch.setattr(VolumeHelper, "run_program", recording)
    (tmp_path / "data" / "a").mkdir(parents=True)
    op = _operator(tmp_path, trainer_image, "a/b/c/", source_uri=f"gs://{bucket.name}/raw/d")
    first = op.execute(fake_context("stage_in"))
    assert first["downloaded"] == 3 and programs == ["list_dir"]
    for made in ("a/b", "a/b/c", "a/b/c/sub"):
        st = (tmp_path / "data" / made).stat()
        assert (st.st_uid, st.st_gid) == (1000, 1000), made
    assert (tmp_path / "data" / "a").stat().st_uid == 0, "an existing parent keeps its owner"
    assert (tmp_path / "data" / "a/b/c/sub/part-1.csv").read_bytes() == b"x,label\n1,0\n"
    assert (tmp_path / "data" / "a/b/c" / MANIFEST_NAME).is_file()

    second = op.execute(fake_context("stage_in"))
    assert (second["downloaded"], second["unchanged"], programs[1:]) == (0, 3, ["list_dir"])
    # only a deletion: no files to stream, so the manifest goes in on its own
    bucket.blob("raw/d/part-0.csv").delete()
    third = op.execute(fake_context("stage_in"))
    assert (third["downloaded"], third["deleted"], programs[2:]) == (0, 1, ["list_dir", "delete_files"])
    assert sorted(json.loads((tmp_path / "data" / "a/b/c" / MANIFEST_NAME).read_text())["objects"]) == [
        "part-2.csv", "sub/part-1.csv"]

    (tmp_path / "data" / "f").write_text("mine")
    with pytest.raises(StageFailedError):
        _operator(tmp_path, trainer_image, "f/g/", source_uri=f"gs://{bucket.name}/raw/d").execute(
            fake_context("stage_in"))
    assert (tmp_path / "data" / "f").read_text() == "mine"


def test_a_refused_tar_stream_fails_with_the_engine_error_and_writes_no_manifest(tmp_path, trainer_image, bucket,
                                                                                monkeypatch):
    """When the engine refuses the tar stream, the task fails with the engine's error (not a broken
    stream's), and no file and no manifest is staged."""
    from tfpipe.exceptions import StageFailedError
    from tfpipe.hooks.docker import VolumeHelper

    for i in range(5):
        bucket.blob(f"raw/d/part-{i}.csv").upload_from_string(f"x,label\n{i},0\n".encode())
    seen = []

    def refused(helper, path, data):
        seen.append(path)
        raise StageFailedError(f"the Docker engine refused to extract an archive into {path}", exit_code=None)

    monkeypatch.setattr(VolumeHelper, "put_archive", refused)
    with pytest.raises(StageFailedError, match="refused to extract an archive into /vol/a/b"):
        _operator(tmp_path, trainer_image, "a/b/", source_uri=f"gs://{bucket.name}/raw/d").execute(
            fake_context("stage_in"))
    assert seen == ["/vol/a/b"], "one tar stream, into the target directory"
    assert list((tmp_path / "data" / "a" / "b").iterdir()) == [], "the survey made the directory; nothing is in it"


def test_no_uri_skips(tmp_path, trainer_image):
    from airflow.providers.common.compat.sdk import AirflowSkipException

    with pytest.raises(AirflowSkipException, match="no data URI"):
        _operator(tmp_path, trainer_image, "digits/").execute(fake_context("stage_in", params={"data_uri": None}))


class DroppingProxy(threading.Thread):
    """A TCP proxy in front of the emulator that resets the first ``drop`` connections it accepts
    (as a flaky network does) and forwards every later one, byte for byte."""

    def __init__(self, upstream: str, drop: int):
        super().__init__(daemon=True)
        host, port = upstream.rsplit("//", 1)[1].split(":")
        self.upstream = (host, int(port))
        self.drop, self.dropped, self.forwarded = drop, 0, 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if self.dropped < self.drop:
                self.dropped += 1
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                conn.close()  # with linger 0: a TCP reset
                continue
            try:
                upstream = socket.create_connection(self.upstream)
            except OSError:  # the emulator is gone (the session's end): nothing to forward to
                conn.close()
                continue
            self.forwarded += 1
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pump(src, dst):
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.stopped.set()
        self.listener.close()


class HelperInspector(threading.Thread):
    """Records ``docker inspect`` of every container labelled ``label`` (``tfpipe.role=<role>`` for a
    bare role) while it exists."""

    def __init__(self, client, role: str = "", *, label: str = ""):
        super().__init__(daemon=True)
        self.client, self.label = client, label or f"tfpipe.role={role}"
        self.seen: dict[str, dict] = {}
        self.stopped = threading.Event()

    def run(self):
        while not self.stopped.is_set():
            for c in self.client.api.containers(all=True, filters={"label": self.label}):
                if c["Id"] not in self.seen:
                    try:
                        self.seen[c["Id"]] = self.client.api.inspect_container(c["Id"])
                    except Exception:  # removed meanwhile
                        pass
            time.sleep(0.02)


def test_network_errors_are_retried_and_helpers_have_no_network(tmp_path, trainer_image, bucket, docker_client,
                                                                 emulator_env, monkeypatch):
    """The first connections to Cloud Storage are reset; the transfer retries and completes. The
    helper container that writes into the volume has no network of its own."""
    objects = {f"raw/digits/part-{i}.csv": f"x,label\n{i},0\n".encode() for i in range(3)}
    for name, body in objects.items():
        bucket.blob(name).upload_from_string(body)
    proxy = DroppingProxy(emulator_env, drop=2)
    proxy.start()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    inspector = HelperInspector(docker_client, "gcs-stage-in")
    inspector.start()
    try:
        result = _operator(tmp_path, trainer_image, "digits/", source_uri=f"gs://{bucket.name}/raw/digits").execute(
            fake_context("stage_in"))
    finally:
        inspector.stopped.set()
        inspector.join(timeout=5)
        proxy.close()
    assert proxy.dropped == 2 and proxy.forwarded >= 1, "the proxy reset connections, then forwarded the retries"
    assert (result["objects"], result["downloaded"]) == (3, 3)
    for name, body in objects.items():
        assert (tmp_path / "data" / "digits" / name.rsplit("/", 1)[1]).read_bytes() == body
    assert inspector.seen, "never saw a stage-in helper container"
    for seen in inspector.seen.values():
        assert seen["HostConfig"]["NetworkMode"] == "none"
        assert list(seen["NetworkSettings"]["Networks"]) == ["none"]
        assert seen["HostConfig"]["Privileged"] is False


#: Run in the trainer image (it has pyarrow; the host venv does not): two days of Parquet partitions
#: under /out/dt=YYYY-MM-DD/, with a number that has nulls, a text category with nulls and a boolean.
DAILY_PARQUET = """
import os, pyarrow as pa, pyarrow.parquet as pq
for day, offset in (("2026-12-05", 0), ("2026-12-06", 1)):
    os.makedirs("/out/dt=%s" % day)
    n = 120
    pq.write_table(pa.table({
        "amount": pa.array([None if i % 9 == 4 else float(i % 50 + offset) for i in range(n)], pa.float64()),
        "plan": pa.array([None if i % 13 == 6 else ("basic", "plus", "pro")[i % 3] for i in range(n)], pa.string()),
        "autopay": pa.array([i % 4 < 2 for i in range(n)], pa.bool_()),
        "label": pa.array([int(i % 3 == 0) for i in range(n)], pa.int64())}), "/out/dt=%s/part-0.parquet" % day)
"""


def test_a_date_partitioned_parquet_folder_staged_in_is_prepared_with_its_window_and_types(
        tmp_path, trainer_image, bucket, docker_client):
    """Date partitions of Parquet files (numbers and texts with nulls, booleans) in a bucket arrive byte
    for byte, and prep reads the staged folder as it reads a local one: the window's partitions, the
    types from Parquet's, the missing cells counted."""
    import os

    from tfpipe import PipelineConfig, contract
    from tfpipe.specs import plan_pipeline
    from tfpipe.tries import TryIdentity, resolve_try

    made = tmp_path / "made"
    made.mkdir()
    docker_client.containers.run(trainer_image, ["python3", "-c", DAILY_PARQUET], remove=True, network_mode="none",
                                 user=f"{os.getuid()}:{os.getgid()}", volumes={str(made): {"bind": "/out", "mode": "rw"}})
    files = sorted(p for p in made.rglob("*.parquet"))
    assert len(files) == 2
    for path in files:
        bucket.blob("lake/events/" + path.relative_to(made).as_posix()).upload_from_filename(str(path))
    home = tmp_path / "home"
    result = _operator(home, trainer_image, "events/", source_uri=f"gs://{bucket.name}/lake/events").execute(
        fake_context("stage_in"))
    assert result["downloaded"] == 2
    for path in files:
        assert (home / "data" / "events" / path.relative_to(made)).read_bytes() == path.read_bytes()

    cfg = PipelineConfig.from_dict({
        "dag_id": "staged_parquet", "image": {"ref": trainer_image},
        "volumes": {name: str(home / name) for name in ("data", "work", "models")},
        "data": {"path": "events", "format": "parquet", "window_days": 2}})
    for name in ("work", "models"):
        (home / name).mkdir(exist_ok=True)
        os.chown(home / name, 1000, 1000)
    spec = next(s for s in plan_pipeline(cfg) if s.stage == "prep")
    plan = resolve_try(spec, TryIdentity("staged_parquet", "manual__1", "prep", data_interval_end="2026-12-07T00:00:00Z"))
    docker_client.containers.run(
        trainer_image, list(spec.command), remove=True, network_mode="none", user="1000:1000",
        environment={contract.CONFIG_ENV: contract.dumps(plan.config)},
        volumes={str(home / "data"): {"bind": contract.CONTAINER_DATA, "mode": "ro"},
                 str(home / "work"): {"bind": contract.CONTAINER_WORK, "mode": "rw"},
                 str(home / "models"): {"bind": contract.CONTAINER_MODELS, "mode": "rw"}})
    (dataset,) = (home / "work" / "datasets").glob("*/schema.json")
    schema = json.loads(dataset.read_text())
    assert schema["format"] == "parquet" and sum(schema["counts"].values()) == 240
    features = {f["name"]: f for f in schema["features"]}
    assert {n: f["type"] for n, f in features.items()} == {"amount": "float", "plan": "categorical",
                                                           "autopay": "boolean"}
    assert sum(features["amount"]["missing"].values()) == 2 * len(range(4, 120, 9))
    window = json.loads((dataset.parent / "fingerprint.json").read_text())["window"]
    assert window["partitions"] == ["dt=2026-12-05", "dt=2026-12-06"]
