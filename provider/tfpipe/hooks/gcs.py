"""Google Cloud Storage for tfpipe: ``gs://`` URIs, credentials and a ``google-cloud-storage`` client.

Credentials come from the Airflow connection ``gcp_conn_id`` (extra ``key_path``/``keyfile_path``, or
``keyfile_dict``/``key_json``; ``project``/``project_id``; with or without the
``extra__google_cloud_platform__`` prefix), else Application Default Credentials, or anonymous against
``STORAGE_EMULATOR_HOST``. Keys are masked and never leave the worker. Failures a retry cannot fix raise
:class:`GcsAccessError`; transient ones :class:`GcsTransferError`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from airflow.providers.common.compat.sdk import (
    AirflowException,
    AirflowFailException,
    AirflowNotFoundException,
    BaseHook,
)

from tfpipe.config import check_gcs_uri
from tfpipe.exceptions import causes

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
EMULATOR_PROJECT = "test"
EXTRA_PREFIX = "extra__google_cloud_platform__"
KEY_PATH_FIELDS = ("key_path", "keyfile_path")
KEY_JSON_FIELDS = ("keyfile_dict", "key_json")
PROJECT_FIELDS = ("project", "project_id")
CONN_TYPES = ("google_cloud_platform", "gcp", "generic", "")
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
KEY_TYPES = ("service_account", "authorized_user")
_KEY_FIX = ("put a service-account JSON key in the connection (extra key_path = path of the key file on "
            "the worker, or keyfile_dict = the key JSON), or use Application Default Credentials "
            "(`gcloud auth application-default login`, GOOGLE_APPLICATION_CREDENTIALS, or the "
            "worker's service account)")


class GcsAccessError(AirflowFailException):
    """No usable credentials, no permission or no such bucket: retrying cannot fix it."""


class GcsTransferError(AirflowException):
    """A transient storage failure (network, server error, an object changed meanwhile): retried."""


@dataclass(frozen=True)
class GcsUri:
    """A parsed ``gs://bucket/prefix``; a trailing ``/`` in ``prefix`` marks a folder."""

    bucket: str
    prefix: str = ""

    @classmethod
    def parse(cls, value: Any, *, field_name: str = "uri") -> GcsUri:
        """Parse and validate ``value``; raise :class:`~tfpipe.exceptions.TfpipeConfigError`."""
        bucket, prefix = check_gcs_uri(field_name, value)
        return cls(bucket, prefix)

    def __str__(self) -> str:
        return f"gs://{self.bucket}/{self.prefix}"

    @property
    def folder(self) -> str:
        """The prefix as a folder: ``""`` (the whole bucket) or ending with ``/``."""
        prefix = self.prefix.rstrip("/")
        return f"{prefix}/" if prefix else ""

    def child(self, *parts: str) -> GcsUri:
        """The URI of ``parts`` below this folder."""
        return GcsUri(self.bucket, self.folder + "/".join(str(p).strip("/") for p in parts))


def crc32c_of_file(path: str, chunk_size: int = 1 << 20) -> str:
    """The CRC32C of a file as Cloud Storage reports it (base64 of the big-endian 4 bytes)."""
    import google_crc32c

    checksum = google_crc32c.Checksum()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_size), b""):
            checksum.update(block)
    return base64.b64encode(checksum.digest()).decode("ascii")


def crc32c_of_bytes(data: bytes) -> str:
    """The CRC32C of ``data`` as Cloud Storage reports it."""
    import google_crc32c

    return base64.b64encode(google_crc32c.Checksum(data).digest()).decode("ascii")


def _short(err: BaseException, limit: int = 300) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[:limit] + "..."


