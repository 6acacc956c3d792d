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
