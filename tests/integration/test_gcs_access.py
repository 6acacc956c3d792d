"""Missing buckets, rejected credentials and malformed URIs: clear messages, no retries; a key stays on the worker."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import uuid
from http.server import HTTPServer
from urllib.parse import parse_qs

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException

from tests.conftest import JsonReplies, run_dag
from tests.integration.conftest import fake_context, object_names
from tests.integration.test_gcs_stage_in import HelperInspector
from tfpipe.hooks.gcs import GcsAccessError
from tfpipe.gcs.publish import list_published_versions
from tfpipe.operators.gcs import GcsPublishOperator, GcsStageInOperator

pytestmark = [pytest.mark.gcs, pytest.mark.integration]


def _stage_in(tmp_path, image, uri, **kwargs):
    return GcsStageInOperator(task_id="stage_in", data_volume=str(tmp_path / "data"), data_path="digits/",
                              image=image, source_uri=uri, **kwargs)


def test_missing_bucket_fails_without_retry(tmp_path, trainer_image, emulator_env, docker_client):
    with pytest.raises(GcsAccessError) as err:
        _stage_in(tmp_path, trainer_image, "gs://no-such-bucket-tfpipe/raw/").execute(fake_context("stage_in"))
    message = str(err.value)
    assert "bucket 'no-such-bucket-tfpipe' does not exist" in message and "Fix: create it" in message
    assert isinstance(err.value, AirflowFailException)
    assert not (tmp_path / "data").exists(), "nothing is touched before the bucket was found"

    op = GcsPublishOperator(task_id="publish", models_volume=str(tmp_path / "models"), model_name="digits",
                            image=trainer_image, destination_uri="gs://no-such-bucket-tfpipe/models")
    with pytest.raises(GcsAccessError, match="bucket 'no-such-bucket-tfpipe' does not exist"):
        op.execute(fake_context("publish", xcom={"version": 1, "model_name": "digits"}))
    with pytest.raises(GcsAccessError, match="does not exist"):
        list_published_versions("gs://no-such-bucket-tfpipe/models", "digits")


def test_empty_prefix_is_an_error(tmp_path, trainer_image, bucket):
    bucket.blob("raw/digits-old/a.csv").upload_from_string(b"x")
    uri = f"gs://{bucket.name}/raw/digits"
    with pytest.raises(AirflowFailException) as err:
        _stage_in(tmp_path, trainer_image, uri).execute(fake_context("stage_in"))
    message = str(err.value)
    assert f"{uri} matched no objects" in message, message
    assert "Fix: check the bucket and prefix" in message, message


def test_malformed_uri_in_a_run_parameter(tmp_path, trainer_image, emulator_env):
    with pytest.raises(AirflowFailException) as err:
        _stage_in(tmp_path, trainer_image, None).execute(
            fake_context("stage_in", params={"data_uri": "gs://Raw Data/digits"}))
    assert "run parameter 'data_uri'" in str(err.value) and "not a valid bucket name" in str(err.value)


def _service_account_key(token_uri: str) -> dict:
    """A fresh service-account key (its RSA key made here) whose tokens come from ``token_uri``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": "test", "private_key_id": uuid.uuid4().hex, "private_key": pem,
            "client_email": "trainer@test.iam.gserviceaccount.com", "client_id": "1", "token_uri": token_uri}