class TfpipeGcsHook(BaseHook):
    """A ``google.cloud.storage.Client`` with credentials from an Airflow connection or ADC, resolved by :meth:`get_conn`.

    :param gcp_conn_id: the Airflow connection; a missing one means Application Default
        Credentials (or anonymous against ``STORAGE_EMULATOR_HOST``).
    """

    conn_name_attr = "gcp_conn_id"
    default_conn_name = "google_cloud_default"
    conn_type = "google_cloud_platform"
    hook_name = "Google Cloud Storage (tfpipe)"

    def __init__(self, gcp_conn_id: str | None = default_conn_name) -> None:
        super().__init__()
        self.gcp_conn_id = gcp_conn_id
        #: Where the credentials came from, for messages (never the key itself).
        self.credentials_source = "credentials not resolved yet"
        self._client: Any = None

    # -- credentials ----------------------------------------------------------------------------

    def _connection(self) -> Any:
        if not self.gcp_conn_id:
            return None
        try:
            return self.get_connection(self.gcp_conn_id)
        except AirflowNotFoundException:
            return None

    @staticmethod
    def _extra(extras: Mapping[str, Any], names: tuple[str, ...]) -> tuple[str | None, Any]:
        for name in names:
            for key in (name, EXTRA_PREFIX + name):
                value = extras.get(key)
                if value not in (None, ""):
                    return key, value
        return None, None

    def get_credentials(self) -> tuple[Any, str | None]:
        """Return ``(credentials, project)``; raise :class:`GcsAccessError` naming the fix."""
        try:
            import google.auth  # noqa: F401  (ships with google-cloud-storage)
            import google.cloud.storage  # noqa: F401
        except ImportError as err:
            raise GcsAccessError(
                f"Cloud Storage needs the google-cloud-storage client on the Airflow worker ({err}). Fix: "
                "pip install 'airflow-provider-tfpipe[gcs]' there.") from None
        conn = self._connection()
        where = f"connection {self.gcp_conn_id!r}"
        extras: Mapping[str, Any] = {}
        if conn is not None:
            conn_type = (conn.conn_type or "").lower()
            if conn_type not in CONN_TYPES:
                raise GcsAccessError(
                    f"{where} has conn type {conn.conn_type!r}, not Google Cloud. Fix: make it a "
                    "'google_cloud_platform' (or generic) connection with a key in its extra, or point "
                    "gcp_conn_id at such a connection.")
            extras = conn.extra_dejson or {}
        _, project = self._extra(extras, PROJECT_FIELDS)
        path_field, key_path = self._extra(extras, KEY_PATH_FIELDS)
        json_field, key_json = self._extra(extras, KEY_JSON_FIELDS)
        if key_path and key_json is not None:
            raise GcsAccessError(f"{where} has both extra {path_field} and extra {json_field}. "
                                 "Fix: keep only one of them.")
        emulator = os.environ.get(EMULATOR_ENV)
        if key_json is not None:
            what = f"{where} extra {json_field}"
            credentials, key_project = self._from_info(self._parse_key_json(key_json, what), what)
            self.credentials_source = f"{where} (key in extra {json_field})"
        elif key_path:
            what = f"{where} extra {path_field} ({key_path})"
            credentials, key_project = self._from_info(self._read_key_file(str(key_path), what), what)
            self.credentials_source = f"{where} (key file {key_path})"
        elif emulator:
            from google.auth.credentials import AnonymousCredentials

            credentials, key_project = AnonymousCredentials(), None
            project = project or os.environ.get("GOOGLE_CLOUD_PROJECT") or EMULATOR_PROJECT
            self.credentials_source = "anonymous credentials (no key; an emulator needs none)"
        else:
            import google.auth
            from google.auth.exceptions import DefaultCredentialsError

            why = f"{where} has no key" if conn is not None else f"there is no {where}"
            try:
                credentials, key_project = google.auth.default(scopes=list(SCOPES))
            except DefaultCredentialsError as err:
                raise GcsAccessError(
                    f"no Google credentials: {why}, and Application Default Credentials were not found "
                    f"({_short(err, 200)}). Fix: {_KEY_FIX}; for a local emulator set {EMULATOR_ENV}."
                ) from None
            self.credentials_source = f"Application Default Credentials ({why})"
        return credentials, project or key_project

    @staticmethod
    def _parse_key_json(value: Any, what: str, fix: str = "paste the whole JSON key file, unchanged") -> dict:
        from airflow.providers.common.compat.sdk import mask_secret

        if isinstance(value, Mapping):
            return dict(value)
        if not isinstance(value, str):
            raise GcsAccessError(f"{what} must be the key JSON as a string or an object, got a "
                                 f"{type(value).__name__}. Fix: {fix}.")
        mask_secret(value)
        try:
            info = json.loads(value)
        except json.JSONDecodeError as err:  # the message carries the position only, never the text
            raise GcsAccessError(f"{what} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}). "
                                 f"Fix: {fix}.") from None
        if not isinstance(info, dict):
            raise GcsAccessError(f"{what} must be a JSON object (a key file). Fix: {fix}.")
        return info

    @classmethod
    def _read_key_file(cls, path: str, what: str) -> dict:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            raise GcsAccessError(f"{what}: the key file does not exist on the worker. Fix: copy the JSON key "
                                 "there (keys are read by the Airflow worker, not by containers), or put the "
                                 "key JSON in extra keyfile_dict.") from None
        except OSError as err:
            raise GcsAccessError(f"{what}: cannot read the key file ({err.strerror}). Fix: make it readable "
                                 "by the user the Airflow worker runs as.") from None
        return cls._parse_key_json(text, f"{what}: the key file", fix="download the key again as JSON")

    @staticmethod
    def _from_info(info: dict, what: str) -> tuple[Any, str | None]:
        from airflow.providers.common.compat.sdk import mask_secret

        for secret_field in ("private_key", "client_secret", "refresh_token"):
            if isinstance(info.get(secret_field), str):
                mask_secret(info[secret_field])
        key_type = info.get("type")
        if key_type not in KEY_TYPES:
            raise GcsAccessError(
                f"{what}: key type {key_type!r} is not supported. Fix: use a service-account JSON key "
                "(\"type\": \"service_account\") or authorized-user credentials; for workload identity "
                "or other external accounts use Application Default Credentials instead.")
        try:
            if key_type == "service_account":
                from google.oauth2 import service_account

                credentials = service_account.Credentials.from_service_account_info(info, scopes=list(SCOPES))
            else:
                from google.oauth2.credentials import Credentials

                credentials = Credentials.from_authorized_user_info(info, scopes=list(SCOPES))
        except (ValueError, KeyError, TypeError) as err:
            raise GcsAccessError(
                f"{what} is not a usable {key_type} key ({_short(err, 200)}). Fix: create a new JSON key "
                "for the service account (IAM > Service accounts > Keys) and put the whole file in the "
                "connection.") from None
        return credentials, info.get("project_id") or info.get("quota_project_id")

    # -- client ---------------------------------------------------------------------------------

    def get_conn(self) -> Any:
        """The ``google.cloud.storage.Client`` (created once per hook)."""
        if self._client is None:
            from google.cloud import storage

            credentials, project = self.get_credentials()
            self._client = settle_environment(storage.Client(project=project, credentials=credentials))
            emulator = os.environ.get(EMULATOR_ENV)
            self.log.info("Cloud Storage: %s%s", self.credentials_source,
                          f", endpoint {emulator} ({EMULATOR_ENV})" if emulator else "")
        return self._client

    @contextlib.contextmanager
    def errors(self, action: str, uri: GcsUri | str, *, missing: str = "bucket") -> Iterator[None]:
        """Translate client errors of ``action`` on ``uri`` into messages naming the cause and the fix.

        ``missing`` says what a 404 means here: ``"bucket"`` (listing: fail without retry) or
        ``"object"`` (an object vanished or changed since it was listed: retry).
        """
        import requests
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth
        from google.cloud.storage.exceptions import DataCorruption

        uri = uri if isinstance(uri, GcsUri) else GcsUri.parse(uri)
        try:
            yield
        except AirflowException:
            raise
        except auth.RefreshError as err:
            raise GcsAccessError(
                f"{action}: the Google credentials from {self.credentials_source} were rejected when fetching "
                f"an access token ({_short(err, 200)}). Fix: the key may be deleted, disabled or not the "
                f"account's: create a new key and update the connection, or {_KEY_FIX}.") from err
        except auth.DefaultCredentialsError as err:
            raise GcsAccessError(f"{action}: no usable Google credentials ({_short(err, 200)}). Fix: {_KEY_FIX}.") from err
        except api.Unauthorized as err:
            raise GcsAccessError(
                f"{action}: Cloud Storage did not accept the credentials from {self.credentials_source} "
                f"(401: {_short(err.message, 200)}). Fix: {_KEY_FIX}.") from err
        except api.Forbidden as err:
            raise GcsAccessError(
                f"{action}: the credentials from {self.credentials_source} may not access {uri} "
                f"(403: {_short(err.message, 200)}). Fix: grant the account roles/storage.objectViewer "
                f"(stage-in) or roles/storage.objectAdmin (publish) on bucket {uri.bucket!r}.") from err
        except api.NotFound as err:
            if missing == "bucket":
                raise GcsAccessError(
                    f"{action}: bucket {uri.bucket!r} does not exist ({uri}). Fix: create it "
                    f"(`gcloud storage buckets create gs://{uri.bucket}`) or correct the bucket in the URI."
                ) from err
            raise GcsTransferError(f"{action}: {_short(err.message, 200)} (404): an object was deleted or "
                                   "replaced while it was being transferred; the retry lists again.") from err
        except api.GoogleAPICallError as err:
            raise GcsTransferError(f"{action}: Cloud Storage answered {err.code}: {_short(err.message, 300)}") from err
        except DataCorruption as err:
            raise GcsTransferError(f"{action}: the transferred bytes did not match their checksum "
                                   f"({_short(err, 200)}); the retry transfers them again.") from err
        except api.RetryError as err:
            # The library's own retry gave up (two minutes of network errors by default): the last
            # error it met says what went wrong, so it is told as if it had come alone.
            if isinstance(err.cause, BaseException) and not isinstance(err.cause, api.RetryError):
                with self.errors(action, uri, missing=missing):
                    raise err.cause from err
            raise GcsTransferError(f"{action}: {_short(err)}") from err
        except (auth.TransportError, requests.exceptions.RequestException) as err:
            where = os.environ.get(EMULATOR_ENV) or "storage.googleapis.com"
            if _certificate_refused(err):
                verify = getattr(getattr(self._client, "_http", None), "verify", True)
                bundle = f"the CA bundle {verify}" if isinstance(verify, str) else "the default CA bundle"
                raise GcsAccessError(
                    f"{action}: the TLS certificate of Cloud Storage at {where} could not be verified against "
                    f"{bundle} ({_certificate_reason(err)}). Fix: where a proxy or a private endpoint presents a "
                    "certificate of your own CA, set REQUESTS_CA_BUNDLE in the workers' environment to that "
                    "CA's PEM file; where one is set (REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE), check that it "
                    "holds the CA that signed the endpoint's certificate.") from err
            raise GcsTransferError(f"{action}: cannot reach Cloud Storage at {where}: {_short(err)}") from err


