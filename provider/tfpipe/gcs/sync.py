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
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
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

    existing_dirs = set(listing.get("dirs") or [])
    staged, staged_bytes = len(plan.unchanged), sum(o.size for o in plan.unchanged)
    downloaded_bytes = 0
    if plan.download:
        client = hook.get_conn()
        bucket = client.bucket(uri.bucket)
        progress = Progress()
        with tempfile.TemporaryDirectory(prefix="tfpipe-stage-in-") as tmp:
            for batch in batches(plan.download):
                files = _download(hook, bucket, uri, batch, tmp, max_workers)
                tar_path = os.path.join(tmp, "batch.tar")
                with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
                    for obj in batch:
                        for parent in _parents(obj.rel):
                            if parent not in existing_dirs:
                                info = tarfile.TarInfo(parent)
                                info.type, info.mode, info.uid, info.gid, info.mtime = (
                                    tarfile.DIRTYPE, 0o755, uid, gid, time.time())
                                tar.addfile(info)
                                existing_dirs.add(parent)
                        info = tar.gettarinfo(files[obj.rel], arcname=obj.rel)
                        info.mode, info.uid, info.gid, info.uname, info.gname = 0o644, uid, gid, "", ""
                        info.mtime = obj.updated
                        with open(files[obj.rel], "rb") as handle:
                            tar.addfile(info, handle)
                        os.remove(files[obj.rel])
                with open(tar_path, "rb") as handle:
                    helper.put_archive(root, handle)
                os.remove(tar_path)
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


def _download(hook: TfpipeGcsHook, bucket: Any, uri: GcsUri, batch: list[RemoteObject], tmp: str,
              max_workers: int) -> dict[str, str]:
    """Download ``batch`` (the listed generations, CRC32C-checked) in parallel; return rel -> local path."""

    def one(index: int, obj: RemoteObject) -> tuple[str, str]:
        path = os.path.join(tmp, f"object-{index:06d}")
        blob = bucket.blob(obj.name, generation=obj.generation or None)
        with hook.errors(f"downloading gs://{uri.bucket}/{obj.name}", uri, missing="object"):
            blob.download_to_filename(path, checksum="crc32c")
        return obj.rel, path

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(batch)))) as pool:
        futures = [pool.submit(one, i, obj) for i, obj in enumerate(batch)]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for fut in pending:
            fut.cancel()
        for fut in done:
            if fut.exception() is not None:
                raise fut.exception()  # type: ignore[misc]
        return dict(fut.result() for fut in futures)