@pytest.fixture
def rejecting_token_endpoint():
    """An OAuth token endpoint that rejects every key, as Google's does for a deleted key."""
    calls = []

    class Handler(JsonReplies):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            calls.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.reply(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token", calls
    server.shutdown()
    server.server_close()


def test_rejected_credentials_fail_without_retry(tmp_path, trainer_image, bucket, monkeypatch,
                                                 rejecting_token_endpoint):
    token_uri, calls = rejecting_token_endpoint
    key = _service_account_key(token_uri)
    pem = key["private_key"]
    monkeypatch.setenv("AIRFLOW_CONN_GCS_REVOKED", json.dumps(
        {"conn_type": "google_cloud_platform", "extra": {"keyfile_dict": json.dumps(key)}}))
    bucket.blob("raw/digits/a.csv").upload_from_string(b"x,label\n1,0\n")

    op = _stage_in(tmp_path, trainer_image, f"gs://{bucket.name}/raw/digits/", gcp_conn_id="gcs_revoked")
    with pytest.raises(GcsAccessError) as err:
        op.execute(fake_context("stage_in"))
    message = str(err.value)
    assert "credentials from connection 'gcs_revoked' (key in extra keyfile_dict) were rejected" in message
    assert "invalid_grant" in message and "Fix:" in message
    assert "PRIVATE KEY" not in message and pem.splitlines()[1] not in message
    assert 1 <= len(calls) <= 2, "the real client asked the token endpoint, and did not keep retrying"


class _RecordingProxy(JsonReplies):
    """An HTTP proxy that answers every request itself (an empty object listing) and records it."""

    seen: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802  (http.server's name)
        self.seen.append((self.path, self.headers.get("Authorization")))
        self.reply(200, {"kind": "storage#objects", "items": []})


def test_the_clients_http_settings_come_from_the_environment_once(bucket, emulator_env, monkeypatch, tmp_path):
    """The hook's client takes the proxy the environment sets for its endpoint (``no_proxy``
    honoured) when it is made, not on every request, and never adds a ``~/.netrc`` login: the
    credentials' token is the only authorization sent."""
    from tfpipe.hooks.gcs import TfpipeGcsHook

    server = HTTPServer(("127.0.0.1", 0), _RecordingProxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.1:{server.server_address[1]}"
    (tmp_path / ".netrc").write_text("machine 127.0.0.1 login someone password secret\n")
    monkeypatch.setenv("NETRC", str(tmp_path / ".netrc"))
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    _RecordingProxy.seen.clear()
    bucket.blob("raw/a.csv").upload_from_string(b"x\n")  # by a client of the fixture's, before any proxy
    try:
        monkeypatch.setenv("HTTP_PROXY", proxy)
        proxied = TfpipeGcsHook().get_conn()
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        direct = TfpipeGcsHook().get_conn()
        # the environment changes after the clients were made: neither notices
        monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
        monkeypatch.delenv("NO_PROXY")
        assert [b.name for b in direct.list_blobs(bucket.name)] == ["raw/a.csv"], "no_proxy: straight to the emulator"
        assert list(proxied.list_blobs(bucket.name)) == [], "the proxy answered"
        # google-cloud-storage starts a read of the bucket's metadata in a background thread on a
        # client's first use of a bucket, to label trace spans, which are off here: give such a
        # read the time to reach the proxy before it stops.
        time.sleep(1.0)
    finally:
        server.shutdown()
    # The proxied client's listing, and no read of the bucket's metadata.
    listing = f"{emulator_env}/storage/v1/b/{bucket.name}/o"
    paths = [path.split("?", 1)[0] for path, _auth in _RecordingProxy.seen]
    assert paths == [listing], paths
    assert all(auth is None for _path, auth in _RecordingProxy.seen), "no netrc login was added to a request"


@pytest.fixture
def granting_token_endpoint():
    """An OAuth token endpoint that grants a token for every signed assertion, as Google's does for a
    valid key (Google's cannot be reached here; the emulator accepts any token). Yields its URL, the
    token it grants and the JWT assertions it received."""
    token, assertions = f"ya29.{uuid.uuid4().hex}", []

    class Handler(JsonReplies):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            form = parse_qs(self.rfile.read(int(self.headers.get("Content-Length", 0))).decode())
            assertions.extend(form.get("assertion", []))
            self.reply(200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"})

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/token", token, assertions
    server.shutdown()
    server.server_close()


KEYED_DAG = '''"""Airflow DAG written by a test: stage-in and publish with the key of connection gcs_keyed."""
import os
from datetime import datetime

from airflow.sdk import DAG

from tfpipe.operators.gcs import GcsPublishOperator, GcsStageInOperator

with DAG("tfpipe_gcs_keyed", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    home, image, bucket = os.environ["TFPIPE_HOME"], os.environ["TFPIPE_IMAGE"], os.environ["TFPIPE_TEST_BUCKET"]
    stage_in = GcsStageInOperator(task_id="stage_in", data_volume=f"{home}/data", data_path="raw/", image=image,
                                  source_uri=f"gs://{bucket}/raw/digits/", gcp_conn_id="gcs_keyed")
    publish = GcsPublishOperator(task_id="publish", models_volume=f"{home}/models", model_name="digits",
                                 image=image, destination_uri=f"gs://{bucket}/models", version=1,
                                 gcp_conn_id="gcs_keyed")
    stage_in >> publish
'''


def _jwt_part(token: str, index: int) -> dict:
    part = token.split(".")[index]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def test_a_key_in_the_connection_reaches_no_log_xcom_db_row_or_container(
        tmp_path, trainer_image, bucket, gcs_client, docker_client, granting_token_endpoint):
    """A real DAG run (``tfpipe run``: Airflow's task runner and metadata DB) stages in and publishes
    with a service-account key from the connection's ``keyfile_dict``; the key signs the token
    requests. Neither the key nor its token is in the task log (``dag.test`` prints it unmasked,
    so nothing logged it), an XCom, any other row of the metadata DB (rendered fields included)
    or the configuration of any container the tasks start. That Airflow's masker hides the key
    should something log it is proven in ``tests/provider/test_gcs_credentials.py``."""
    token_uri, token, assertions = granting_token_endpoint
    key = _service_account_key(token_uri)
    secrets = {"a line of the private key": key["private_key"].splitlines()[5], "the private key id": key["private_key_id"],
               "the access token": token}
    for i in range(3):
        bucket.blob(f"raw/digits/part-{i}.csv").upload_from_string(f"x,label\n{i},0\n".encode())
    home = tmp_path / "home"
    (home / "data" / "raw").mkdir(parents=True)  # an existing target: a helper container surveys it
    version = home / "models" / "digits" / "1"
    version.mkdir(parents=True)
    (version / "saved_model.pb").write_bytes(os.urandom(2048))
    for path in [home / "data", home / "data" / "raw", *(home / "models").rglob("*"), home / "models"]:
        os.chown(path, 1000, 1000)
    (tmp_path / "dags").mkdir()
    (tmp_path / "dags" / "tfpipe_gcs_keyed.py").write_text(KEYED_DAG)

    watcher = HelperInspector(docker_client, label="tfpipe.dag_id=tfpipe_gcs_keyed")
    watcher.start()
    try:
        summary, log = run_dag("tfpipe_gcs_keyed", {}, home=home, image=trainer_image, dags_folder=tmp_path / "dags",
                               timeout=300, extra_env={
                                   "AIRFLOW_CONN_GCS_KEYED": json.dumps({"conn_type": "google_cloud_platform",
                                                                         "extra": {"keyfile_dict": json.dumps(key)}}),
                                   "TFPIPE_TEST_BUCKET": bucket.name})
    finally:
        watcher.stopped.set()
        watcher.join(timeout=5)
    assert summary["state"] == "success", log[-6000:]
    assert {t: s["state"] for t, s in summary["tasks"].items()} == {"stage_in": "success", "publish": "success"}
    assert sorted(p.name for p in (home / "data" / "raw").glob("*.csv")) == [f"part-{i}.csv" for i in range(3)]
    assert "models/digits/1/saved_model.pb" in object_names(gcs_client, bucket.name, "models/")

    # the key was used: each task's client signed its token request with it
    assert len(assertions) >= 2, "both tasks asked the token endpoint"
    assert all(_jwt_part(a, 0)["kid"] == key["private_key_id"] and _jwt_part(a, 1)["iss"] == key["client_email"]
               for a in assertions)

    assert "Cloud Storage: connection 'gcs_keyed' (key in extra keyfile_dict)" in log, "the task log is here"
    for what, secret in secrets.items():
        assert secret not in log, f"{what} is in the task log"

    from sqlalchemy import inspect, text
    from airflow.utils.session import create_session

    with create_session() as session:
        xcoms = session.execute(text("SELECT task_id, value FROM xcom WHERE dag_id = 'tfpipe_gcs_keyed' AND "
                                     "run_id = :run_id"), {"run_id": summary["run_id"]}).fetchall()
        assert {task for task, _ in xcoms} >= {"stage_in", "publish"}, "both tasks pushed their results"
        for table in inspect(session.get_bind()).get_table_names():
            for row in session.execute(text(f'SELECT * FROM "{table}"')):
                for what, secret in secrets.items():
                    assert secret not in repr(row), f"{what} is in table {table}"

    roles = {c["Config"]["Labels"].get("tfpipe.role") for c in watcher.seen.values()}
    assert roles == {"gcs-stage-in", "gcs-publish"}, f"saw the containers of roles {roles}"
    for container in watcher.seen.values():
        config = json.dumps(container)  # environment, command, labels, mounts, everything the engine keeps
        for what, secret in secrets.items():
            assert secret not in config, f"{what} was handed to container {container['Name']}"
        assert "PRIVATE KEY" not in config and "GOOGLE_APPLICATION_CREDENTIALS" not in config
