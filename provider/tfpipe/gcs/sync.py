"""The stage-in sync: ``gs://bucket/prefix`` into the data volume, through the Docker engine.

Objects are listed and downloaded **on the worker** (only new or changed ones, compared with the
manifest of the last sync) with ``google.cloud.storage.transfer_manager.download_many``, in
batches that go to the engine as one tar stream through a :class:`~tfpipe.hooks.docker.VolumeHelper`,
each while the next batches download. Large batches download in worker processes (see
:data:`PROCESS_MIN_OBJECTS`), small ones in threads of this process. The listing of the target
directory and deletions run as programs of :mod:`trainer.volume_ops` in helper containers next to
the files (a target directory that does not exist yet needs neither: its directories lead the tar
stream); the manifest is written last, so an interrupted sync never passes for a complete one.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import multiprocessing
import os
import pickle
import posixpath
import queue
import tarfile
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import IO, Any, Union

from tfpipe.exceptions import StageInError
from tfpipe.gcs import Progress, megabytes
from tfpipe.gcs import plan as planner
from tfpipe.gcs.plan import (MANIFEST_NAME, MANIFEST_SCHEMA, Layout, RemoteObject, SyncPlan, batches, changed_since,
                             plan_layout, plan_sync)
from tfpipe.gcs.media import MediaReader
from tfpipe.hooks.docker import VolumeHelper, tar_bytes
from tfpipe.hooks.gcs import GcsUri, TfpipeGcsHook, http_settings, list_objects, settle_environment

LOG = logging.getLogger(__name__)

#: Objects up to this size wait in memory between their download and the engine; bigger ones are
#: spooled to the worker's disk. With at most ``2 + DOWNLOAD_PROCESSES`` batches held
#: (``planner.BATCH_BYTES`` each; those from the download processes wait on disk), that bounds the
#: memory a stage-in holds.
IN_MEMORY_BYTES = 8 * 1024 * 1024

#: Batches of at least this many objects download in :data:`DOWNLOAD_PROCESSES` forked worker
#: processes (each with ``max_workers / DOWNLOAD_PROCESSES`` download threads) into files on the
#: worker's disk. The per-object client work (requests, auth, checksums) is most of a stage-in's CPU
#: time; in threads it holds this process's GIL, which the tar stream to the engine needs too, so
#: on 2 cores the downloads, the stream and the engine's untar could not run side by side
#: (measured before :mod:`tfpipe.gcs.media` cut that work to a third: 500 objects of 400 kB,
#: 2.55 s in threads against 1.98 s in 2 processes, CPU time 2.98 s against 2.85 s). Smaller
#: batches (an incremental sync, a few files) stay in threads: two forks and a client per process
#: would cost more than they save. Read at run time: tests lower it.
PROCESS_MIN_OBJECTS = 64
#: Worker processes for large batches: one per core, at most 4 (more only add clients and forks).
DOWNLOAD_PROCESSES = min(4, os.cpu_count() or 1)
#: A large batch goes to the download processes in parts of about this many bytes (the tar
#: stream's piece size), and the stream takes each part as soon as it is down, in order. Fed whole
#: batches (32 MB), the stream started only once the first batch was down and ran at the download
#: pace after it, so a sync ended about one batch's download time after its last download (0.25 s
#: of 1.2 s for 500 objects of 400 kB); parts shrink that head start and tail to a part's.
#: Read at run time: tests lower it.
PROCESS_PART_BYTES = 4 * 1024 * 1024
#: The first part of a sync is smaller: the stream starts as soon as it is down (a first part of
#: 4 MB kept the engine idle for most of a 0.1 s start).
FIRST_PART_BYTES = 1024 * 1024


def _uid_gid(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    return int(uid), int(gid or uid)


def stage_in(hook: TfpipeGcsHook, helper: VolumeHelper, uri: GcsUri, data_path: str, *, user: str = "1000:1000",
             max_workers: int = 8, log: logging.Logger = LOG) -> dict[str, Any]:
    """Sync ``uri`` to ``data_path`` in the volume of ``helper`` (mounted at ``helper.mount_point``).

    Returns counts for XCom (no credentials). See :func:`plan_layout` and :func:`plan_sync`.
    """
    blobs = list_objects(hook, uri, action="listing the source")
    layout = plan_layout(uri, blobs, data_path)
    if not layout.objects:
        raise StageInError(
            f"{uri} matched no objects{' (only ' + ', '.join(layout.ignored[:3]) + ')' if layout.ignored else ''}. "
            "Fix: check the bucket and prefix (a folder prefix lists the objects below '<prefix>/'; "
            "one object's full name stages just that file).")
    if layout.ignored and layout.single:
        log.warning("%s names one object: staging only it (%d other object(s) share the prefix)", uri,
                    len(layout.ignored))
    mount = helper.mount_point.rstrip("/")
    root = f"{mount}/{layout.target_dir}".rstrip("/") if layout.target_dir else mount
    uid, gid = _uid_gid(user)
    where = f"{helper.host_path}/{layout.target_dir}".rstrip("/")
    total = len(layout.objects)
    total_bytes = sum(o.size for o in layout.objects.values())
    downloaded = downloaded_bytes = 0
    progress = Progress()
    with tempfile.TemporaryDirectory(prefix="tfpipe-stage-in-") as tmp, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfpipe-engine") as engine:
        stream_root, prefix, lead = root, "", b""
        if (missing := _missing_root(helper, root, mount)) is not None:
            # A target directory that did not exist holds nothing to list, keep or delete: no survey
            # (a helper container costs about a second, and the tar stream would wait for it). The
            # stream goes into the deepest directory that exists, led by the missing ones (owned by
            # the stage's user): no archive call of their own for the stream to wait for.
            stream_root, missing_dirs = missing
            prefix = posixpath.relpath(root, stream_root)
            lead = b"".join(_dir_info(posixpath.relpath(d, stream_root), uid, gid).tobuf(
                tarfile.PAX_FORMAT, "utf-8", "surrogateescape") for d in reversed(missing_dirs))
            survey = Future()
            survey.set_result(_planned(uri, layout, where, {}, uid, gid, log))
            early = changed_since(layout.objects, None)
        else:
            # Every engine call runs in this one thread, in order: first the survey of the target
            # directory (a helper container: about a second), then the tar stream. Meanwhile this
            # thread already downloads what the last sync's manifest shows must change, whatever
            # the directory holds.
            survey = engine.submit(_survey, helper, uri, layout, root, where, uid, gid, log)
            early = changed_since(layout.objects, _read_manifest(helper, root, layout.manifest_name))
        ended: list[bytes | None] = []  # the stream's last piece, once sent

        def ending() -> bytes | None:
            ended.append(_new_manifest(uri, layout, survey.result().listing, uid, gid, prefix))
            return ended[-1]

        for batch in _transfer(hook, helper, engine, survey, uri, early, _Target(stream_root, prefix, lead), tmp,
                               max_workers, ending, log):
            downloaded += len(batch)
            downloaded_bytes += sum(o.size for o in batch)
            unchanged = survey.result().plan.unchanged  # done: it ran before the tar stream
            if progress.due(len(unchanged) + downloaded, total):
                log.info("staged %d/%d objects, %s", len(unchanged) + downloaded, total,
                         megabytes(downloaded_bytes + sum(o.size for o in unchanged)))
        listing, plan = survey.result().listing, survey.result().plan

    if not ended and (manifest_tar := _new_manifest(uri, layout, listing, uid, gid, prefix)) is not None:
        helper.put_archive(stream_root, lead + manifest_tar)  # no tar stream ran (nothing to download)
    if not downloaded and not plan.delete:
        log.info("stage-in: %s is up to date (%d object(s), %s)", where, total, megabytes(total_bytes))
    data_rel = posixpath.join(layout.target_dir, layout.single) if layout.single else layout.target_dir
    return {"source": str(uri), "target": f"{helper.host_path}/{data_rel}".rstrip("/"), "objects": total,
            "bytes": total_bytes, "downloaded": downloaded, "bytes_downloaded": downloaded_bytes,
            "unchanged": len(plan.unchanged), "deleted": len(plan.delete), "untracked": len(plan.untracked)}


def _new_manifest(uri: GcsUri, layout: Layout, listing: dict[str, Any], uid: int, gid: int,
                  prefix: str = "") -> bytes | None:
    """The sync's manifest as a tar archive of that one file (named below ``prefix``), or ``None``
    when the target directory's (in ``listing``) already says the same."""
    manifest = {"schema": MANIFEST_SCHEMA, "source": str(uri),
                "objects": {rel: o.manifest_entry() for rel, o in sorted(layout.objects.items())}}
    old = listing.get("manifest") or {}
    if old.get("objects") == manifest["objects"] and old.get("source") == manifest["source"]:
        return None
    manifest["synced_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return tar_bytes(posixpath.join(prefix, layout.manifest_name), json.dumps(manifest, indent=1).encode(),
                     uid=uid, gid=gid)


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