def _certificate_refused(err: BaseException) -> bool:
    """Whether ``err`` (or what it wraps) is a TLS certificate the client would not accept: a setting
    to fix, never a transient failure."""
    words = ("CERTIFICATE_VERIFY_FAILED", "certificate verify failed", "hostname mismatch")
    return any(word in str(error) for error in causes(err) for word in words)


def _certificate_reason(err: BaseException) -> str:
    """OpenSSL's own words (``[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: ...``),
    which requests buries at the end of a long connection-pool message."""
    text = " ".join(str(err).split())
    start = text.find("[SSL:")
    if start < 0:
        return _short(err, 200)
    end = min((i for i in (text.find(" (_ssl.c", start), text.find("')", start), text.find('")', start)) if i > 0),
              default=len(text))
    return text[start:end][:200]


def _listing_retry() -> Any:
    """google-cloud-storage's default retry, less a refused certificate (which it would retry for two
    minutes); the library keeps its own predicate private, so the transient errors are named here."""
    import http.client

    import requests
    import urllib3
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth
    from google.cloud.storage.retry import DEFAULT_RETRY

    retried = (api.TooManyRequests, api.InternalServerError, api.BadGateway, api.ServiceUnavailable,
               api.GatewayTimeout, ConnectionError, requests.ConnectionError, requests.exceptions.ChunkedEncodingError,
               requests.exceptions.Timeout, http.client.BadStatusLine, http.client.IncompleteRead,
               http.client.ResponseNotReady, urllib3.exceptions.PoolError, urllib3.exceptions.ProtocolError,
               urllib3.exceptions.SSLError, urllib3.exceptions.TimeoutError)

    def transient(err: BaseException) -> bool:
        if isinstance(err, auth.TransportError) and err.args and isinstance(err.args[0], BaseException):
            return transient(err.args[0])
        if isinstance(err, api.GoogleAPICallError):
            return err.code in (408, 429, 500, 502, 503, 504)
        return isinstance(err, retried)

    return DEFAULT_RETRY.with_predicate(lambda err: transient(err) and not _certificate_refused(err))


