"""The lean media read of the stage-in (``tfpipe.gcs.media.MediaReader``) takes only the plain case.

A plain ``200`` whose body has the CRC32C the service names, and no content encoding, comes back as
bytes, over one kept-alive connection per thread; everything else (a wrong or missing checksum, a
gzip encoding, an error or a redirect, a cut-off body, a refused certificate, a proxy, no
certificate checks) is ``None``, and the stage-in's ``_download_many`` then downloads that object
with the library, which checks and raises as it always does.

Everything here is real: the library's ``google.cloud.storage`` client aimed through
``client_options={"api_endpoint": ...}`` at an ``http.server`` on loopback that answers the JSON
API's media path (``/download/storage/v1/b/<bucket>/o/<quoted name>?alt=media[&generation=N]``)
as Cloud Storage does (``x-goog-hash: crc32c=...,md5=...``), or as a broken one would; a TLS
server with a CA made here; a service-account key whose token endpoint is a local server. The
reader and the library's download are not replaced; the library's ``Blob.download_to_file`` is
only wrapped, to count its calls. Against the emulator: tests/integration/test_gcs_media.py.
"""

from __future__ import annotations

import base64
import contextlib
import gc
import gzip
import hashlib
import io
import ssl
import threading
import weakref
from collections.abc import Iterator
from typing import Any
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

import google_crc32c
import pytest
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage
from google.cloud.storage.blob import Blob
from google.cloud.storage.exceptions import DataCorruption

# The key and the token endpoint of the keyed stage-in tests (the fixture is used by its name here).
from tests.integration.test_gcs_access import _service_account_key, granting_token_endpoint  # noqa: F401
from tests.provider.test_gcs_ca_bundle import BUNDLE_VARS, OTHER_VARS, _make_ca_and_server_cert
from tfpipe.gcs import sync
from tfpipe.gcs.media import MediaReader
from tfpipe.hooks.gcs import settle_environment

pytestmark = pytest.mark.gcs

BUCKET = "media-bucket"
NAME = "raw/a b/ü-1.bin"  # quoted in the path: a slash, a space and a non-ASCII letter
BODY = bytes(range(256)) * 64 + b"end"
PROXY_VARS = ("NO_PROXY", "no_proxy", "STORAGE_EMULATOR_HOST")


def _crc32c(body: bytes) -> str:
    return base64.b64encode(google_crc32c.value(body).to_bytes(4, "big")).decode()


def _hashes(body: bytes, crc32c: str | None = None) -> str:
    """``x-goog-hash`` as Cloud Storage sends it for ``body`` (or with the CRC32C ``crc32c``)."""
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    return f"crc32c={crc32c or _crc32c(body)},md5={md5}"


