"""Credentials without a network: the key is masked, ADC is the fallback, refusals are not retried.

The keys are real ones (an RSA key made here, in Google's service-account JSON layout), read by the
real hook, google-auth and Airflow's secrets masker; nothing of them is replaced.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException

from tfpipe.hooks.gcs import GcsAccessError, GcsTransferError, GcsUri, TfpipeGcsHook

pytestmark = pytest.mark.gcs

def service_account_key(project_id: str = "acme-ml") -> dict:
    """A fresh service-account key as the console downloads it (its RSA key made here, unique)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    pem = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": project_id, "private_key_id": uuid.uuid4().hex,
            "private_key": pem, "client_email": f"trainer@{project_id}.iam.gserviceaccount.com",
            "client_id": "1234567890", "token_uri": "https://oauth2.googleapis.com/token"}


def _connection(monkeypatch, conn_id: str, extra: dict) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}",
                       json.dumps({"conn_type": "google_cloud_platform", "extra": extra}))


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch, tmp_path):
    """No emulator and no ADC from the machine: each test sets what it needs."""
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "gcloud").mkdir()
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no `gcloud auth application-default` file


# -- the key is masked ------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["keyfile_dict text", "key_json object", "prefixed keyfile_dict", "key_path file"])
def test_the_key_from_the_connection_is_masked_once_the_hook_reads_it(monkeypatch, tmp_path, how):
    """Every way of giving the key registers its private key (and the key text) with Airflow's
    secrets masker, which task logs go through; the client then signs with that key."""
    from airflow.providers.common.compat.sdk import redact  # the masker the hook registers with, on every release

    key = service_account_key()
    pem, text = key["private_key"], json.dumps(key, indent=2)
    extra = {"keyfile_dict text": {"keyfile_dict": text},
             "key_json object": {"key_json": key},
             "prefixed keyfile_dict": {"extra__google_cloud_platform__keyfile_dict": text},
             "key_path file": {"key_path": str(tmp_path / "key.json")}}[how]
    (tmp_path / "key.json").write_text(text)
    _connection(monkeypatch, "gcs_keyed", extra)
    line = f"debug: key {pem} (end)"
    assert redact(line) == line, "a key nobody registered is not masked (so the check below means something)"

    hook = TfpipeGcsHook("gcs_keyed")
    client = hook.get_conn()

    assert redact(line) == "debug: key *** (end)"
    if how != "key_json object":  # given as text: the whole text is masked too
        assert redact(f"read {text}") == "read ***"
    credentials = client._credentials
    assert (credentials.service_account_email, credentials.signer.key_id) == (
        key["client_email"], key["private_key_id"]), "the client uses the connection's key"
    assert client.project == "acme-ml"
    assert "connection 'gcs_keyed'" in hook.credentials_source
    assert not any(part in hook.credentials_source for part in (pem[40:80], key["private_key_id"]))


def test_authorized_user_secrets_are_masked(monkeypatch):
    from airflow.providers.common.compat.sdk import redact  # the masker the hook registers with, on every release

    secret, refresh = f"secret-{uuid.uuid4().hex}", f"refresh-{uuid.uuid4().hex}"
    _connection(monkeypatch, "gcs_user", {"keyfile_dict": {
        "type": "authorized_user", "client_id": "c.apps.googleusercontent.com", "client_secret": secret,
        "refresh_token": refresh}, "project": "acme-ml"})
    assert redact(f"{secret} {refresh}") == f"{secret} {refresh}"
    TfpipeGcsHook("gcs_user").get_conn()
    assert redact(f"a={secret} b={refresh}") == "a=*** b=***"


@pytest.mark.parametrize("field, as_text", [("keyfile_dict", True), ("extra__google_cloud_platform__keyfile_dict", True),
                                             ("key_json", False)])