@dataclass
class _Survey:
    """The target directory as the engine's helper listed it, and the sync plan made from it."""

    listing: dict[str, Any]
    plan: SyncPlan
    dirs: set[str]  # directories below the target that exist (or are in a tar already sent)
    uid: int
    gid: int


def _survey(helper: VolumeHelper, uri: GcsUri, layout: Layout, root: str, where: str, uid: int, gid: int,
            log: logging.Logger) -> _Survey:
    """List the target directory on the engine (making it), plan the sync, delete what the bucket lost."""
    listing = helper.run_program("list_dir", {
        "root": root, "uid": uid, "gid": gid, "manifest": layout.manifest_name, "marker": MANIFEST_NAME,
        "only": [layout.single] if layout.single else None})
    if listing.get("error") == "not_a_directory":
        raise StageInError(
            f"{uri} is a folder of objects, but the data path {layout.target_dir!r} is a file ({where} on the "
            "engine's host). Fix: point the URI at one object (gs://bucket/path/file.csv) to stage a single "
            "file, or set data.path to a directory.")
    survey = _planned(uri, layout, where, listing, uid, gid, log)
    delete = survey.plan.delete
    if delete:  # before any tar: a new object may take the place of a deleted one
        removed = helper.run_program("delete_files", {"root": root, "delete": delete})["removed"]
        log.info("removed %d file(s) whose objects were deleted from the bucket: %s", removed,
                 ", ".join(delete[:5]) + (" ..." if len(delete) > 5 else ""))
    return survey


