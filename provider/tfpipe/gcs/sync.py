"""The stage-in sync: ``gs://bucket/prefix`` into the data volume, through the Docker engine.

A helper container lists the target directory, the plan comes from that listing and the last
manifest, and the files of deleted objects go. The downloads then land in a temporary directory and
one tar stream carries them into the volume with the new manifest last, so an interrupted sync never
passes for a complete one.
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
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tfpipe.exceptions import StageInError
from tfpipe.gcs import Progress, megabytes
from tfpipe.gcs.plan import MANIFEST_NAME, MANIFEST_SCHEMA, Layout, RemoteObject, SyncPlan, plan_layout, plan_sync
from tfpipe.hooks.docker import VolumeHelper, tar_bytes
from tfpipe.hooks.gcs import GcsUri, TfpipeGcsHook, list_objects

LOG = logging.getLogger(__name__)

#: Bytes per piece of the tar stream to the engine: few socket writes, bounded memory.
PIECE_BYTES = 4 * 1024 * 1024


def stage_in(hook: TfpipeGcsHook, helper: VolumeHelper, uri: GcsUri, data_path: str, *, user: str = "1000:1000",
             max_workers: int = 8, log: logging.Logger = LOG) -> dict[str, Any]:
    """Sync ``uri`` to ``data_path`` in the volume of ``helper``; return counts for XCom."""
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
    uid, _, gid = user.partition(":")
    uid, gid = int(uid), int(gid or uid)
    where = f"{helper.host_path}/{layout.target_dir}".rstrip("/")
    total_bytes = sum(o.size for o in layout.objects.values())
    # the part of every object name the download directory leaves out: the folder of a folder layout,
    # the single object's own folder (so it lands under its base name)
    prefix = uri.prefix[: uri.prefix.rfind("/") + 1] if layout.single else uri.folder

    survey = _survey(helper, uri, layout, root, where, uid, gid, log)
    fetched = survey.plan.download
    with tempfile.TemporaryDirectory(prefix="tfpipe-stage-in-") as tmp:
        _download(hook, uri, prefix, fetched, tmp, max_workers, log)
        manifest_tar = _new_manifest(uri, layout, survey.listing, uid, gid)
        if fetched:
            files = {o.rel: os.path.join(tmp, o.name[len(prefix):]) for o in fetched}
            helper.put_archive(root, _tar_stream(fetched, files, survey, manifest_tar,  # type: ignore[arg-type]
                                                 len(layout.objects), log))  # streamed, chunked
        elif manifest_tar is not None:
            helper.put_archive(root, manifest_tar)

    plan = survey.plan
    downloaded_bytes = sum(o.size for o in fetched)
    if not fetched and not plan.delete:
        log.info("stage-in: %s is up to date (%d object(s), %s)", where, len(layout.objects), megabytes(total_bytes))
    data_rel = posixpath.join(layout.target_dir, layout.single) if layout.single else layout.target_dir
    return {"source": str(uri), "target": f"{helper.host_path}/{data_rel}".rstrip("/"),
            "objects": len(layout.objects), "bytes": total_bytes, "downloaded": len(fetched),
            "bytes_downloaded": downloaded_bytes, "unchanged": len(plan.unchanged), "deleted": len(plan.delete),
            "untracked": len(plan.untracked)}


# -- the target directory ---------------------------------------------------------------------------

@dataclass
class _Survey:
    """The target directory as the engine's helper listed it, and the sync plan made from it."""

    listing: dict[str, Any]
    plan: SyncPlan
    dirs: set[str]  # directories below the target that exist (or are in the tar already)
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
    plan = plan_sync(layout.objects, listing.get("manifest"), listing.get("files") or {})
    log.info("stage-in %s -> %s: %d object(s), %s; %d to download, %d unchanged, %d to delete",
             uri, where, len(layout.objects), megabytes(sum(o.size for o in layout.objects.values())),
             len(plan.download), len(plan.unchanged), len(plan.delete))
    if plan.untracked:
        log.warning("%d file(s) in %s are not from %s and were left in place (prep reads them if they match "
                    "data.format): %s", len(plan.untracked), where, uri, ", ".join(plan.untracked[:5]))
    if plan.delete:  # before the tar: a new object may take the place of a deleted one
        removed = helper.run_program("delete_files", {"root": root, "delete": plan.delete})["removed"]
        log.info("removed %d file(s) whose objects were deleted from the bucket: %s", removed,
                 ", ".join(plan.delete[:5]) + (" ..." if len(plan.delete) > 5 else ""))
    return _Survey(listing, plan, set(listing.get("dirs") or []), uid, gid)


