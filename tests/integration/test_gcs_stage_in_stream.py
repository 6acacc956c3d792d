"""Stage-in of a large batch through a forwarding HTTP proxy: the tar stream into the data volume runs
while the download processes still download, and those processes talk to Cloud Storage the way the
task's own client was set up to (real emulator, real engine, real forked processes)."""

from __future__ import annotations

import hashlib
import http.client
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import pytest

from tests.conftest import JsonReplies
from tests.integration.conftest import fake_context
from tfpipe.gcs.plan import MANIFEST_NAME
from tfpipe.operators.gcs import GcsStageInOperator

#: The dag_id label of this module's helper containers (tests on the other xdist worker run theirs).
HELPER_DAG = "tfpipe_gcs_stage_in_stream_test"

pytestmark = [pytest.mark.gcs, pytest.mark.integration]

#: How long the proxy holds the chosen download at most. Below the client's read timeout (60 s), so
#: a hold that runs out is a released response, not a client's retry.
HOLD_SECONDS = 45.0

#: Headers of one connection only (RFC 9110 7.6.1), never forwarded.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authenticate", "proxy-authorization", "te",
               "trailer", "transfer-encoding", "upgrade"}


class _ProxyHandler(BaseHTTPRequestHandler):
    """Forwards each request with an absolute URI to its target (``http.client``, one connection per
    request) and relays the status, headers and body."""

    protocol_version = "HTTP/1.1"
    server: ForwardingProxy

    def _forward(self) -> None:
        target = urlsplit(self.path)
        if target.scheme != "http" or not target.hostname:
            self.send_error(400, "only absolute http:// URIs are proxied here")
            return
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.send_error(501, "chunked request bodies are not proxied here")
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.record(self.command, target.path)
        headers = [(k, v) for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP]
        upstream = http.client.HTTPConnection(target.hostname, target.port or 80, timeout=120)
        try:
            upstream.putrequest(self.command, target.path + (f"?{target.query}" if target.query else ""),
                                skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                upstream.putheader(name, value)
            if body and not self.headers.get("Content-Length"):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body or None)
            reply = upstream.getresponse()
            data = reply.read()
            status, reason, reply_headers = reply.status, reply.reason, reply.getheaders()
        finally:
            upstream.close()
        self.server.maybe_hold(self.command, target)
        self.send_response(status, reason)
        for name, value in reply_headers:
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward  # noqa: N815  (http.server's names)

    def log_message(self, *args):
        pass


class ForwardingProxy(ThreadingHTTPServer):
    """A forwarding HTTP proxy on loopback that records every request as ``(method, path without
    the query, monotonic time)`` and can hold the response to one object's media download until
    :attr:`release` is set, or :data:`HOLD_SECONDS` pass (then it records that the hold timed out)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.seen: list[tuple[str, str, float]] = []
        self.release = threading.Event()
        self.held: str | None = None  # the quoted object name whose media download is held
        self.hold_began: float | None = None
        self.hold_outcome: str | None = None  # "released" or "timed out", once the held response went
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def __enter__(self) -> ForwardingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()  # a held request still waiting ends now
        self.shutdown()
        self.server_close()
        self._thread.join(timeout=10)

    def hold(self, object_name: str) -> None:
        """Hold the response to the first media download of ``object_name``."""
        self.held = quote(object_name, safe="~")  # as google-cloud-storage quotes it in the URL

    def record(self, method: str, path: str) -> None:
        with self._lock:
            self.seen.append((method, path, time.monotonic()))

    def maybe_hold(self, method: str, target) -> None:
        with self._lock:
            if (method != "GET" or self.held is None or self.hold_began is not None
                    or "alt=media" not in target.query or not target.path.endswith(f"/o/{self.held}")):
                return
            self.hold_began = time.monotonic()
        released = self.release.wait(HOLD_SECONDS)
        self.hold_outcome = "released" if released else "timed out"

    def media_downloads(self, bucket: str) -> list[str]:
        """The object names of every media download (``GET /download/storage/v1/b/<bucket>/o/<name>``) seen."""
        lead = f"/download/storage/v1/b/{bucket}/o/"
        with self._lock:
            return [unquote(path[len(lead):]) for method, path, _ in self.seen
                    if method == "GET" and path.startswith(lead)]


class _RefusingProxy(JsonReplies):
    """A proxy that answers every request 407 (as one that wants a login does) and records its path:
    fast to fail, with nothing retried, unlike a proxy nobody listens at."""

    seen: list[str] = []

    def _refuse(self):
        self.seen.append(urlsplit(self.path).path)
        self.reply(407, {"error": {"code": 407, "message": "not this proxy"}})

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _refuse  # noqa: N815  (http.server's names)


def _only_this_proxy(monkeypatch, proxy: str) -> None:
    """``HTTP_PROXY`` is ``proxy`` and nothing else of the environment picks or skips a proxy."""
    for name in ("NO_PROXY", "no_proxy", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", proxy)


def _large_batches_in_processes(monkeypatch) -> None:
    """Two download processes, also on a one-core machine; a batch downloaded in the worker's own
    threads fails the test. :data:`~tfpipe.gcs.sync.PROCESS_MIN_OBJECTS` is left as it is: the
    tests' batches are large enough to go to the processes on their own."""
    import tfpipe.gcs.sync

    def no_threads(*args, **kwargs):
        raise AssertionError("a batch downloaded in the worker's threads, not in the download processes")

    monkeypatch.setattr(tfpipe.gcs.sync, "DOWNLOAD_PROCESSES", 2)
    monkeypatch.setattr(tfpipe.gcs.sync, "_download", no_threads)


