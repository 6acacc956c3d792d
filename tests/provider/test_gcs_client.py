"""The storage client's HTTP settings, and its bucket-metadata reads, which follow the library's trace switch."""

from __future__ import annotations

import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage import _opentelemetry_tracing as tracing

from tfpipe.hooks.gcs import settle_environment

pytestmark = pytest.mark.gcs


def _client():
    return storage.Client(project="p", credentials=AnonymousCredentials())


def test_without_traces_the_client_reads_no_bucket_metadata(monkeypatch):
    monkeypatch.setattr(tracing, "enable_otel_traces", False)
    assert _client()._bucket_metadata_cache is not None, "the library's default, which the hook changes"
    assert settle_environment(_client())._bucket_metadata_cache is None


def test_the_proxy_and_ca_bundle_are_read_when_the_client_is_settled_and_kept(monkeypatch, tmp_path):
    """The environment's proxy and CA bundle for the storage endpoint are read once, when the hook
    settles its client, and kept on its session: requests reads the environment no more."""
    bundle = tmp_path / "ca.pem"
    bundle.write_text("not read here\n")
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    session = settle_environment(_client())._http
    assert (session.proxies, session.verify, session.trust_env) == (
        {"https": "http://127.0.0.1:3128"}, str(bundle), False)

    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")
    assert (session.proxies, session.verify) == ({"https": "http://127.0.0.1:3128"}, str(bundle)), "kept"
    again = settle_environment(_client())._http
    assert (again.proxies, again.verify) == ({"https": "http://127.0.0.1:9"}, True), "a new client reads anew"


@pytest.mark.parametrize("error, retried", [
    ("503", True), ("429", True), ("reset", True), ("timeout", True),
    ("404", False), ("403", False), ("certificate", False),
])
def test_the_listing_retries_transient_errors_only(error, retried):
    """The listing's retry (the library's default, less a refused certificate) tries again after a
    server error, a throttle, a reset or a timeout, and gives up at once on a missing bucket, a
    refused permission or a certificate the client does not trust (a setting to fix)."""
    import requests
    from google.api_core import exceptions as api

    from tfpipe.hooks.gcs import _listing_retry

    first = {"503": api.ServiceUnavailable("busy"), "429": api.TooManyRequests("slow down"),
             "reset": requests.exceptions.ConnectionError("Connection reset by peer"),
             "timeout": requests.exceptions.ReadTimeout("read timed out"),
             "404": api.NotFound("no such bucket"), "403": api.Forbidden("denied"),
             "certificate": requests.exceptions.SSLError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")}
    calls = []

    def listing():
        calls.append(1)
        if len(calls) == 1:
            raise first[error]
        return "listed"

    wrapped = _listing_retry().with_delay(initial=0.001, maximum=0.001)(listing)
    if retried:
        assert wrapped() == "listed" and len(calls) == 2
    else:
        with pytest.raises(type(first[error])):
            wrapped()
        assert len(calls) == 1


@pytest.mark.parametrize("has_opentelemetry", [True, False])
def test_with_traces_on_the_cache_stays_where_spans_can_use_it(monkeypatch, has_opentelemetry):
    monkeypatch.setattr(tracing, "enable_otel_traces", True)
    monkeypatch.setattr(tracing, "HAS_OPENTELEMETRY", has_opentelemetry)
    kept = settle_environment(_client())._bucket_metadata_cache is not None
    assert kept is has_opentelemetry


@pytest.mark.parametrize("cause, error, says", [
    ("refused", "GcsTransferError", "cannot reach Cloud Storage at "),
    ("forbidden", "GcsAccessError", "may not access gs://b-1/raw/ (403: "),
    ("certificate", "GcsAccessError", "could not be verified against the default CA bundle"),
])
def test_a_retry_the_library_gave_up_is_told_by_its_last_error(cause, error, says):
    """google-cloud-storage retries network errors for two minutes, then raises ``RetryError``; the
    hook names the last error it met, classified as if it had come alone (retried or not)."""
    import requests
    from google.api_core import exceptions as api

    from tfpipe.hooks import gcs

    last = {"refused": requests.exceptions.ConnectionError("[Errno 111] Connection refused"),
            "forbidden": api.Forbidden("the account may not list"),
            "certificate": requests.exceptions.SSLError(
                "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer certificate")}
    with pytest.raises(getattr(gcs, error)) as err:
        with gcs.TfpipeGcsHook().errors("listing gs://b-1/raw/", "gs://b-1/raw/"):
            raise api.RetryError("Timeout of 120.0s exceeded", last[cause])
    assert str(err.value).startswith("listing gs://b-1/raw/: ") and says in str(err.value), str(err.value)
    assert isinstance(err.value.__cause__, type(last[cause]))