def _planned(uri: GcsUri, layout: Layout, where: str, listing: dict[str, Any], uid: int, gid: int,
             log: logging.Logger) -> _Survey:
    """The sync plan for the target directory's ``listing`` (``list_dir``'s result; ``{}``: empty)."""
    plan = plan_sync(layout.objects, listing.get("manifest"), listing.get("files") or {})
    log.info("stage-in %s -> %s: %d object(s), %s; %d to download, %d unchanged, %d to delete",
             uri, where, len(layout.objects), megabytes(sum(o.size for o in layout.objects.values())),
             len(plan.download), len(plan.unchanged), len(plan.delete))
    if plan.untracked:
        log.warning("%d file(s) in %s are not from %s and were left in place (prep reads them if they match "
                    "data.format): %s", len(plan.untracked), where, uri, ", ".join(plan.untracked[:5]))
    return _Survey(listing, plan, set(listing.get("dirs") or []), uid, gid)


def _missing_root(helper: VolumeHelper, root: str, mount: str) -> tuple[str, list[str]] | None:
    """Whether the target directory ``root`` is missing, from the engine's stats: ``(the deepest
    existing directory on its path, the missing directories below it)``, or ``None`` when ``root``
    exists or something on its path is not a directory (the survey says what)."""
    from docker.errors import APIError

    missing, path = [], root
    try:
        while path.startswith(f"{mount}/") and (is_dir := helper.is_dir(path)) is None:
            missing.append(path)
            path = posixpath.dirname(path)
    except APIError:  # e.g. a file on the way (the engine cannot stat below it): the survey says so
        return None
    if not missing or not (path == mount or is_dir):
        return None
    return path, missing


def _read_manifest(helper: VolumeHelper, root: str, name: str) -> dict[str, Any] | None:
    """The last sync's manifest, read through the engine's archive API; None when absent or unreadable.

    Only a head start: the survey's listing is what the plan is made from.
    """
    from docker.errors import DockerException

    try:
        raw = helper.read_file(f"{root}/{name}")
        return json.loads(raw) if raw else None
    except (DockerException, ValueError):  # e.g. the data path is a file: the survey says so
        return None


@dataclass
class _Target:
    """Where the tar stream goes: ``root`` (an existing directory), with every member named below
    ``prefix`` (the target directory relative to ``root``; empty when it is ``root``) and the tar
    members ``lead`` (the target's missing directories) first."""

    root: str
    prefix: str = ""
    lead: bytes = b""


