"""Missing buckets, rejected credentials and malformed URIs: clear messages, no retries."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException

from tests.integration.conftest import fake_context
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
    with pytest.raises(AirflowFailException, match="matched no objects"):
        _stage_in(tmp_path, trainer_image, f"gs://{bucket.name}/raw/digits").execute(fake_context("stage_in"))


def test_malformed_uri_in_a_run_parameter(tmp_path, trainer_image, emulator_env):
    with pytest.raises(AirflowFailException) as err:
        _stage_in(tmp_path, trainer_image, None).execute(
            fake_context("stage_in", params={"data_uri": "gs://Raw Data/digits"}))
    assert "run parameter 'data_uri'" in str(err.value) and "not a valid bucket name" in str(err.value)


class _JsonReplies(BaseHTTPRequestHandler):
    """A handler that answers with JSON (:meth:`reply`) and logs nothing."""

    def reply(self, status: int, document: dict) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def rejecting_token_endpoint():
    """An OAuth token endpoint that rejects every key, as Google's does for a deleted key."""
    calls = []

    class Handler(_JsonReplies):
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
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    token_uri, calls = rejecting_token_endpoint
    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    key = {"type": "service_account", "project_id": "test", "private_key_id": "0123abcd", "private_key": pem,
           "client_email": "trainer@test.iam.gserviceaccount.com", "client_id": "1", "token_uri": token_uri}
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


class _RecordingProxy(_JsonReplies):
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
    finally:
        server.shutdown()
    # The proxied client's listing, and perhaps the library's own read of the bucket's metadata
    # (google-cloud-storage fetches it in a background thread on a client's first use of a bucket).
    listing = f"{emulator_env}/storage/v1/b/{bucket.name}/o"
    paths = [path.split("?", 1)[0] for path, _auth in _RecordingProxy.seen]
    assert paths.count(listing) == 1 and set(paths) <= {listing, listing[:-2]}, paths
    assert all(auth is None for _path, auth in _RecordingProxy.seen), "no netrc login was added to a request"
