"""The stage-in sync: ``gs://bucket/prefix`` into the data volume, through the Docker engine.

Objects are listed and downloaded **on the worker** (only new or changed ones, compared with the
manifest of the last sync), in parallel, and handed to the engine as tar streams through a
:class:`~tfpipe.hooks.docker.VolumeHelper`; the listing and deletions run as programs of
:mod:`trainer.volume_ops` in helper containers next to the files.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import tarfile
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any

from tfpipe.exceptions import StageInError
from tfpipe.gcs import Progress, megabytes
from tfpipe.gcs.plan import MANIFEST_NAME, MANIFEST_SCHEMA, RemoteObject, batches, plan_layout, plan_sync
from tfpipe.hooks.docker import VolumeHelper, tar_bytes
from tfpipe.hooks.gcs import GcsUri, TfpipeGcsHook, list_objects

LOG = logging.getLogger(__name__)


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
    listing = helper.run_program("list_dir", {
        "root": root, "uid": uid, "gid": gid, "manifest": layout.manifest_name, "marker": MANIFEST_NAME,
        "only": [layout.single] if layout.single else None})
    where = f"{helper.host_path}/{layout.target_dir}".rstrip("/")
    if listing.get("error") == "not_a_directory":
        raise StageInError(
            f"{uri} is a folder of objects, but the data path {layout.target_dir!r} is a file ({where} on the "
            "engine's host). Fix: point the URI at one object (gs://bucket/path/file.csv) to stage a single "
            "file, or set data.path to a directory.")
    plan = plan_sync(layout.objects, listing.get("manifest"), listing.get("files") or {})
    total = len(layout.objects)
    total_bytes = sum(o.size for o in layout.objects.values())
    log.info("stage-in %s -> %s: %d object(s), %s; %d to download, %d unchanged, %d to delete",
             uri, where, total, megabytes(total_bytes), len(plan.download), len(plan.unchanged), len(plan.delete))
    if plan.untracked:
        log.warning("%d file(s) in %s are not from %s and were left in place (prep reads them if they match "
                    "data.format): %s", len(plan.untracked), where, uri, ", ".join(plan.untracked[:5]))

    if plan.delete:
        removed = helper.run_program("delete_files", {"root": root, "delete": plan.delete})["removed"]
        log.info("removed %d file(s) whose objects were deleted from the bucket: %s", removed,
                 ", ".join(plan.delete[:5]) + (" ..." if len(plan.delete) > 5 else ""))

    staged, staged_bytes = len(plan.unchanged), sum(o.size for o in plan.unchanged)
    downloaded_bytes = 0
    if plan.download:
        progress = Progress()
        for batch in _transfer(hook, helper, uri, plan.download, root, set(listing.get("dirs") or []), uid, gid,
                               max_workers):
            batch_bytes = sum(o.size for o in batch)
            staged += len(batch)
            staged_bytes += batch_bytes
            downloaded_bytes += batch_bytes
            if progress.due(staged, total):
                log.info("staged %d/%d objects, %s", staged, total, megabytes(staged_bytes))

    manifest = {"schema": MANIFEST_SCHEMA, "source": str(uri),
                "objects": {rel: o.manifest_entry() for rel, o in sorted(layout.objects.items())}}
    old = listing.get("manifest") or {}
    if old.get("objects") != manifest["objects"] or old.get("source") != manifest["source"]:
        manifest["synced_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        helper.put_archive(root, tar_bytes(layout.manifest_name, json.dumps(manifest, indent=1).encode(),
                                           uid=uid, gid=gid))
    if not plan.download and not plan.delete:
        log.info("stage-in: %s is up to date (%d object(s), %s)", where, total, megabytes(total_bytes))
    data_rel = posixpath.join(layout.target_dir, layout.single) if layout.single else layout.target_dir
    return {"source": str(uri), "target": f"{helper.host_path}/{data_rel}".rstrip("/"), "objects": total,
            "bytes": total_bytes, "downloaded": len(plan.download), "bytes_downloaded": downloaded_bytes,
            "unchanged": len(plan.unchanged), "deleted": len(plan.delete), "untracked": len(plan.untracked)}


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _transfer(hook: TfpipeGcsHook, helper: VolumeHelper, uri: GcsUri, objects: list[RemoteObject], root: str,
              existing_dirs: set[str], uid: int, gid: int, max_workers: int) -> Iterator[list[RemoteObject]]:
    """Download ``objects`` batch by batch and hand each batch to the engine; yield each batch once staged.

    Batch k goes into the volume (a tar stream through ``put_archive``) while batch k + 1 downloads,
    so the engine's write hides behind the transfer; at most two batches are on the worker's disk.
    """
    with tempfile.TemporaryDirectory(prefix="tfpipe-stage-in-") as tmp, \
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="tfpipe-put-archive") as engine:
        in_flight: tuple[Future, list[RemoteObject]] | None = None
        offset = 0
        for batch in batches(objects):
            files = _download(hook, uri, batch, tmp, offset, max_workers)
            offset += len(batch)
            entries = list(_tar_entries(batch, files, existing_dirs, uid, gid))
            if in_flight is not None:
                yield _finish(*in_flight)
            in_flight = (engine.submit(_put_batch, helper, root, entries), batch)
        if in_flight is not None:
            yield _finish(*in_flight)


def _finish(put: Future, batch: list[RemoteObject]) -> list[RemoteObject]:
    put.result()  # the engine's error, if any, is raised here
    return batch


def _download(hook: TfpipeGcsHook, uri: GcsUri, batch: list[RemoteObject], tmp: str, offset: int,
              max_workers: int) -> dict[str, str]:
    """Download ``batch`` (the listed generations, CRC32C-checked) with the transfer manager; rel -> path.

    Thread workers: the client, its credentials and the connection pool stay in this process (an
    Airflow task forks no process pool), and they measured faster than process workers here.
    """
    from google.cloud.storage import transfer_manager

    bucket = hook.get_conn().bucket(uri.bucket)
    paths = {obj.rel: os.path.join(tmp, f"object-{offset + i:06d}") for i, obj in enumerate(batch)}
    pairs = [(bucket.blob(obj.name, generation=obj.generation or None), paths[obj.rel]) for obj in batch]
    results = transfer_manager.download_many(pairs, download_kwargs={"checksum": "crc32c"},
                                             worker_type=transfer_manager.THREAD,
                                             max_workers=max(1, min(max_workers, len(batch))))
    for obj, result in zip(batch, results):
        if isinstance(result, BaseException):
            with hook.errors(f"downloading gs://{uri.bucket}/{obj.name}", uri, missing="object"):
                raise result
    return paths


def _tar_entries(batch: list[RemoteObject], files: dict[str, str], existing_dirs: set[str], uid: int,
                 gid: int) -> Iterator[tuple[tarfile.TarInfo, str | None]]:
    """The tar members of ``batch``: parent directories not there yet, then each object's file."""
    for obj in batch:
        for parent in _parents(obj.rel):
            if parent not in existing_dirs:
                info = tarfile.TarInfo(parent)
                info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, 0o755, uid, gid, time.time()
                existing_dirs.add(parent)
                yield info, None
        info = tarfile.TarInfo(obj.rel)
        info.size = os.path.getsize(files[obj.rel])
        info.mode, info.uid, info.gid, info.mtime = 0o644, uid, gid, obj.updated
        yield info, files[obj.rel]


def _put_batch(helper: VolumeHelper, root: str, entries: list[tuple[tarfile.TarInfo, str | None]]) -> None:
    """Stream ``entries`` into ``root`` as one tar (no tar file on disk), then remove the local files."""
    try:
        helper.put_archive(root, _tar_stream(entries))  # type: ignore[arg-type]  # streamed, chunked
    finally:
        for _info, path in entries:
            if path is not None:
                os.remove(path)


def _tar_stream(entries: list[tuple[tarfile.TarInfo, str | None]], chunk: int = 1 << 20) -> Iterator[bytes]:
    """A tar archive of ``entries`` (member, local file or None) as chunks of about ``chunk`` bytes."""
    for info, path in entries:
        yield info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
        if path is None:
            continue
        with open(path, "rb") as handle:
            while block := handle.read(chunk):
                yield block
        if info.size % tarfile.BLOCKSIZE:
            yield tarfile.NUL * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)
    yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)