class _Media(BaseHTTPRequestHandler):
    """Cloud Storage's media download, HTTP/1.1 with keep-alive, answering as ``server.mode`` says.

    ``objects`` maps ``(name, generation)`` to bytes; ``(name, None)`` is the live generation."""

    protocol_version = "HTTP/1.1"
    server: _MediaServer

    def setup(self):
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, *args):
        pass

    def send(self, status: int, body: bytes, headers: dict[str, str] | None = None, *,
             length: int | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server's naming)
        srv = self.server
        srv.requests.append((self.path, self.headers))  # its names: any case
        url = urlsplit(self.path)
        prefix = f"/download/storage/v1/b/{BUCKET}/o/"
        query = parse_qs(url.query)
        generation = int(query["generation"][0]) if "generation" in query else None
        body = (srv.objects.get((unquote(url.path[len(prefix):]), generation))
                if url.path.startswith(prefix) and query.get("alt") == ["media"] else None)
        mode = srv.mode
        if body is None or isinstance(mode, int):
            status = 404 if body is None else mode
            error = f'{{"error": {{"code": {status}, "message": "no"}}}}'.encode()
            # with the checksum of the body sent: only its status tells it from an object
            self.send(status, error, {"Content-Type": "application/json", "x-goog-hash": _hashes(error),
                                      **({"Location": f"http://127.0.0.1:9{self.path}"} if status == 302 else {})})
        elif mode == "plain":
            self.send(200, body, {"x-goog-hash": _hashes(body), "x-goog-stored-content-encoding": "identity"})
        elif mode == "wrong-crc32c":
            self.send(200, body, {"x-goog-hash": _hashes(body, _crc32c(body + b"!"))})
        elif mode == "md5-only":
            self.send(200, body, {"x-goog-hash": "md5=" + base64.b64encode(hashlib.md5(body).digest()).decode()})
        elif mode == "gzip":  # served as stored, with the checksum of the bytes sent
            sent = gzip.compress(body)
            self.send(200, sent, {"Content-Encoding": "gzip", "x-goog-hash": _hashes(sent)})
        elif mode == "stored-gzip":  # decompressed on the way, the checksum of the bytes sent
            self.send(200, body, {"x-goog-stored-content-encoding": "gzip", "x-goog-hash": _hashes(body)})
        elif mode == "cut-off":  # half the body it announced, then the connection ends
            self.send_response(200)
            self.send_header("x-goog-hash", _hashes(body))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[:len(body) // 2])
            self.close_connection = True
        elif mode == "one-per-connection":  # keep-alive advertised (HTTP/1.1, no Connection: close), not kept
            self.send(200, body, {"x-goog-hash": _hashes(body)})
            self.close_connection = True
        else:
            raise AssertionError(mode)


class _MediaServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, tls: ssl.SSLContext | None = None):
        super().__init__(("127.0.0.1", 0), _Media)
        if tls is not None:  # the handshake runs in accept: a refused certificate never reaches the handler
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        self.mode: str | int = "plain"
        self.objects: dict[tuple[str, int | None], bytes] = {(NAME, None): BODY}
        self.requests: list[tuple[str, Any]] = []
        self.connections = 0
        self.lock = threading.Lock()
        self.closed = threading.Semaphore(0)  # released once the server has closed a connection
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.server_address[1]}"

    def shutdown_request(self, request):
        super().shutdown_request(request)
        self.closed.release()

    def paths(self) -> list[str]:
        return [path for path, _headers in self.requests]


@contextlib.contextmanager
def _serving(server: _MediaServer) -> Iterator[_MediaServer]:
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """Nothing in the environment sends the client elsewhere, through a proxy, or to another CA."""
    for name in BUNDLE_VARS + OTHER_VARS + PROXY_VARS:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def media():
    """The media server on loopback (plain HTTP)."""
    with _serving(_MediaServer()) as server:
        yield server


def _client(url: str, credentials=None):
    """The library's client of ``url``, settled as the hook settles its own (environment read once)."""
    return settle_environment(storage.Client(project="p", credentials=credentials or AnonymousCredentials(),
                                             client_options={"api_endpoint": url}))


def _bucket(url: str, credentials=None):
    return _client(url, credentials).bucket(BUCKET)