def test_airflows_connection_api_does_not_show_the_key(field, as_text):
    """What the UI's connection page gets from Airflow's REST API (its response model, as the
    api-server builds it) has ``***`` in place of the key, with no hook ever run in that process.
    ``key_json`` given as *text* is not among these: Airflow hides extras by name, and that name
    is not one of its sensitive names."""
    from airflow.api_fastapi.core_api.datamodels.connections import ConnectionResponse

    key = service_account_key()
    extra = {field: json.dumps(key) if as_text else key, "project": "acme-ml"}
    shown = ConnectionResponse(connection_id="gcs_keyed", conn_type="google_cloud_platform", extra=json.dumps(extra),
                               description=None, host=None, login=None, schema=None, port=None, password=None,
                               team_name=None).extra
    assert json.loads(shown)["project"] == "acme-ml", "the rest of the extra is shown"
    for line in key["private_key"].splitlines()[1:-1]:
        assert line not in shown



_SHOWN = """
import json, sys
from airflow.api_fastapi.core_api.datamodels.connections import ConnectionResponse
print(ConnectionResponse(connection_id="gcs_keyed", conn_type="google_cloud_platform", extra=sys.stdin.read(),
                         description=None, host=None, login=None, schema=None, port=None, password=None,
                         team_name=None).extra)
"""


def test_key_json_as_text_is_shown_in_clear_unless_named_sensitive():
    """The Cloud Storage page's warning, both ways: ``key_json`` given as text reaches the connection page as it is,
    and ``[core] sensitive_var_conn_names = key_json`` hides it (a fresh api-server-like process
    each, since Airflow reads that list once)."""
    text = json.dumps(service_account_key())
    extra = json.dumps({"key_json": text, "project": "acme-ml"})

    def shown(**env: str) -> dict:
        base = {k: v for k, v in os.environ.items() if k != "AIRFLOW__CORE__SENSITIVE_VAR_CONN_NAMES"}
        proc = subprocess.run([sys.executable, "-c", _SHOWN], input=extra, env={**base, **env},
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    assert shown() == {"key_json": text, "project": "acme-ml"}, "in clear, as the docs warn"
    assert shown(AIRFLOW__CORE__SENSITIVE_VAR_CONN_NAMES="key_json") == {"key_json": "***", "project": "acme-ml"}


# -- Application Default Credentials ---------------------------------------------------------------

def test_without_a_key_the_hook_uses_application_default_credentials(monkeypatch, tmp_path):
    """No connection, or one without a key: google-auth's ADC (here GOOGLE_APPLICATION_CREDENTIALS,
    a key file) become the client's credentials; a connection's project wins over the key file's."""
    key = service_account_key(project_id="adc-project")
    (tmp_path / "adc.json").write_text(json.dumps(key))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "adc.json"))
    _connection(monkeypatch, "gcs_project_only", {"project": "conn-project"})

    for conn_id, project, why in (("gcs_not_there", "adc-project", "there is no connection 'gcs_not_there'"),
                                  ("gcs_project_only", "conn-project", "connection 'gcs_project_only' has no key")):
        hook = TfpipeGcsHook(conn_id)
        client = hook.get_conn()
        credentials = client._credentials
        assert (credentials.service_account_email, credentials.signer.key_id) == (
            key["client_email"], key["private_key_id"]), "the ADC key file's credentials"
        assert client.project == project
        assert hook.credentials_source == f"Application Default Credentials ({why})"


def test_without_a_key_or_adc_fails_without_retry_naming_the_fix(tmp_path):
    """Neither a key nor ADC: a non-retried failure that says how to give either. In a fresh
    interpreter, because google-auth reads NO_GCE_CHECK (skip the metadata server, which would
    give a Compute Engine VM's account) only when imported."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")}
    env.update(NO_GCE_CHECK="true", CLOUDSDK_CONFIG=str(tmp_path / "gcloud"),
               AIRFLOW_CONN_GCS_NO_KEY=json.dumps({"conn_type": "google_cloud_platform", "extra": {"project": "p"}}))
    script = ("from airflow.providers.common.compat.sdk import AirflowFailException\n"
              "from tfpipe.hooks.gcs import TfpipeGcsHook\n"
              "for conn_id in ('gcs_no_key', 'gcs_not_there'):\n"
              "    try:\n"
              "        TfpipeGcsHook(conn_id).get_conn()\n"
              "    except AirflowFailException as err:\n"
              "        print('FAILED:', type(err).__name__, err)\n")
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    failures = [line for line in proc.stdout.splitlines() if line.startswith("FAILED:")]
    assert len(failures) == 2, proc.stdout + proc.stderr[-3000:]
    for failure, why in zip(failures, ("connection 'gcs_no_key' has no key", "there is no connection 'gcs_not_there'")):
        assert failure.startswith(f"FAILED: GcsAccessError no Google credentials: {why}, and Application Default "
                                  "Credentials were not found"), failure
        assert "Fix: put a service-account JSON key in the connection" in failure
        assert "GOOGLE_APPLICATION_CREDENTIALS" in failure and "STORAGE_EMULATOR_HOST" in failure


# -- refusals from Cloud Storage -------------------------------------------------------------------

def _http_error(status: int, reason: str, message: str, url: str):
    """The exception google-cloud-storage raises for this answer (``api_core``'s ``from_http_response``,
    which the client calls on every non-2xx response), from a response in Cloud Storage's JSON format."""
    import requests
    from google.api_core import exceptions

    response = requests.Response()
    response.status_code = status
    response.headers["Content-Type"] = "application/json; charset=UTF-8"
    response._content = json.dumps({"error": {"code": status, "message": message, "errors": [
        {"message": message, "domain": "global", "reason": reason}]}}).encode()
    response.request = requests.Request("GET", url).prepare()
    return exceptions.from_http_response(response)