def _operator(home: Path, image: str, uri: str) -> GcsStageInOperator:
    return GcsStageInOperator(task_id="stage_in", data_volume=str(home / "data"), data_path="s/", image=image,
                              source_uri=uri, max_workers=4)


def test_the_tar_stream_reaches_the_volume_while_downloads_are_still_running(tmp_path, trainer_image, bucket,
                                                                            monkeypatch):
    """80 objects of 200 kB go to the download processes as one batch, in parts (the first of about
    1 MB, then about 4 MB each). The proxy holds the last object's download until the first
    object's file is in the volume, complete, on the engine's host: the tar stream took the first
    parts as they came down, while the last part was still downloading. A stage-in that waited for
    its downloads before streaming would never release the hold (it runs out instead); every
    byte still arrives."""
    import tfpipe.gcs.sync

    names = [f"raw/stream/part-{i:03d}.bin" for i in range(80)]
    bodies = {name: os.urandom(200 * 1024) for name in names}
    assert len(names) >= tfpipe.gcs.sync.PROCESS_MIN_OBJECTS, "one batch large enough for the download processes"
    assert sum(map(len, bodies.values())) > 3 * tfpipe.gcs.sync.PROCESS_PART_BYTES, "several parts before the last"
    for name, body in bodies.items():  # by the fixture's client, before any proxy is set
        bucket.blob(name).upload_from_string(body)
    _large_batches_in_processes(monkeypatch)
    target = tmp_path / "data" / "s"
    first, last = target / "part-000.bin", names[-1]
    stop = threading.Event()
    first_seen: list[float] = []

    with ForwardingProxy() as proxy:
        proxy.hold(last)

        def watch() -> None:
            """Release the held download once the first object's file is complete on the host."""
            while not stop.is_set():
                try:
                    if first.stat().st_size == len(bodies[names[0]]):
                        first_seen.append(time.monotonic())
                        proxy.release.set()
                        return
                except FileNotFoundError:
                    pass
                time.sleep(0.005)

        _only_this_proxy(monkeypatch, proxy.url)  # before the operator's hook makes its client
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        started = time.monotonic()
        try:
            result = _operator(tmp_path, trainer_image, f"gs://{bucket.name}/raw/stream").execute(
                fake_context("stage_in", dag_id=HELPER_DAG))
        finally:
            stop.set()
            watcher.join(timeout=10)
        took = time.monotonic() - started
        downloads = proxy.media_downloads(bucket.name)

    assert sorted(downloads) == names, "every object came down through the proxy, once"
    assert proxy.hold_began is not None, f"the last object's download ({last}) was never held"
    assert proxy.hold_outcome == "released", (
        f"the hold ran out after {HOLD_SECONDS:g} s ({took:.1f} s in all): the first object's file was not in the "
        "volume while the last object was still downloading, so the stream waited for the downloads")
    assert first_seen, "the watcher never saw the first file complete"
    assert (result["objects"], result["downloaded"], result["bytes_downloaded"]) == (
        len(names), len(names), sum(map(len, bodies.values())))
    for name, body in bodies.items():
        staged = target / name.rsplit("/", 1)[1]
        assert hashlib.sha256(staged.read_bytes()).digest() == hashlib.sha256(body).digest(), name
    assert (target / MANIFEST_NAME).is_file()