@pytest.fixture
def library_downloads(monkeypatch):
    """Calls of the library's ``Blob.download_to_file`` and ``download_to_filename`` (each runs as ever)."""
    calls: list[str] = []
    for method in ("download_to_file", "download_to_filename"):
        real = getattr(Blob, method)

        def counted(self, *args, _real=real, **kwargs):
            calls.append(self.name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(Blob, method, counted)
    return calls


def _media_path(name: str = NAME, generation: int | None = None) -> str:
    """The path and query of the library's media URL of ``name`` (at ``generation``)."""
    query = f"alt=media&generation={generation}" if generation else "alt=media"
    return f"/download/storage/v1/b/{BUCKET}/o/{quote(name, safe='')}?{query}"


def test_a_plain_reply_with_its_checksum_is_read_at_once(media):
    """A ``200`` whose body has the CRC32C of ``x-goog-hash`` is the object: one GET of the
    library's own media URL (the name quoted, ``alt=media``), anonymous (no Authorization)."""
    reader = MediaReader(_client(media.url))
    assert reader.usable
    assert reader.read(_bucket(media.url).blob(NAME)) == BODY
    assert media.paths() == [_media_path()]
    assert "Authorization" not in media.requests[0][1]


def test_the_blobs_generation_is_the_one_read(media):
    """A blob with a generation asks for that generation; one the service does not have (404) is None."""
    media.objects.update({(NAME, 1): b"first", (NAME, 2): b"second"})
    reader, bucket = MediaReader(_client(media.url)), _bucket(media.url)
    assert reader.read(bucket.blob(NAME, generation=1)) == b"first"
    assert reader.read(bucket.blob(NAME, generation=2)) == b"second"
    assert reader.read(bucket.blob(NAME, generation=3)) is None
    assert reader.read(bucket.blob("raw/missing.bin")) is None
    assert media.paths() == [_media_path(generation=1), _media_path(generation=2), _media_path(generation=3),
                             _media_path("raw/missing.bin")]


def test_connections_are_kept_for_later_reads(media, library_downloads):
    """Reads share kept-alive connections: 5 reads in one thread open 1 connection, and
    ``_download_many`` of 20 objects in 4 threads opens at most 4, all read by the reader."""
    bucket = _bucket(media.url)
    reader = MediaReader(bucket.client)
    assert [reader.read(bucket.blob(NAME)) for _ in range(5)] == [BODY] * 5
    assert media.connections == 1

    media.connections = 0
    names = [f"raw/part-{i:02d}.bin" for i in range(20)]
    media.objects.update({(name, None): name.encode() * (i + 1) for i, name in enumerate(names)})
    targets = [io.BytesIO() for _ in names]
    results = sync._download_many(bucket, [(name, None, 100, target) for name, target in zip(names, targets)], 4)
    assert results == [None] * 20
    assert [t.getvalue() for t in targets] == [media.objects[(name, None)] for name in names]
    assert library_downloads == [], "every object came through the reader"
    assert 1 <= media.connections <= 4, media.connections


def test_connections_outlive_the_threads_of_one_call(media):
    """A download process calls ``_download_many`` once per part, each time with new threads: the
    reader's connections are kept across those calls (over TLS each new one is a handshake), so
    three calls of 8 objects in 4 threads open at most 4 connections, not 4 per call."""
    bucket = _bucket(media.url)
    names = [f"raw/part-{i:02d}.bin" for i in range(8)]
    media.objects.update({(name, None): name.encode() for name in names})
    for _ in range(3):
        assert sync._download_many(bucket, [(name, None, 20, io.BytesIO()) for name in names], 4) == [None] * 8
    assert 1 <= media.connections <= 4, media.connections
    sync._reader(bucket.client).close()


def test_the_reader_goes_with_its_client(media):
    """The per-client cache of readers is keyed weakly: a reader holds no reference to its client,
    so a task's client and its reader are freed together, not kept for the life of the process."""
    client = _client(media.url)
    reader = weakref.ref(sync._reader(client))
    gone = weakref.ref(client)
    del client
    gc.collect()
    assert gone() is None and reader() is None


@pytest.mark.parametrize("content", [None, "not a certificate\n"])
def test_a_ca_bundle_ssl_cannot_load_leaves_every_object_to_the_library(media, library_downloads, tmp_path,
                                                                        content):
    """A bundle that is missing or holds no certificate does not break ``_download_many`` with a
    bare error: the reader is not usable, and the library's download meets the bundle and names it."""
    bundle = tmp_path / "ca.pem"
    if content is not None:
        bundle.write_text(content)
    client = settle_environment(storage.Client(project="p", credentials=AnonymousCredentials(),
                                               client_options={"api_endpoint": media.url.replace("http:", "https:")}),
                                ({}, str(bundle)))
    assert not MediaReader(client).usable
    if content is not None:
        return  # the library retries an unloadable bundle's error for two minutes before it gives up
    results = sync._download_many(client.bucket(BUCKET), [(NAME, None, len(BODY), io.BytesIO())], 1)
    assert library_downloads == [NAME]
    assert isinstance(results[0], OSError) and "invalid path" in str(results[0]), results


@pytest.mark.parametrize("mode", ["wrong-crc32c", "md5-only"])
def test_a_body_without_its_crc32c_is_left_to_the_library(media, library_downloads, mode):
    """A ``200`` whose body does not have the CRC32C the service names (or that names none) is None;
    ``_download_many`` then downloads it with the library, whose check decides: a wrong checksum is
    its ``DataCorruption``, an object with no CRC32C to check is downloaded (the library checks what
    it can)."""
    media.mode = mode
    bucket = _bucket(media.url)
    assert MediaReader(bucket.client).read(bucket.blob(NAME)) is None

    target = io.BytesIO()
    [result] = sync._download_many(bucket, [(NAME, None, len(BODY), target)], 4)
    assert library_downloads == [NAME], "the library's download ran, once"
    if mode == "wrong-crc32c":
        assert isinstance(result, DataCorruption), repr(result)
    else:
        assert result is None and target.getvalue() == BODY
    assert media.paths() == [_media_path()] * 3, "the reader's GET, the reader's GET again, the library's GET"


@pytest.mark.parametrize("mode", ["gzip", "stored-gzip"])
def test_an_encoded_object_is_left_to_the_library(media, mode):
    """``Content-Encoding: gzip`` (a gzip-stored object served as stored) and
    ``x-goog-stored-content-encoding: gzip`` (served decompressed) are None, even with a matching
    checksum of the bytes sent: the library decides what such an object's bytes are."""
    media.mode = mode
    bucket = _bucket(media.url)
    assert MediaReader(bucket.client).read(bucket.blob(NAME)) is None
    assert media.paths() == [_media_path()]


@pytest.mark.parametrize("status", [503, 404, 302, 403])
def test_an_error_or_a_redirect_is_left_to_the_library(media, status):
    """Any status but ``200`` is None (its body has the checksum it names, as an object's would),
    and is not followed or retried by the reader."""
    media.mode = status
    bucket = _bucket(media.url)
    reader = MediaReader(bucket.client)
    assert reader.read(bucket.blob(NAME)) is None
    assert media.paths() == [_media_path()]
    media.mode = "plain"
    assert reader.read(bucket.blob(NAME)) == BODY, "the connection is still good for the next object"


def test_a_body_cut_off_is_none_without_an_exception(media):
    """A reply that ends before its ``Content-Length`` is None, on a new connection and on a kept
    one (tried once more there), and nothing escapes the reader."""
    bucket = _bucket(media.url)
    reader = MediaReader(bucket.client)
    media.mode = "cut-off"
    assert reader.read(bucket.blob(NAME)) is None
    assert len(media.requests) == 1
    media.mode = "plain"
    assert reader.read(bucket.blob(NAME)) == BODY
    media.mode = "cut-off"
    assert reader.read(bucket.blob(NAME)) is None
    assert len(media.requests) == 4, "on the kept connection: its request, then once more on a new one"


def test_a_kept_connection_the_server_closed_meanwhile_is_opened_again(media):
    """A server that advertises keep-alive and ends each connection after one reply (as a load
    balancer's idle timeout does): the next read fails on the dead connection and is made again on
    a new one, so every read returns the object."""
    media.mode = "one-per-connection"
    bucket = _bucket(media.url)
    reader = MediaReader(bucket.client)
    for n in range(1, 4):
        assert reader.read(bucket.blob(NAME)) == BODY, f"read {n}"
        assert media.closed.acquire(timeout=10), "the server ended the connection"
    assert len(media.requests) == 3
    assert media.connections == 3, "one new connection per read: the dead ones were never used again"


@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY"])
def test_a_client_behind_a_proxy_never_uses_the_reader(media, monkeypatch, variable):
    """A proxy for the endpoint's scheme (or for all) is the library's to use: the reader is not
    usable and sends nothing, not even straight to the server."""
    monkeypatch.setenv(variable, "http://127.0.0.1:9")
    bucket = _bucket(media.url)
    reader = MediaReader(bucket.client)
    assert bucket.client._http.proxies, "the proxy was taken from the environment"
    assert not reader.usable
    assert reader.read(bucket.blob(NAME)) is None
    assert media.requests == []


def test_a_proxy_for_another_scheme_does_not_stop_the_reader(media, monkeypatch):
    """An ``https`` proxy is not used for an ``http`` endpoint, by the library or by the reader."""
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    bucket = _bucket(media.url)
    reader = MediaReader(bucket.client)
    assert bucket.client._http.proxies == {"https": "http://127.0.0.1:9"}
    assert reader.usable and reader.read(bucket.blob(NAME)) == BODY


def test_a_client_without_certificate_checks_never_uses_the_reader(media):
    """``verify=False`` (settled so) is the library's to honour: the reader is not usable."""
    client = settle_environment(storage.Client(project="p", credentials=AnonymousCredentials(),
                                               client_options={"api_endpoint": media.url}), ({}, False))
    reader = MediaReader(client)
    assert not reader.usable
    assert reader.read(client.bucket(BUCKET).blob(NAME)) is None
    assert media.requests == []


@pytest.fixture(scope="module")
def tls_media(tmp_path_factory):
    """The media server over HTTPS on loopback, its certificate signed by a CA made here; yields
    ``(server, the CA file)``."""
    ca_path, cert_path, key_path = _make_ca_and_server_cert(tmp_path_factory.mktemp("tls"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    with _serving(_MediaServer(context)) as server:
        yield server, ca_path


def test_over_tls_the_clients_ca_bundle_verifies_the_server(tls_media, monkeypatch):
    """The CA bundle the client was settled with (``REQUESTS_CA_BUNDLE``) is the one the reader
    trusts: the object is read over HTTPS."""
    server, ca_path = tls_media
    server.requests.clear()
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca_path))
    bucket = _bucket(server.url)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE")  # taken when the client was settled
    reader = MediaReader(bucket.client)
    assert reader.usable and reader.scheme == "https"
    assert reader.read(bucket.blob(NAME)) == BODY
    assert server.paths() == [_media_path()]


@pytest.mark.parametrize("bundle", ["default", "another CA's"])
def test_over_tls_a_certificate_the_bundle_does_not_hold_is_none(tls_media, monkeypatch, tmp_path, bundle):
    """A client whose bundle does not hold the server's CA (certifi's default, or another CA's):
    the handshake is refused, the read is None (the library then meets and names the same refusal),
    and no request reaches the server."""
    server, _ca_path = tls_media
    server.requests.clear()
    if bundle != "default":
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(_make_ca_and_server_cert(tmp_path)[0]))
    bucket = _bucket(server.url)
    reader = MediaReader(bucket.client)
    assert reader.usable
    assert reader.read(bucket.blob(NAME)) is None
    assert server.requests == []