@pytest.fixture
def keyed_hook(monkeypatch) -> TfpipeGcsHook:
    """A hook whose credentials came from a key in the connection 'gcs_keyed' (no network needed)."""
    _connection(monkeypatch, "gcs_keyed", {"keyfile_dict": json.dumps(service_account_key())})
    hook = TfpipeGcsHook("gcs_keyed")
    hook.get_conn()
    return hook


@pytest.mark.parametrize("action, missing", [
    ("listing gs://acme-raw/churn/", "bucket"), ("downloading gs://acme-raw/churn/a.csv", "object"),
    ("uploading saved_model.pb to gs://acme-raw/churn/", "bucket")])
def test_permission_denied_fails_without_retry_naming_the_bucket_and_the_fix(keyed_hook, action, missing):
    denied = _http_error(403, "forbidden", "trainer@acme-ml.iam.gserviceaccount.com does not have "
                         "storage.objects.list access to the Google Cloud Storage bucket. Permission "
                         "'storage.objects.list' denied on resource (or it may not exist).",
                         "https://storage.googleapis.com/storage/v1/b/acme-raw/o?prefix=churn%2F")
    assert type(denied).__name__ == "Forbidden"
    with pytest.raises(GcsAccessError) as err:
        with keyed_hook.errors(action, GcsUri.parse("gs://acme-raw/churn/"), missing=missing):
            raise denied
    assert isinstance(err.value, AirflowFailException), "Airflow does not retry an AirflowFailException"
    message = str(err.value)
    assert message.startswith(f"{action}: the credentials from connection 'gcs_keyed' (key in extra keyfile_dict) "
                              "may not access gs://acme-raw/churn/ (403: ")
    assert "does not have storage.objects.list access" in message
    assert ("Fix: grant the account roles/storage.objectViewer (stage-in) or roles/storage.objectAdmin (publish) "
            "on bucket 'acme-raw'") in message
    assert err.value.__cause__ is denied


def test_rejected_credentials_fail_without_retry_and_server_errors_are_retried(keyed_hook):
    """The other side of the line: a 401 is not retried either; a 503 (or 429) is a transfer error
    Airflow retries."""
    uri = GcsUri.parse("gs://acme-raw/churn/")
    with pytest.raises(GcsAccessError, match=r"did not accept the credentials from connection 'gcs_keyed' .*\(401: "
                                             r".*Fix: put a service-account JSON key"):
        with keyed_hook.errors("listing gs://acme-raw/churn/", uri):
            raise _http_error(401, "required", "Anonymous caller does not have storage.objects.list access.",
                              "https://storage.googleapis.com/storage/v1/b/acme-raw/o")
    for status, reason in ((503, "backendError"), (429, "rateLimitExceeded")):
        with pytest.raises(GcsTransferError) as err:
            with keyed_hook.errors("listing gs://acme-raw/churn/", uri):
                raise _http_error(status, reason, "try again", "https://storage.googleapis.com/storage/v1/b/acme-raw/o")
        assert not isinstance(err.value, AirflowFailException), f"{status} must be retried"
        assert f"Cloud Storage answered {status}" in str(err.value)
