"""Fixtures of the Google Cloud Storage tests: a real emulator and the real client (nothing mocked).

The emulator (``gcp-storage-emulator``, pinned in requirements/host.lock) runs as a subprocess in its
own process group on a free loopback port, in memory, for the whole session; the process group is
killed at teardown.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import REPO, free_port, stop_group, wait_until_answers


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory) -> str:
    """``http://127.0.0.1:PORT`` of a running in-memory Cloud Storage emulator.

    The emulator is a server of its own: the compat suites' venvs (older Airflow releases) run the
    main venv's, whose pins it is locked with."""
    here, main = (Path(sys.executable).parent / "gcp-storage-emulator",
                  REPO / ".venv" / "bin" / "gcp-storage-emulator")
    binary = here if here.exists() else main
    if not binary.exists():
        pytest.fail(f"{main} is missing: `make venv` installs gcp-storage-emulator from requirements/host.lock")
    port = free_port()
    log_path = tmp_path_factory.mktemp("emulator") / "emulator.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([str(binary), "start", "--host=127.0.0.1", f"--port={port}", "--in-memory"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    host = f"http://127.0.0.1:{port}"
    try:
        wait_until_answers(f"{host}/storage/v1/b?project=test", proc, log_path, seconds=30, what="the emulator",
                           interval=0.1)
        yield host
    finally:
        stop_group(proc, timeout=10)
        log.close()


@pytest.fixture
def emulator_env(gcs_emulator, monkeypatch) -> str:
    """This process talks to the emulator, without a Google connection (anonymous credentials)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
    monkeypatch.delenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", raising=False)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    return gcs_emulator


@pytest.fixture
def gcs_client(emulator_env):
    """The real ``google.cloud.storage`` client, against the emulator."""
    from google.cloud import storage

    return storage.Client(project="test")


@pytest.fixture
def bucket(gcs_client):
    """A fresh bucket for one test."""
    return gcs_client.create_bucket(f"tfpipe-test-{uuid.uuid4().hex[:12]}")


def emulator_client(emulator: str):
    """A Cloud Storage client of ``emulator`` (anonymous). For fixtures wider than one test
    (``emulator_env`` is per test); this process's environment is left as it was."""
    from google.cloud import storage

    os.environ["STORAGE_EMULATOR_HOST"] = emulator  # the client reads it when created
    try:
        return storage.Client(project="test")
    finally:
        del os.environ["STORAGE_EMULATOR_HOST"]


def digits_bucket(emulator: str, prefix: str) -> tuple[object, dict[str, str]]:
    """``(bucket, conf)``: a new bucket on ``emulator`` holding the digits CSV at ``raw/digits.csv``, and
    the run conf that stages it in and publishes the model to ``models/`` there."""
    from tests.conftest import DIGITS_CSV

    bucket = emulator_client(emulator).create_bucket(f"{prefix}-{uuid.uuid4().hex[:10]}")
    bucket.blob("raw/digits.csv").upload_from_filename(str(DIGITS_CSV))
    return bucket, {"data_uri": f"gs://{bucket.name}/raw/digits.csv", "publish_uri": f"gs://{bucket.name}/models"}


def fake_context(task_id: str, *, params: dict | None = None, xcom: dict | None = None,
                 dag_id: str = "tfpipe_gcs_test") -> dict:
    """The parts of an Airflow task context the transfer operators read (``dag_id`` labels the
    helper containers, so a test can find its own among those of tests on the other worker)."""
    ti = SimpleNamespace(dag_id=dag_id, run_id=f"manual__{uuid.uuid4().hex[:8]}", task_id=task_id,
                         try_number=1, map_index=-1, xcom_pull=lambda task_ids: xcom)
    return {"ti": ti, "params": params or {}}


def object_names(client, bucket_name: str, prefix: str = "") -> list[str]:
    """Every object name under ``prefix``."""
    return sorted(b.name for b in client.list_blobs(bucket_name, prefix=prefix))