def test_download_processes_keep_the_proxy_the_task_client_was_made_with(tmp_path, trainer_image, bucket,
                                                                          monkeypatch):
    """The hook's client takes its proxy from the environment once, when it is made; the download
    processes are forked later, when the first large batch starts. Here the environment's proxy
    changes in between (to one that refuses every request): the processes still download through
    the proxy the task's client was made with, as every other request of the task does, and the
    stage-in succeeds. Processes that read the environment at their fork would go to the other
    proxy and fail."""
    import tfpipe.gcs.sync

    names = [f"raw/env/part-{i:03d}.csv" for i in range(72)]
    bodies = {name: f"x,label\n{i},{i % 10}\n".encode() * 60 for i, name in enumerate(names)}
    assert len(names) >= tfpipe.gcs.sync.PROCESS_MIN_OBJECTS, "one batch large enough for the download processes"
    for name, body in bodies.items():  # by the fixture's client, before any proxy is set
        bucket.blob(name).upload_from_string(body)
    _large_batches_in_processes(monkeypatch)
    # Parts of about 16 kB: the batch's parts go to both download processes.
    monkeypatch.setattr(tfpipe.gcs.sync, "PROCESS_PART_BYTES", 16 * 1024)

    refusing = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingProxy)
    refusing.daemon_threads = True
    threading.Thread(target=refusing.serve_forever, daemon=True).start()
    _RefusingProxy.seen.clear()
    real_stage_in = tfpipe.gcs.sync.stage_in
    changed: list[str] = []

    def environment_changes_then_stage_in(hook, *args, **kwargs):
        """The operator's hook has made its client (``execute`` checks the credentials first); the
        environment's proxy changes before the stage-in forks its download processes."""
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{refusing.server_address[1]}")
        changed.append(os.environ["HTTP_PROXY"])
        return real_stage_in(hook, *args, **kwargs)

    monkeypatch.setattr(tfpipe.gcs.sync, "stage_in", environment_changes_then_stage_in)
    error: BaseException | None = None
    try:
        with ForwardingProxy() as proxy:
            _only_this_proxy(monkeypatch, proxy.url)  # before the operator's hook makes its client
            try:
                result = _operator(tmp_path, trainer_image, f"gs://{bucket.name}/raw/env").execute(
                    fake_context("stage_in", dag_id=HELPER_DAG))
            except Exception as err:  # noqa: BLE001  (reported below, with what each proxy saw)
                error, result = err, None
            downloads = proxy.media_downloads(bucket.name)
            listings = [path for method, path, _ in proxy.seen if path == f"/storage/v1/b/{bucket.name}/o"]
    finally:
        refusing.shutdown()
        refusing.server_close()

    assert changed, "the environment changed before the stage-in"
    assert not _RefusingProxy.seen, (
        f"{len(_RefusingProxy.seen)} request(s) went to the proxy set after the task's client was made, e.g. "
        f"{_RefusingProxy.seen[:2]}; the stage-in {'failed: ' + repr(error)[:300] if error else 'succeeded'}")
    assert error is None, f"the stage-in failed: {error!r}"
    assert listings, "the task's client listed the bucket through the proxy it was made with"
    assert sorted(set(downloads)) == names, (
        f"{len(set(names) - set(downloads))} object(s) did not come down through the task client's proxy")
    assert (result["objects"], result["downloaded"]) == (len(names), len(names))
    for name, body in bodies.items():
        assert (tmp_path / "data" / "s" / name.rsplit("/", 1)[1]).read_bytes() == body, name