class _Aborted(Exception):
    """The worker stopped the transfer (its own error follows); the engine gets no complete tar."""


def _transfer(hook: TfpipeGcsHook, helper: VolumeHelper, engine: ThreadPoolExecutor, survey: Future, uri: GcsUri,
              early: list[RemoteObject], target: _Target, tmp: str, max_workers: int,
              ending: Callable[[], bytes | None], log: logging.Logger = LOG) -> Iterator[list[RemoteObject]]:
    """Download batch by batch (``early`` first, then what else the survey's plan downloads) into
    one tar stream to the engine; yield each batch once the engine has been sent it. The stream
    ends with ``ending()`` (the manifest's tar, or None), asked for once every batch is in it: the
    engine writes the manifest only after every file before it, and a stream cut short has none.

    One ``put_archive`` for the whole sync (each call costs the engine a mount namespace and an
    untar process), fed batch by batch (a large batch part by part, each once it is down) while
    the next batches download (up to ``_Downloads.ahead`` of them at once); at most
    ``2 + _Downloads.ahead`` batches are held on the worker.
    """

    def todo() -> Iterator[list[RemoteObject]]:
        limits = (planner.BATCH_BYTES, planner.BATCH_OBJECTS)  # read at run time: tests lower them
        yield from batches(early, *limits)
        taken = {o.rel for o in early}
        yield from batches([o for o in survey.result().plan.download if o.rel not in taken], *limits)

    downloads = _Downloads(hook, uri, tmp, max_workers, log)
    ready: queue.Queue = queue.Queue()  # downloaded batches for the stream; None ends it
    sent: queue.Queue = queue.Queue()  # batches the stream has handed to the engine
    room = threading.Semaphore(2 + downloads.ahead)  # batches held on the worker
    pending: collections.deque = collections.deque()  # (batch, its download) in order
    put: Future | None = None

    def wait_for_room() -> None:
        """Until fewer than two batches are held; a stream that ended (the engine's error) stops it all."""
        while True:
            if put is not None and put.done():
                put.result()  # raises the engine's error
                raise RuntimeError("the tar stream to the engine ended before the last batch")
            if room.acquire(timeout=0.2):
                return

    def drain() -> Iterator[list[RemoteObject]]:
        while not sent.empty():
            yield sent.get()

    def hand_over() -> None:
        """The oldest pending batch to the tar stream (started with its first part), part by part
        as each is downloaded."""
        nonlocal put
        batch, download = pending.popleft()
        for part, files in downloads.parts(batch, download):
            ready.put((part, files))
            if put is None:
                put = engine.submit(_put_stream, helper, target, survey, ready, sent, room, ending)
        ready.put(_BatchEnd(batch))

    try:
        for batch in todo():
            if survey.done():
                survey.result()  # a failed survey stops the downloads
            wait_for_room()
            pending.append((batch, downloads.start(batch)))
            # Up to ``ahead`` batches download while the stream takes the ones before them.
            while pending and (len(pending) > downloads.ahead or downloads.done(pending[0][1])):
                hand_over()
                yield from drain()
        while pending:
            hand_over()
            yield from drain()
        downloads.close()
        if put is None:
            return
        ready.put(None)
        put.result()
        yield from drain()
    except BaseException:
        downloads.close(cancel=True)
        if put is not None:
            ready.put(_Aborted)
            with contextlib.suppress(BaseException):
                put.result()
        while not ready.empty():
            item = ready.get()
            if isinstance(item, tuple):
                _close(item[1])
        for _batch, download in pending:
            if isinstance(download, dict):
                _close(download)
        raise


@dataclass
class _BatchEnd:
    """On the stream's queue after a batch's last part: the batch is in the stream."""

    batch: list[RemoteObject]


#: A batch's download: its files (downloaded in threads), or its parts and their futures.
_Download = Union[dict[str, IO[bytes]], list[tuple[list[RemoteObject], Future]]]


