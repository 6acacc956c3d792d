"""One GET per object over a kept-alive ``http.client`` connection: the stage-in's download of small objects.

google-cloud-storage downloads an object through ``requests`` and ``urllib3`` (sessions, adapters,
URL parsing and header merging at every request). For objects of a few hundred kB that is most of
a download's client CPU time: 500 objects of 400 kB from the emulator cost 1.97 ms of CPU each
through ``Blob.download_to_file`` (single shot, CRC32C) against 0.69 ms as one ``http.client``
request each (bench/NOTES.md, 2026-12-06). A stage-in is CPU-bound on a small worker, so that is
its pace.

This reader takes only the plain case and leaves everything else to the library, object by
object: it asks for the library's own media URL (``Blob._get_download_url``: host, universe
domain, generation), the credentials' own headers (``before_request``, which refreshes an expired
token), and checks the body against the CRC32C the service sends. A reply that is not a plain
``200`` with that checksum and no content encoding (an error, a redirect, a gzip-stored object),
and any network error, makes :meth:`MediaReader.read` return ``None``: the caller then downloads
that object with the library, which retries, checks and raises exactly as it always does. A client
that talks through a proxy, with a client certificate, without certificate checks or with a CA bundle
``ssl`` cannot load never uses it.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
from typing import Any
from urllib.parse import urlsplit

from tfpipe.hooks.gcs import crc32c_of_bytes

#: Seconds a connection waits for the service (the library's default read timeout).
TIMEOUT = 60.0
#: Idle connections a reader keeps: as many as a stage-in's download threads in one process.
KEPT = 16


class MediaReader:
    """Plain single-shot GETs of objects for a ``google.cloud.storage.Client`` whose HTTP settings
    :func:`tfpipe.hooks.gcs.settle_environment` fixed; its connections are kept between reads and
    shared by the threads that read (at most :data:`KEPT` idle). It holds no reference to the
    client, so a cache keyed weakly by the client lets both go together."""

    def __init__(self, client: Any) -> None:
        session = client._http
        self.credentials = client._credentials
        #: a token refresh goes through the session's own transport, as the library's requests do
        self._refresh: Any = getattr(session, "_auth_request", None)
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._ssl: ssl.SSLContext | None = None
        base = urlsplit(client._connection.API_BASE_URL)
        self.scheme, self.host, self.port = base.scheme, base.hostname or "", base.port
        verify = session.verify
        self.usable = (self.scheme in ("http", "https") and bool(self.host)
                       and not session.proxies.get(self.scheme) and not session.proxies.get("all")
                       and verify is not False and not getattr(session, "is_mtls", False))
        if self.usable and self.scheme == "https":
            if verify is True:
                import certifi  # what requests trusts by default, so the same roots as the library's

                verify = certifi.where()
            try:
                self._ssl = (ssl.create_default_context(capath=verify) if os.path.isdir(verify)
                             else ssl.create_default_context(cafile=verify))
            except (OSError, ssl.SSLError):  # an unreadable bundle: the library's download names it
                self.usable = False

    def read(self, blob: Any) -> bytes | None:
        """The bytes of ``blob`` (its generation, if set), CRC32C-checked; ``None`` when the library
        must download it instead (see the module)."""
        if not self.usable:
            return None
        url = urlsplit(blob._get_download_url(blob.client))
        if url.scheme != self.scheme or url.hostname != self.host or url.port != self.port:
            return None
        headers: dict[str, str] = {}
        try:
            self.credentials.before_request(self._refresher(), "GET", url.geturl(), headers)
        except Exception:  # noqa: BLE001  (the library meets the same error, and names it)
            return None
        path = f"{url.path}?{url.query}" if url.query else url.path
        for attempt in (1, 2):
            conn, reused = self._take()
            try:
                conn.request("GET", path, headers=headers)
                reply = conn.getresponse()
                body = reply.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                # A kept connection the service closed meanwhile fails at its next request: once
                # more on a new one. Anything else is the library's to retry and name.
                if not (reused and attempt == 1):
                    return None
        if reply.will_close:
            conn.close()
        else:
            self._give_back(conn)
        if (reply.status != 200 or reply.getheader("Content-Encoding")
                or (reply.getheader("x-goog-stored-content-encoding") or "identity") != "identity"):
            return None
        return body if _crc32c_matches(body, reply.getheader("x-goog-hash")) else None

    def close(self) -> None:
        """Close the kept connections (a later read opens new ones)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _refresher(self) -> Any:
        if self._refresh is None:
            from google.auth.transport.requests import Request

            self._refresh = Request()
        return self._refresh

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """A kept connection (``True``) or a new one (``False``)."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=TIMEOUT, context=self._ssl), False
        return http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < KEPT:
                self._idle.append(conn)
                return
        conn.close()


def _crc32c_matches(body: bytes, hashes: str | None) -> bool:
    """Whether ``x-goog-hash`` names a CRC32C and ``body`` has it (none named: ``False``, so the
    library, which checks what it can, downloads the object)."""
    for item in (hashes or "").split(","):
        name, _, value = item.strip().partition("=")
        if name == "crc32c":
            return crc32c_of_bytes(body) == value
    return False