def settle_environment(client: Any) -> Any:
    """Fix ``client``'s HTTP settings (proxies, CA bundle) from the environment, without ``~/.netrc``, and
    switch off its bucket-metadata reads unless the library's traces are on; returns ``client``.

    A netrc entry for the storage host would replace the credentials' token header. The metadata
    read only labels trace spans and needs ``storage.buckets.get``, which a read-only key lacks. The
    library has no public setting for either.
    """
    session = client._http
    merged = session.merge_environment_settings(client._connection.get_api_base_url_for_mtls(), {}, None, None, None)
    session.proxies, session.verify = dict(merged["proxies"]), merged["verify"]
    session.trust_env = False
    if getattr(client, "_bucket_metadata_cache", None) is not None and not _storage_traces_on():
        client._bucket_metadata_cache = None  # the library tests it for truth before every use
    return client


def _storage_traces_on() -> bool:
    """Whether google-cloud-storage emits OpenTelemetry spans (its own switch, read at its import)."""
    try:
        from google.cloud.storage import _opentelemetry_tracing as tracing
    except ImportError:  # a release without traces has no bucket-metadata cache either
        return False
    return bool(getattr(tracing, "HAS_OPENTELEMETRY", False) and getattr(tracing, "enable_otel_traces", False))


def list_objects(hook: TfpipeGcsHook, uri: GcsUri, *, prefix: str | None = None, match_glob: str | None = None,
                 action: str = "listing") -> list[Any]:
    """Every object under ``prefix`` (default: ``uri.prefix``) of ``uri``'s bucket; no bucket: :class:`GcsAccessError`."""
    client = hook.get_conn()
    with hook.errors(f"{action} {uri}", uri, missing="bucket"):
        return list(client.list_blobs(uri.bucket, prefix=uri.prefix if prefix is None else prefix,
                                      match_glob=match_glob or None, retry=_listing_retry()))