class _Downloads:
    """Where batches download: in this process's threads (:func:`_download`, done when started),
    or, for batches of :data:`PROCESS_MIN_OBJECTS` or more, in a pool of forked worker processes
    made at the first such batch, part by part (:data:`PROCESS_PART_BYTES`), into files in ``tmp``
    (:func:`_download_in_process`).
    """

    def __init__(self, hook: TfpipeGcsHook, uri: GcsUri, tmp: str, max_workers: int,
                 log: logging.Logger = LOG) -> None:
        self.hook, self.uri, self.tmp, self.max_workers, self.log = hook, uri, tmp, max_workers, log
        self.processes = DOWNLOAD_PROCESSES if "fork" in multiprocessing.get_all_start_methods() else 1
        #: batches that may download while the stream has not taken the one before them
        self.ahead = self.processes if self.processes > 1 else 0
        self._pool: ProcessPoolExecutor | None = None
        self._daemon_cleared = False
        self._client_state = b""
        self._count = 0

    def start(self, batch: list[RemoteObject]) -> _Download:
        """Start downloading ``batch``: its files (threads: already done) or its parts' futures."""
        if not self.ahead or len(batch) < PROCESS_MIN_OBJECTS:
            return _download(self.hook, self.uri, batch, self.tmp, self.max_workers)
        if self._pool is None:
            self._allow_children()
            client = self.hook.get_conn()
            # fork: the children start at once with everything imported (a spawned interpreter
            # would cost about a second of CPU each). They only download with a client of their
            # own: no Airflow calls, and no logging unless the library's debug logging is on, so
            # locks other threads of this process held at the fork are not taken in them. The
            # credentials travel pickled (a fetched token included), as the library's own process
            # workers send them. So do the task client's HTTP settings: the children are forked
            # later than that client was made, and must not read an environment changed since.
            self._client_state = pickle.dumps((client.project, client._credentials, http_settings(client)))
            self._pool = ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("fork"))
            self.log.info("downloading batches of %d objects or more in %d forked processes, %d threads each",
                          PROCESS_MIN_OBJECTS, self.processes, max(1, self.max_workers // self.processes))
        parts = []
        head = [] if self._count else batches(batch, min(FIRST_PART_BYTES, PROCESS_PART_BYTES), len(batch))[0]
        for part in ([head] if head else []) + batches(batch[len(head):], PROCESS_PART_BYTES, len(batch)):
            self._count += 1
            items = [(o.name, o.generation, o.size, os.path.join(self.tmp, f"{self._count}-{i}"))
                     for i, o in enumerate(part)]
            parts.append((part, self._pool.submit(
                _download_in_process, self._client_state, self.hook.credentials_source, str(self.uri), items,
                max(1, self.max_workers // self.processes))))
        return parts

    def _allow_children(self) -> None:
        """Let this process start the download processes: clear its daemon flag if it is set.

        A Celery worker's pool processes are daemonic, and so is the task process Airflow forks
        from one: multiprocessing then refuses to start children ("daemonic processes are not
        allowed to have children"), which would fail every large stage-in on a Celery deployment.
        The flag guards against children outliving a daemon killed with its parent; these never
        outlive the stage-in, whose pool is shut down before it returns. So it is cleared while
        the pool lives and set again by :meth:`close`.
        """
        me = multiprocessing.current_process()
        if me.daemon:
            me.daemon = False
            self._daemon_cleared = True

    @staticmethod
    def done(download: _Download) -> bool:
        """Whether the stream could take the start of ``download`` now."""
        return isinstance(download, dict) or download[0][1].done()

    @staticmethod
    def parts(batch: list[RemoteObject], download: _Download) -> Iterator[tuple[list[RemoteObject],
                                                                               dict[str, IO[bytes]]]]:
        """``(objects, their files: rel -> open file)`` of ``batch`` in order, each once downloaded;
        raises the download's error."""
        if isinstance(download, dict):
            yield batch, download
            return
        for part, future in download:
            paths, error = future.result()
            files: dict[str, IO[bytes]] = {}
            try:
                if error is not None:
                    raise error  # already the hook's error, naming the object and the fix
                for obj, path in zip(part, paths):
                    files[obj.rel] = open(path, "rb")  # noqa: SIM115  (closed after the tar stream)
                    os.unlink(path)  # the open file stays readable; nothing is left behind
            except BaseException:
                _close(files)
                raise
            yield part, files

    def close(self, cancel: bool = False) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=cancel)
            self._pool = None
        if self._daemon_cleared:
            multiprocessing.current_process().daemon = True
            self._daemon_cleared = False


_PROCESS_CLIENTS: dict[bytes, Any] = {}  # in a download process: its client, made once


def _download_in_process(client_state: bytes, credentials_source: str, uri: str,
                         items: list[tuple[str, int | None, int, str]],
                         workers: int) -> tuple[list[str], Exception | None]:
    """In a download process: ``items`` (name, generation, size, path) into their paths with
    :func:`_download_many` (``workers`` threads); returns the paths and the first error, already
    the hook's (:meth:`TfpipeGcsHook.errors`: it names the object and the fix)."""
    from google.cloud import storage

    client = _PROCESS_CLIENTS.get(client_state)
    if client is None:
        project, credentials, settings = pickle.loads(client_state)
        client = _PROCESS_CLIENTS[client_state] = settle_environment(
            storage.Client(project=project, credentials=credentials), settings)
    gcs_uri = GcsUri.parse(uri)
    results = _download_many(client.bucket(gcs_uri.bucket), items, workers)
    hook = TfpipeGcsHook(gcp_conn_id=None)  # for its messages only: the credentials are the client's
    hook.credentials_source = credentials_source
    paths = [item[3] for item in items]
    try:
        _raise_first_error(hook, gcs_uri, [item[0] for item in items], results)
    except Exception as err:  # noqa: BLE001  (handed to the worker, which raises it)
        err.__cause__ = err.__context__ = None  # the library's error may not pickle
        err.__traceback__ = None
        return paths, err
    return paths, None


def _put_stream(helper: VolumeHelper, target: _Target, survey: Future, ready: queue.Queue, sent: queue.Queue,
                room: threading.Semaphore, ending: Callable[[], bytes | None]) -> None:
    """In the engine's thread: one tar of ``target.lead`` and every batch put on ``ready``, then
    ``ending()``, streamed into ``target.root``."""

    def pieces() -> Iterator[bytes]:
        if target.lead:
            yield target.lead
        while (item := ready.get()) is not None:
            if item is _Aborted:
                raise _Aborted()
            if isinstance(item, _BatchEnd):
                room.release()
                sent.put(item.batch)
                continue
            part, files = item
            try:
                yield from _tar_pieces(_tar_entries(part, files, survey.result(), target.prefix))
            finally:
                _close(files)
        last = ending()  # a whole archive of its own, so it ends this one too
        yield last if last is not None else tarfile.NUL * (2 * tarfile.BLOCKSIZE)

    helper.put_archive(target.root, pieces())  # type: ignore[arg-type]  # streamed, chunked


def _download(hook: TfpipeGcsHook, uri: GcsUri, batch: list[RemoteObject], tmp: str,
              max_workers: int) -> dict[str, IO[bytes]]:
    """Download ``batch`` (the listed generations, CRC32C-checked) in threads of this process.

    Returns rel -> the object's bytes: in memory up to :data:`IN_MEMORY_BYTES`, spooled to ``tmp``
    beyond. The client, its credentials and its connection pool are this process's.
    """
    bucket = hook.get_conn().bucket(uri.bucket)
    files: dict[str, IO[bytes]] = {
        obj.rel: tempfile.SpooledTemporaryFile(max_size=IN_MEMORY_BYTES, dir=tmp) for obj in batch}  # noqa: SIM115
    try:
        results = _download_many(bucket, [(o.name, o.generation, o.size, files[o.rel]) for o in batch], max_workers)
        _raise_first_error(hook, uri, [o.name for o in batch], results)
    except BaseException:
        _close(files)
        raise
    return files


def _download_many(bucket: Any, jobs: list[tuple[str, int | None, int, Any]], max_workers: int) -> list[Any]:
    """Download ``jobs`` (name, generation, size, file or path) in ``max_workers`` threads; the
    results in the order of ``jobs`` (None or the object's exception).

    Objects up to :data:`IN_MEMORY_BYTES` come in one read each, through :class:`MediaReader` where
    it can take them, else with the library's single-shot download (instead of its 8 kB chunks: a
    Python loop turn per chunk was most of the download's CPU time); bigger ones stream with
    ``transfer_manager.download_many``, so no worker holds a whole large object in memory.
    """
    from google.cloud.storage import transfer_manager

    results: list[Any] = [None] * len(jobs)
    small = [i for i, job in enumerate(jobs) if job[2] <= IN_MEMORY_BYTES]
    large = [i for i, job in enumerate(jobs) if job[2] > IN_MEMORY_BYTES]
    if small:
        reader = _reader(bucket.client)

        def one(i: int) -> Any:
            name, generation, _size, target = jobs[i]
            blob = bucket.blob(name, generation=generation or None)
            try:
                body = reader.read(blob)
                if body is None:  # the library's download: its retries, checks and errors
                    if isinstance(target, str):
                        blob.download_to_filename(target, checksum="crc32c", single_shot_download=True)
                    else:
                        blob.download_to_file(target, checksum="crc32c", single_shot_download=True)
                elif isinstance(target, str):
                    with open(target, "wb") as f:
                        f.write(body)
                else:
                    target.write(body)
            except Exception as err:  # noqa: BLE001  (handed back, as download_many does)
                return err
            return None

        with ThreadPoolExecutor(max(1, min(max_workers, len(small)))) as pool:
            for i, result in zip(small, pool.map(one, small)):
                results[i] = result
    if large:
        pairs = [(bucket.blob(jobs[i][0], generation=jobs[i][1] or None), jobs[i][3]) for i in large]
        done = transfer_manager.download_many(
            pairs, download_kwargs={"checksum": "crc32c"}, worker_type=transfer_manager.THREAD,
            max_workers=max(1, min(max_workers, len(large))))
        for i, result in zip(large, done):
            results[i] = result
    return results


_READERS: weakref.WeakKeyDictionary[Any, MediaReader] = weakref.WeakKeyDictionary()


def _reader(client: Any) -> MediaReader:
    """The :class:`MediaReader` of ``client`` (one per client: its connections are kept)."""
    reader = _READERS.get(client)
    if reader is None:
        reader = _READERS[client] = MediaReader(client)
    return reader


def _raise_first_error(hook: TfpipeGcsHook, uri: GcsUri, names: list[str], results: list[Any]) -> None:
    """Raise the first failed download of ``names`` as the hook's error (it names the object and the fix)."""
    for name, result in zip(names, results):
        if isinstance(result, BaseException):
            with hook.errors(f"downloading gs://{uri.bucket}/{name}", uri, missing="object"):
                raise result


def _close(files: dict[str, IO[bytes]]) -> None:
    for handle in files.values():
        handle.close()


def _tar_entries(batch: list[RemoteObject], files: dict[str, IO[bytes]], survey: _Survey,
                 prefix: str = "") -> Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]]:
    """The tar members of ``batch`` (named below ``prefix``): parent directories not there yet, then
    each object's bytes."""
    lead = f"{prefix}/" if prefix else ""
    for obj in batch:
        for parent in _parents(obj.rel):
            if parent not in survey.dirs:
                survey.dirs.add(parent)
                yield _dir_info(lead + parent, survey.uid, survey.gid), None
        info = tarfile.TarInfo(lead + obj.rel)
        info.size = files[obj.rel].seek(0, os.SEEK_END)
        info.mode, info.uid, info.gid, info.mtime = 0o644, survey.uid, survey.gid, obj.updated
        yield info, files[obj.rel]


def _dir_info(name: str, uid: int, gid: int) -> tarfile.TarInfo:
    """The tar member of a directory the sync makes: ``uid:gid``, mode 755."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.uid, info.gid = tarfile.DIRTYPE, 0o755, time.time(), uid, gid
    return info


def _tar_pieces(entries: Iterator[tuple[tarfile.TarInfo, IO[bytes] | None]],
                chunk: int = 4 << 20) -> Iterator[bytes]:
    """The tar members ``entries`` (member, its bytes or None) in pieces of at least ``chunk`` bytes
    (the last one smaller): few socket writes, for each of which this thread has to win the GIL
    back from the download threads. Each piece is one join of the parts: the only copy made here."""
    parts: list[bytes] = []
    size = 0
    for info, handle in entries:
        parts.append(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))
        size += len(parts[-1])
        if handle is not None:
            handle.seek(0)
            while block := handle.read(chunk):
                parts.append(block)
                size += len(block)
                if size >= chunk:
                    yield b"".join(parts)
                    parts.clear()
                    size = 0
            if padding := -info.size % tarfile.BLOCKSIZE:
                parts.append(tarfile.NUL * padding)
                size += padding
    if parts:
        yield b"".join(parts)
