"""The storage client's bucket-metadata reads follow the library's trace switch."""

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
