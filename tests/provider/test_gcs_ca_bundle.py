"""The storage client takes its CA bundle from the environment once, when the task makes it.

``REQUESTS_CA_BUNDLE`` and ``CURL_CA_BUNDLE`` name the CA that signs the storage endpoint's
certificate (a TLS-inspecting proxy's, a private endpoint's). The hook's client reads them when
``TfpipeGcsHook().get_conn()`` makes it and keeps them on its session: a bundle removed later is
still used, and one set later is not picked up.

Everything here is real: a CA and a server certificate made in the test's temporary folder, an
HTTPS server on loopback answering the Cloud Storage JSON API's object listing, and the hook's
real ``google-cloud-storage`` client pointed at it through ``STORAGE_EMULATOR_HOST``, talking to
it anonymously as it does to an emulator. Nothing of the client or of ``requests`` is replaced.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import threading
from http.server import HTTPServer
from pathlib import Path

import pytest
import requests

from tests.conftest import JsonReplies
from tfpipe.hooks.gcs import TfpipeGcsHook

pytestmark = pytest.mark.gcs

BUCKET = "ca-bundle-bucket"
BUNDLE_VARS = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
#: Everything else in the environment that could decide how the client verifies or reaches the
#: server: another CA source, a proxy that would be asked instead of the server, client-certificate
#: (mTLS) switches, a connection that would bring a key instead of anonymous access.
OTHER_VARS = ("SSL_CERT_FILE", "SSL_CERT_DIR",
              "HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
              "GOOGLE_API_USE_CLIENT_CERTIFICATE", "GOOGLE_API_USE_MTLS_ENDPOINT", "API_ENDPOINT_OVERRIDE",
              "GOOGLE_APPLICATION_CREDENTIALS", "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT")


def _make_ca_and_server_cert(folder: Path) -> tuple[Path, Path, Path]:
    """A self-signed CA, and a server certificate it signs for IP 127.0.0.1; returns the paths of
    the CA certificate, the server certificate and the server key (all PEM)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid_from, valid_to = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tfpipe test CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid_from).not_valid_after(valid_to)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(valid_from).not_valid_after(valid_to)
        # an IP SAN: the client checks the address it dials, 127.0.0.1, against it
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                  serialization.NoEncryption()))
    return ca_path, cert_path, key_path


class _StorageListing(JsonReplies):
    """Answers ``GET /storage/v1/b/<BUCKET>/o`` as Cloud Storage does, and 404 to anything else;
    records the path of every request that got through the TLS handshake."""

    seen: list[str] = []

    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.seen.append(self.path)
        if self.path.split("?", 1)[0] == f"/storage/v1/b/{BUCKET}/o":
            status, body = 200, {"kind": "storage#objects", "items": [
                {"kind": "storage#object", "id": f"{BUCKET}/a.csv/1", "name": "a.csv", "bucket": BUCKET,
                 "generation": "1", "metageneration": "1", "size": "2", "contentType": "text/csv",
                 "crc32c": "AAAAAA==", "updated": "2024-01-01T00:00:00.000Z"}]}
        else:
            status, body = 404, {"error": {"code": 404, "message": f"no {self.path}"}}
        self.reply(status, body)


@pytest.fixture(scope="module")
def tls_storage(tmp_path_factory):
    """The HTTPS storage endpoint on loopback; yields ``(its URL, the CA file that signs it)``.

    The handshake runs in the server's accept: a client that refuses the certificate never
    reaches the handler, and the server goes on (socketserver drops an accept's ``OSError``)."""
    ca_path, cert_path, key_path = _make_ca_and_server_cert(tmp_path_factory.mktemp("tls"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    server = HTTPServer(("127.0.0.1", 0), _StorageListing)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", ca_path
    server.shutdown()
    server.server_close()


@pytest.fixture
def clean_env(monkeypatch, tls_storage):
    """The hook's client aims at the TLS server anonymously, and nothing but the variable under
    test can tell it which CA to trust or send it elsewhere."""
    for name in BUNDLE_VARS + OTHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", tls_storage[0])
    _StorageListing.seen.clear()
    return tls_storage


@pytest.mark.parametrize("variable", BUNDLE_VARS)
def test_the_ca_bundle_set_when_the_client_is_made_is_kept_after_it_leaves_the_environment(
        monkeypatch, clean_env, variable):
    """The variable names the CA when the hook makes its client and is gone by the request: the
    listing still verifies the server against that CA, so the bundle was taken at creation."""
    _url, ca_path = clean_env
    monkeypatch.setenv(variable, str(ca_path))
    client = TfpipeGcsHook().get_conn()
    monkeypatch.delenv(variable)
    # A client that looked at the environment for this request would fall back to certifi's
    # bundle, which does not hold this CA, and fail the handshake. retry=None: the library retries
    # a failed handshake (a ConnectionError) for two minutes, which would only delay that failure.
    blobs = list(client.list_blobs(BUCKET, retry=None))
    assert [(b.bucket.name, b.name) for b in blobs] == [(BUCKET, "a.csv")]
    assert [p.split("?", 1)[0] for p in _StorageListing.seen] == [f"/storage/v1/b/{BUCKET}/o"]


@pytest.mark.parametrize("variable", BUNDLE_VARS)
def test_a_ca_bundle_set_after_the_client_is_made_is_not_read_per_request(monkeypatch, clean_env, variable):
    """A client made with no bundle in the environment trusts the default CAs only; naming the
    CA afterwards does not reach it, and the handshake fails on the certificate."""
    _url, ca_path = clean_env
    client = TfpipeGcsHook().get_conn()
    monkeypatch.setenv(variable, str(ca_path))
    # retry=None, as above: the failure is the first handshake's, not a retry loop's.
    with pytest.raises(requests.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        list(client.list_blobs(BUCKET, retry=None))
    assert _StorageListing.seen == [], "no request got past the TLS handshake"


@pytest.mark.parametrize("bundle", ["default", "another CA's"])
def test_a_refused_certificate_fails_the_listing_at_once_naming_the_bundle_and_the_fix(
        monkeypatch, clean_env, tmp_path, bundle):
    """A listing (the first call of every stage-in and publish) against an endpoint whose
    certificate the client's bundle does not hold fails without retry (the library alone would
    retry it for two minutes), naming the endpoint, the bundle in use and the variable that fixes it."""
    import time

    from tfpipe.hooks.gcs import GcsAccessError, GcsUri, list_objects

    url, _ca_path = clean_env
    if bundle != "default":
        other = _make_ca_and_server_cert(tmp_path)[0]  # a CA, but not the one that signed the server's
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other))
    hook = TfpipeGcsHook()
    started = time.monotonic()
    with pytest.raises(GcsAccessError) as err:
        list_objects(hook, GcsUri.parse(f"gs://{BUCKET}/raw/"), action="stage-in listing")
    assert time.monotonic() - started < 20, "no retry loop before the error"
    message = str(err.value)
    assert message.startswith(f"stage-in listing gs://{BUCKET}/raw/: the TLS certificate of Cloud Storage at {url} "
                              "could not be verified against "), message
    assert ("the default CA bundle" if bundle == "default" else f"the CA bundle {other}") in message
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert "Fix: where a proxy or a private endpoint presents a certificate of your own CA, set REQUESTS_CA_BUNDLE" \
        in message
    assert _StorageListing.seen == []