def _new_manifest(uri: GcsUri, layout: Layout, listing: dict[str, Any], uid: int, gid: int) -> bytes | None:
    """The sync's manifest as a tar archive of that one file, or ``None`` when the target directory's
    (in ``listing``) already says the same."""
    manifest = {"schema": MANIFEST_SCHEMA, "source": str(uri),
                "objects": {rel: {"name": o.name, "generation": o.generation, "crc32c": o.crc32c, "size": o.size}
                            for rel, o in sorted(layout.objects.items())}}
    old = listing.get("manifest") or {}
    if old.get("objects") == manifest["objects"] and old.get("source") == manifest["source"]:
        return None
    manifest["synced_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return tar_bytes(layout.manifest_name, json.dumps(manifest, indent=1).encode(), uid=uid, gid=gid)


# -- downloads ---------------------------------------------------------------------------------------

def _download(hook: TfpipeGcsHook, uri: GcsUri, prefix: str, objects: list[RemoteObject], tmp: str,
              max_workers: int, log: logging.Logger) -> None:
    """Download ``objects`` (CRC32C-checked) to ``tmp/<name less prefix>`` in ``max_workers`` threads;
    raise the first failure as the hook's error. An object replaced since the listing comes down
    newer than the manifest says; the next sync sees its CRC32C differ and downloads it again.
    """
    from google.cloud.storage import transfer_manager

    if not objects:
        return
    started = time.monotonic()
    size = megabytes(sum(o.size for o in objects))
    workers = max(1, min(max_workers, len(objects)))
    log.info("downloading %d object(s), %s, in %d threads", len(objects), size, workers)
    # Threads, not the library's default processes: a Celery task process (daemonic) may not start any.
    results = transfer_manager.download_many_to_path(
        hook.get_conn().bucket(uri.bucket), [o.name[len(prefix):] for o in objects], destination_directory=tmp,
        blob_name_prefix=prefix, download_kwargs={"checksum": "crc32c"}, worker_type=transfer_manager.THREAD,
        max_workers=workers, raise_exception=False)
    for obj, result in zip(objects, results):
        if isinstance(result, BaseException):  # UserWarning too: an object the library would not place
            with hook.errors(f"downloading gs://{uri.bucket}/{obj.name}", uri, missing="object"):
                raise result
    log.info("downloaded %d object(s), %s, in %.1f s", len(objects), size, time.monotonic() - started)


# -- the tar stream ----------------------------------------------------------------------------------

def _tar_stream(objects: list[RemoteObject], files: dict[str, str], survey: _Survey, ending: bytes | None,
                total: int, log: logging.Logger) -> Iterator[bytes]:
    """One tar of ``objects`` (``files``: rel -> the downloaded file), with the parent directories not
    there yet, ended by ``ending`` (the manifest's whole archive, or ``None``), in pieces of about
    :data:`PIECE_BYTES`; each file is removed once it is in the stream."""
    progress = Progress()
    unchanged = len(survey.plan.unchanged)
    unchanged_bytes = sum(o.size for o in survey.plan.unchanged)
    parts: list[bytes] = []
    size = done_bytes = 0
    for done, obj in enumerate(objects, 1):
        members = []
        for parent in _parents(obj.rel):
            if parent not in survey.dirs:
                survey.dirs.add(parent)
                members.append(_dir_info(parent, survey.uid, survey.gid))
        info = tarfile.TarInfo(obj.rel)
        info.size = os.path.getsize(files[obj.rel])  # what came down: the object may have changed since
        info.mode, info.uid, info.gid, info.mtime = 0o644, survey.uid, survey.gid, obj.updated
        for member in [*members, info]:
            parts.append(member.tobuf(tarfile.PAX_FORMAT))
            size += len(parts[-1])
        with open(files[obj.rel], "rb") as handle:
            while block := handle.read(PIECE_BYTES):
                parts.append(block)
                size += len(block)
                if size >= PIECE_BYTES:
                    yield b"".join(parts)
                    parts.clear()
                    size = 0
        os.unlink(files[obj.rel])  # the worker's disk holds each file only until it is in the stream
        if padding := -info.size % tarfile.BLOCKSIZE:
            parts.append(tarfile.NUL * padding)
            size += padding
        done_bytes += info.size
        if progress.due(unchanged + done, total):
            log.info("staged %d/%d objects, %s", unchanged + done, total, megabytes(unchanged_bytes + done_bytes))
    # The manifest's archive is a whole one: its end blocks end this stream too.
    parts.append(ending if ending is not None else tarfile.NUL * (2 * tarfile.BLOCKSIZE))
    yield b"".join(parts)


def _parents(rel: str) -> list[str]:
    parts = rel.split("/")[:-1]
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def _dir_info(name: str, uid: int, gid: int) -> tarfile.TarInfo:
    """The tar member of a directory the sync makes: ``uid:gid``, mode 755."""
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime, info.uid, info.gid = tarfile.DIRTYPE, 0o755, time.time(), uid, gid
    return info