def test_the_credentials_token_is_sent(media, granting_token_endpoint):  # noqa: F811 (the imported fixture)
    """A service-account key's client: the reader has the credentials fetch their token from the
    token endpoint, sends it as ``Authorization: Bearer``, and keeps it for the next read."""
    from google.oauth2 import service_account

    token_uri, token, assertions = granting_token_endpoint
    credentials = service_account.Credentials.from_service_account_info(_service_account_key(token_uri))
    bucket = _bucket(media.url, credentials)
    reader = MediaReader(bucket.client)
    assert reader.read(bucket.blob(NAME)) == BODY
    assert reader.read(bucket.blob(NAME)) == BODY
    assert [headers.get("Authorization") for _path, headers in media.requests] == [f"Bearer {token}"] * 2
    assert len(assertions) == 1, "one token, fetched once and kept"


def test_credentials_that_cannot_get_a_token_are_none(media):
    """A key whose token endpoint cannot be reached: None (the library then meets the same error and
    names it), and nothing is sent without a token."""
    from google.oauth2 import service_account

    credentials = service_account.Credentials.from_service_account_info(
        _service_account_key("http://127.0.0.1:9/token"))
    bucket = _bucket(media.url, credentials)
    assert MediaReader(bucket.client).read(bucket.blob(NAME)) is None
    assert media.requests == []
