"""Google Cloud Storage transfers: stage raw data in before prep, publish blessed models after export.

Both operators do the Cloud Storage side **on the worker** (``google-cloud-storage``, credentials
from :class:`~tfpipe.hooks.gcs.TfpipeGcsHook`) and move files into and out of the volumes
**through the Docker engine** (:class:`~tfpipe.volumes.VolumeHelper`: ``put_archive`` /
``get_archive`` on short helper containers of the trainer image), because the engine's host may
not be the worker's. Credentials never enter a container.

- :class:`GcsStageInOperator` syncs ``gs://bucket/prefix`` to ``<data volume>/<data path>``:
  only new or changed objects are downloaded (their generation and CRC32C are kept in a manifest,
  ``.tfpipe-gcs-manifest.json``, next to the files), in parallel, and objects deleted from the
  bucket are removed. Prep fingerprints the content, so an unchanged bucket is a prep cache hit.
- :class:`GcsPublishOperator` uploads an exported version to
  ``gs://bucket/prefix/<model_name>/<version>/`` and writes the ``_COMPLETE`` marker (file list
  and CRC32Cs) last. Re-running it skips the objects already uploaded intact, so a retry after an
  interruption completes the version without duplicates; :func:`list_published_versions` lists
  only versions with the marker.

A run's Params ``data_uri`` / ``publish_uri`` choose the URIs (falling back to the operator's
``source_uri`` / ``destination_uri``); with neither, the task skips itself.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from airflow.providers.common.compat.sdk import AirflowFailException, AirflowSkipException, BaseOperator

from tfpipe import contract
from tfpipe.settings import resolve_image
from tfpipe.config import check_host_path, check_image_ref, check_name, check_relative_path
from tfpipe.engine import DEFAULT_DOCKER_URL, EngineSettings, diagnose, engine_error_message
from tfpipe.exceptions import DockerEngineRefusedError, DockerEngineUnreachableError, TfpipeConfigError
from tfpipe.hooks.gcs import (
    GcsAccessError,
    GcsTransferError,
    GcsUri,
    TfpipeGcsHook,
    crc32c_of_bytes,
    crc32c_of_file,
    list_objects,
)
from tfpipe.specs import container_labels
from tfpipe.volumes import VolumeHelper, remove_leftovers, tar_bytes

LOG = logging.getLogger(__name__)

MANIFEST_NAME = ".tfpipe-gcs-manifest.json"
MARKER_NAME = "_COMPLETE"
MANIFEST_SCHEMA = 1
MARKER_SCHEMA = 1
#: Objects are downloaded and handed to the engine in batches of at most this many bytes/objects.
BATCH_BYTES = 64 * 1024 * 1024
BATCH_OBJECTS = 200
DATA_MOUNT = "/vol"
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")


class StageInError(AirflowFailException):
    """The bucket's content cannot be laid out under the data path (retrying cannot fix it)."""


class PublishConflictError(AirflowFailException):
    """The version is already published with other content (published versions are immutable)."""


class _Progress:
    """Says when a progress line is due: the last item, every tenth of the total, or every 10 seconds."""

    def __init__(self, every_seconds: float = 10.0) -> None:
        self.every = every_seconds
        self.last = time.monotonic()
        self.last_done = 0

    def due(self, done: int, total: int) -> bool:
        """Whether to log ``done`` of ``total`` now."""
        now = time.monotonic()
        tenth = max(1, total // 10)
        if done >= total or done // tenth > self.last_done // tenth or now - self.last >= self.every:
            self.last, self.last_done = now, done
            return True
        return False


def _mb(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:.1f} MB"


def _uid_gid(user: str) -> tuple[int, int]:
    uid, _, gid = user.partition(":")
    return int(uid), int(gid or uid)


def _resolve_uri(context: Mapping[str, Any], param: str | None, default: str | None, task_id: str,
                 what: str) -> GcsUri | None:
    """The URI of this run: the run's Param ``param`` if set, else ``default``; None = nothing to do."""
    params = context.get("params") or {}
    value = params.get(param) if param else None
    source = f"run parameter {param!r}"
    if value in (None, ""):
        value, source = default, f"the task's {what}"
    if value in (None, "", "None"):
        return None
    try:
        return GcsUri.parse(value, field_name=source)
    except TfpipeConfigError as err:
        raise AirflowFailException(f"{task_id}: {err}") from None


def _docker_cli(docker_url: str) -> Any:
    from airflow.providers.docker.hooks.docker import DockerHook

    try:
        engine = EngineSettings.from_airflow_config()
    except TfpipeConfigError as err:
        raise AirflowFailException(str(err)) from err
    tls = None
    if docker_url == DEFAULT_DOCKER_URL:  # the deployment's engine, as the stage operators use
        docker_url, tls = engine.docker_url, engine.tls_config()
    try:
        cli = DockerHook(docker_conn_id=None, base_url=docker_url, version="auto", tls=tls).api_client
        cli.ping()
    except Exception as err:  # docker-py and the hook raise several types; all mean "not reachable"
        message, retryable = engine_error_message(docker_url, diagnose(docker_url, tls) or err)
        raise (DockerEngineUnreachableError if retryable else DockerEngineRefusedError)(message) from err
    return cli


def _task_labels(context: Mapping[str, Any], stage: str) -> dict[str, str]:
    ti = context["ti"]
    map_index = getattr(ti, "map_index", -1)
    return container_labels(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, try_number=ti.try_number,
                            stage=stage, map_index=-1 if map_index is None else map_index)


# ================================================================================================
# Stage-in: planning (pure)
# ================================================================================================

@dataclass(frozen=True)
class RemoteObject:
    """One object of the source, and where it goes (``rel``, relative to the target directory)."""

    name: str
    rel: str
    generation: int
    crc32c: str | None
    size: int
    updated: float = 0.0

    def manifest_entry(self) -> dict[str, Any]:
        """The manifest record of this object."""
        return {"name": self.name, "generation": self.generation, "crc32c": self.crc32c, "size": self.size}


@dataclass(frozen=True)
class Layout:
    """Where a source goes: ``target_dir`` (relative to the data volume) and each object's ``rel``.

    ``single`` is set when the URI names one object that becomes the file ``data.path``; the
    manifest is then ``.<file>.tfpipe-gcs-manifest.json`` beside it, so two files in one folder
    keep two manifests.
    """

    target_dir: str
    objects: dict[str, RemoteObject]
    single: str | None = None
    ignored: tuple[str, ...] = ()

    @property
    def manifest_name(self) -> str:
        """The manifest's file name in ``target_dir``."""
        return f".{self.single}{MANIFEST_NAME}" if self.single else MANIFEST_NAME


def check_object_path(name: str, rel: str) -> None:
    """Raise :class:`StageInError` unless ``rel`` is a safe relative file path for object ``name``."""
    parts = rel.split("/")
    if (not rel or rel.startswith("/") or _UNSAFE.search(rel) or any(p in ("", ".", "..") for p in parts)
            or parts[-1].endswith(MANIFEST_NAME)):
        raise StageInError(
            f"object {name!r} cannot be staged: its path {rel!r} below the prefix has an empty, '.' or '..' "
            "segment, a backslash or control character, or the manifest's name. Fix: rename the object in "
            "the bucket (or narrow the URI's prefix so it is not included).")


def plan_layout(uri: GcsUri, blobs: Iterable[Any], data_path: str) -> Layout:
    """Decide where the listed objects go under the data volume.

    - ``uri`` names one object exactly (``gs://b/raw/digits.csv``): it becomes the file
      ``data_path`` (or ``data_path/<its name>`` when ``data_path`` ends with ``/``);
    - otherwise ``uri`` is a folder: every object below ``<prefix>/`` is laid out below
      ``data_path`` by its name relative to the prefix. Folder placeholders (names ending in
      ``/``) are skipped.
    """
    blobs = list(blobs)
    path = data_path.strip()
    norm = posixpath.normpath(path)
    norm = "" if norm == "." else norm
    by_name = {b.name: b for b in blobs}

    def remote(blob: Any, rel: str) -> RemoteObject:
        updated = blob.updated.timestamp() if getattr(blob, "updated", None) else time.time()
        return RemoteObject(name=blob.name, rel=rel, generation=int(blob.generation or 0),
                            crc32c=blob.crc32c, size=int(blob.size or 0), updated=updated)

    if uri.prefix and not uri.prefix.endswith("/") and uri.prefix in by_name:
        blob = by_name[uri.prefix]
        ignored = tuple(n for n in by_name if n != uri.prefix)
        if path.endswith("/") or not norm:
            rel = posixpath.basename(uri.prefix)
            check_object_path(blob.name, rel)
            return Layout(norm, {rel: remote(blob, rel)}, single=rel, ignored=ignored)
        target_dir, rel = posixpath.split(norm)
        return Layout(target_dir, {rel: remote(blob, rel)}, single=rel, ignored=ignored)

    folder = uri.folder
    objects: dict[str, RemoteObject] = {}
    ignored = []
    for blob in blobs:
        if not blob.name.startswith(folder):  # 'raw/digits' also lists 'raw/digits-old/...'
            ignored.append(blob.name)
            continue
        rel = blob.name[len(folder):]
        if not rel or rel.endswith("/"):
            continue  # folder placeholder objects
        check_object_path(blob.name, rel)
        objects[rel] = remote(blob, rel)
    return Layout(norm, objects, ignored=tuple(ignored))


@dataclass
class SyncPlan:
    """What a sync does: download, delete, and what it leaves alone."""

    download: list[RemoteObject] = field(default_factory=list)
    unchanged: list[RemoteObject] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)


def plan_sync(objects: Mapping[str, RemoteObject], manifest: Mapping[str, Any] | None,
              local: Mapping[str, int]) -> SyncPlan:
    """Compare the source with the manifest of the last sync and the files present.

    An object is unchanged when the manifest has it with the same CRC32C (or, without one, the
    same generation) and size, and the file is there with that size. Files the manifest lists
    but the bucket no longer has are deleted; files it never listed are left alone (``untracked``).
    """
    entries = (manifest or {}).get("objects") or {}
    plan = SyncPlan()
    for rel in sorted(objects):
        obj, entry = objects[rel], entries.get(rel) or {}
        same_content = (obj.crc32c and entry.get("crc32c") == obj.crc32c) or (
            not obj.crc32c and entry.get("generation") == obj.generation)
        if same_content and entry.get("size") == obj.size and local.get(rel) == obj.size:
            plan.unchanged.append(obj)
        else:
            plan.download.append(obj)
    plan.delete = sorted(rel for rel in entries if rel not in objects and rel in local)
    plan.untracked = sorted(rel for rel in local if rel not in objects and rel not in entries)
    return plan


def batches(objects: list[RemoteObject], max_bytes: int = BATCH_BYTES,
            max_objects: int = BATCH_OBJECTS) -> list[list[RemoteObject]]:
    """Split ``objects`` into batches of at most ``max_bytes`` (one bigger object alone) and ``max_objects``."""
    out: list[list[RemoteObject]] = []
    current: list[RemoteObject] = []
    size = 0
    for obj in objects:
        if current and (size + obj.size > max_bytes or len(current) >= max_objects):
            out.append(current)
            current, size = [], 0
        current.append(obj)
        size += obj.size
    if current:
        out.append(current)
    return out


# ================================================================================================
# Stage-in: the helper scripts (run in the trainer image, Python 3.8, standard library only)
# ================================================================================================

#: List the target: make it (and missing parents, owned by the stage user), report its files,
#: sub-directories and the manifest of the last sync. ``only`` restricts the listing to names.
_LIST_SCRIPT = r"""
root, uid, gid = payload["root"], payload["uid"], payload["gid"]
if os.path.lexists(root) and not os.path.isdir(root):
    finish({"error": "not_a_directory"})
    sys.exit(0)
missing, p = [], root
while not os.path.lexists(p):
    missing.append(p)
    p = os.path.dirname(p)
os.makedirs(root, exist_ok=True)
for d in missing:
    os.chown(d, uid, gid)
files, dirs = {}, []
def record(full, rel):
    if os.path.isfile(full) and not os.path.islink(full) and not rel.split("/")[-1].endswith(payload["marker"]):
        files[rel] = os.path.getsize(full)
if payload["only"] is None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            dirs.append(os.path.relpath(os.path.join(dirpath, name), root))
        for name in filenames:
            full = os.path.join(dirpath, name)
            record(full, os.path.relpath(full, root))
else:
    for rel in payload["only"]:
        record(os.path.join(root, rel), rel)
manifest = None
try:
    with open(os.path.join(root, payload["manifest"])) as handle:
        manifest = json.load(handle)
except (OSError, ValueError):
    manifest = None
finish({"files": files, "dirs": dirs, "manifest": manifest})
"""

#: Remove files (objects deleted from the bucket) and the directories they leave empty.
_DELETE_SCRIPT = r"""
root = payload["root"].rstrip("/")
removed = 0
for rel in payload["delete"]:
    full = os.path.normpath(os.path.join(root, rel))
    if not full.startswith(root + "/"):
        continue
    if os.path.isfile(full) or os.path.islink(full):
        os.remove(full)
        removed += 1
    d = os.path.dirname(full)
    while d != root and d.startswith(root + "/"):
        try:
            os.rmdir(d)
        except OSError:
            break
        d = os.path.dirname(d)
finish({"removed": removed})
"""


# ================================================================================================
# Stage-in: the sync
# ================================================================================================

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
    listing = helper.run_python(_LIST_SCRIPT, {
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
             uri, where, total, _mb(total_bytes), len(plan.download), len(plan.unchanged), len(plan.delete))
    if plan.untracked:
        log.warning("%d file(s) in %s are not from %s and were left in place (prep reads them if they match "
                    "data.format): %s", len(plan.untracked), where, uri, ", ".join(plan.untracked[:5]))

    if plan.delete:
        removed = helper.run_python(_DELETE_SCRIPT, {"root": root, "delete": plan.delete})["removed"]
        log.info("removed %d file(s) whose objects were deleted from the bucket: %s", removed,
                 ", ".join(plan.delete[:5]) + (" ..." if len(plan.delete) > 5 else ""))

    existing_dirs = set(listing.get("dirs") or [])
    staged, staged_bytes = len(plan.unchanged), sum(o.size for o in plan.unchanged)
    downloaded_bytes = 0
    if plan.download:
        client = hook.get_conn()
        bucket = client.bucket(uri.bucket)
        progress = _Progress()
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
                    log.info("staged %d/%d objects, %s", staged, total, _mb(staged_bytes))

    manifest = {"schema": MANIFEST_SCHEMA, "source": str(uri),
                "objects": {rel: o.manifest_entry() for rel, o in sorted(layout.objects.items())}}
    old = listing.get("manifest") or {}
    if old.get("objects") != manifest["objects"] or old.get("source") != manifest["source"]:
        manifest["synced_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        helper.put_archive(root, tar_bytes(layout.manifest_name, json.dumps(manifest, indent=1).encode(),
                                           uid=uid, gid=gid))
    if not plan.download and not plan.delete:
        log.info("stage-in: %s is up to date (%d object(s), %s)", where, total, _mb(total_bytes))
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


# ================================================================================================
# Publish
# ================================================================================================

@dataclass(frozen=True)
class LocalFile:
    """A file of an exported version on the worker: its path in the version and its CRC32C."""

    rel: str
    path: str
    size: int
    crc32c: str

    @classmethod
    def of(cls, rel: str, path: str) -> LocalFile:
        """Describe the file at ``path`` (computes its CRC32C)."""
        return cls(rel=rel, path=path, size=os.path.getsize(path), crc32c=crc32c_of_file(path))


def local_files(directory: str) -> list[LocalFile]:
    """Every regular file below ``directory``, sorted, with sizes and CRC32Cs."""
    found = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(LocalFile.of(os.path.relpath(path, directory).replace(os.sep, "/"), path))
    return found


def version_uri(base: GcsUri, model_name: str, version: int) -> GcsUri:
    """``gs://bucket/prefix/<model_name>/<version>/``."""
    return GcsUri(base.bucket, base.child(model_name, str(version)).prefix + "/")


def publish_version(hook: TfpipeGcsHook, dest: GcsUri, files: list[LocalFile], *, info: Mapping[str, Any] | None = None,
                    max_workers: int = 8, on_uploaded: Callable[[LocalFile, int, int], None] | None = None,
                    log: logging.Logger = LOG) -> dict[str, Any]:
    """Upload ``files`` to the version folder ``dest``, then its ``_COMPLETE`` marker, idempotently.

    Objects already there with the same CRC32C and size are skipped, objects that differ are
    replaced, objects that do not belong to the version are deleted, and the marker (file list
    with CRC32Cs, plus ``info``) is written last, only when every file is in place. A complete
    version with the same files is left alone; one with other files raises
    :class:`PublishConflictError`. ``on_uploaded(file, done, total)`` is called after each upload.
    """
    if any(f.rel == MARKER_NAME for f in files):
        raise PublishConflictError(f"the export contains a file named {MARKER_NAME}, the completion marker's name. "
                                   "Fix: rename it in the export.")
    if not files:
        raise PublishConflictError(f"nothing to publish to {dest}: the exported version has no files.")
    folder = dest.folder
    existing = {b.name[len(folder):]: b for b in list_objects(hook, dest, prefix=folder,
                                                               action="listing the published version")}
    expected = {f.rel: f.crc32c for f in files}
    bucket = hook.get_conn().bucket(dest.bucket)
    marker_blob = existing.pop(MARKER_NAME, None)
    if marker_blob is not None:
        return _already_published(hook, bucket, dest, marker_blob, expected, files, log)

    todo = [f for f in files if not (f.rel in existing and existing[f.rel].crc32c == f.crc32c
                                     and existing[f.rel].size is not None and int(existing[f.rel].size) == f.size)]
    skipped = len(files) - len(todo)
    if skipped:
        log.info("publish %s: %d of %d file(s) are already uploaded intact (an earlier try); uploading %d",
                 dest, skipped, len(files), len(todo))
    total_bytes = sum(f.size for f in todo)
    done_files, done_bytes = 0, 0

    def upload(f: LocalFile) -> LocalFile:
        from google.cloud.storage.retry import DEFAULT_RETRY

        blob = bucket.blob(folder + f.rel)
        with hook.errors(f"uploading {f.rel} to {dest}", dest):
            blob.upload_from_filename(f.path, checksum="crc32c", retry=DEFAULT_RETRY)
        return f

    progress = _Progress()
    if todo:
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(todo)))) as pool:
            futures = [pool.submit(upload, f) for f in todo]
            try:
                for fut in _as_completed(futures):
                    f = fut.result()
                    done_files += 1
                    done_bytes += f.size
                    if progress.due(done_files, len(todo)):
                        log.info("published %d/%d files, %s of %s", done_files, len(todo), _mb(done_bytes),
                                 _mb(total_bytes))
                    if on_uploaded is not None:
                        on_uploaded(f, done_files, len(todo))
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise

    stray = sorted(rel for rel in existing if rel not in expected)
    for rel in stray:
        with hook.errors(f"deleting the stray object {rel} of {dest}", dest, missing="object"):
            try:
                bucket.blob(folder + rel).delete()
            except Exception as err:  # already gone: fine
                if getattr(err, "code", None) != 404:
                    raise
    if stray:
        log.warning("publish %s: deleted %d object(s) that are not part of this version: %s", dest, len(stray),
                    ", ".join(stray[:5]))

    marker = {
        "schema": MARKER_SCHEMA,
        **dict(info or {}),
        "files": [{"name": f.rel, "size": f.size, "crc32c": f.crc32c} for f in sorted(files, key=lambda f: f.rel)],
        "published_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    body = json.dumps(marker, indent=1, sort_keys=True).encode()
    from google.api_core.exceptions import PreconditionFailed

    with hook.errors(f"writing {MARKER_NAME} of {dest}", dest):
        try:  # if_generation_match=0: never replace a marker another publisher wrote meanwhile
            bucket.blob(folder + MARKER_NAME).upload_from_string(
                body, content_type="application/json", checksum="crc32c", if_generation_match=0)
        except PreconditionFailed:  # another try or publisher finished first: same content is fine
            return _already_published(hook, bucket, dest, bucket.blob(folder + MARKER_NAME), expected, files, log)
    log.info("published %s: %d file(s), %s uploaded, %d already there; %s written", dest, len(files),
             _mb(total_bytes), skipped, MARKER_NAME)
    return {"uri": str(dest), "files": len(files), "uploaded": len(todo), "skipped": skipped,
            "bytes_uploaded": total_bytes, "deleted_stray": len(stray), "marker_crc32c": crc32c_of_bytes(body),
            "already_published": False}


def _as_completed(futures: list[Any]) -> Iterable[Any]:
    from concurrent.futures import as_completed

    return as_completed(futures)


def _already_published(hook: TfpipeGcsHook, bucket: Any, dest: GcsUri, marker_blob: Any, expected: Mapping[str, str],
                       files: list[LocalFile], log: logging.Logger) -> dict[str, Any]:
    with hook.errors(f"reading {MARKER_NAME} of {dest}", dest, missing="object"):
        raw = marker_blob.download_as_bytes()
    try:
        published = {e["name"]: e["crc32c"] for e in json.loads(raw).get("files", [])}
    except (ValueError, KeyError, TypeError, AttributeError):
        published = None
    if published != expected:
        raise PublishConflictError(
            f"{dest} is already published (it has a {MARKER_NAME} marker) with other content than this export. "
            "Published versions are immutable. Fix: publish to another prefix, or delete the old version "
            f"(`gcloud storage rm -r {dest}`) if it is really to be replaced.")
    log.info("publish %s: already published with the same %d file(s); nothing to do", dest, len(files))
    return {"uri": str(dest), "files": len(files), "uploaded": 0, "skipped": len(files), "bytes_uploaded": 0,
            "deleted_stray": 0, "already_published": True}


def list_published_versions(uri: str | GcsUri, model_name: str, *, gcp_conn_id: str = "google_cloud_default",
                            hook: TfpipeGcsHook | None = None) -> list[int]:
    """The versions of ``model_name`` published under ``uri``, ascending; only complete ones.

    A version counts once its ``_COMPLETE`` marker exists: an interrupted publish is invisible.

    :param uri: the publish URI, ``gs://bucket/prefix`` (models are under ``<prefix>/<model_name>/``).
    :param model_name: the exported model's name.
    :param gcp_conn_id: the Airflow connection with the credentials (ignored when ``hook`` is given).
    :param hook: an existing :class:`~tfpipe.hooks.gcs.TfpipeGcsHook`.
    """
    base = uri if isinstance(uri, GcsUri) else GcsUri.parse(uri, field_name="uri")
    check_name("model_name", model_name)
    hook = hook or TfpipeGcsHook(gcp_conn_id)
    folder = base.child(model_name).prefix + "/"
    blobs = list_objects(hook, base, prefix=folder, match_glob=f"{folder}*/{MARKER_NAME}",
                         action="listing published versions under")
    versions = set()
    for blob in blobs:
        version, _, rest = blob.name[len(folder):].partition("/")
        if rest == MARKER_NAME and version.isdigit():
            versions.add(int(version))
    return sorted(versions)


def _extract_version(stream: Iterable[bytes], version: str, tmp: str) -> str:
    """Write the tar ``stream`` of ``<version>/`` to ``tmp`` and extract its regular files safely."""
    tar_path = os.path.join(tmp, "export.tar")
    with open(tar_path, "wb") as handle:
        for chunk in stream:
            handle.write(chunk)
    out = os.path.join(tmp, "version")
    os.makedirs(out)
    with tarfile.open(tar_path, "r:") as tar:
        for member in tar:
            name = member.name.lstrip("./")
            top, _, rel = name.partition("/")
            if top != version or not rel or not member.isfile():
                continue
            if rel.startswith("/") or ".." in rel.split("/"):
                raise AirflowFailException(f"the exported version holds a file with an unsafe path: {member.name!r}")
            target = os.path.join(out, *rel.split("/"))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            source = tar.extractfile(member)
            with open(target, "wb") as dst:
                shutil.copyfileobj(source, dst, 1 << 20)  # type: ignore[arg-type]
    os.remove(tar_path)
    return out


# ================================================================================================
# Operators
# ================================================================================================

class GcsStageInOperator(BaseOperator):
    """Sync ``gs://bucket/prefix`` into ``<data_volume>/<data_path>`` on the Docker engine's host.

    Runs before prep. Objects are listed and downloaded **on the worker** (only new or changed ones:
    a manifest of generations and CRC32Cs stays next to the files), in parallel, and handed to the
    engine as tar streams (``put_archive``) through a helper container of ``image`` that mounts the
    data volume; files of objects deleted from the bucket are removed. When neither the run's
    Param ``uri_param`` nor ``source_uri`` is set, the task skips itself.

    :param data_volume: the data volume: a directory on the Docker engine's host.
    :param data_path: the file or directory relative to ``data_volume`` (``data.path``). A URI that
        names one object becomes this file; a folder URI is laid out below this directory.
    :param image: the trainer image (the helper containers run it; it is not pulled here).
    :param source_uri: ``gs://bucket/prefix`` used when the run does not set the Param (templated).
    :param uri_param: name of the run Param that chooses the URI (``"data_uri"``); ``None`` ignores Params.
    :param gcp_conn_id: Airflow connection with the Google credentials (missing: Application Default
        Credentials; anonymous with ``STORAGE_EMULATOR_HOST``).
    :param docker_url: the Docker engine, local or remote.
    :param user: ``uid:gid`` that owns the staged files and directories.
    :param max_workers: parallel downloads.
    :param allow_floating_tag: accept an unpinned ``image``.
    :param kwargs: passed to ``BaseOperator`` (``task_id``, ``retries``, ...).
    """

    template_fields = ("source_uri",)
    ui_color = "#d6eaff"

    def __init__(self, *, data_volume: str, data_path: str, image: str | None, source_uri: str | None = None,
                 uri_param: str | None = "data_uri", gcp_conn_id: str = "google_cloud_default",
                 docker_url: str = "unix://var/run/docker.sock", user: str = "1000:1000", max_workers: int = 8,
                 allow_floating_tag: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if image is not None:  # None: the Airflow Variable tfpipe_image, read in execute()
            check_image_ref("image", image, allow_floating_tag=allow_floating_tag)
        self.allow_floating_tag = allow_floating_tag
        check_relative_path("data_path", data_path)
        _check_common(source_uri, "source_uri", max_workers)
        if not isinstance(user, str) or not re.fullmatch(r"\d+(:\d+)?", user):
            raise TfpipeConfigError(f"user: must be 'uid:gid' in numbers, got {user!r}. Fix: e.g. '1000:1000'.")
        self.data_volume = check_host_path("data_volume", data_volume)
        self.data_path = data_path
        self.image = image
        self.source_uri = source_uri
        self.uri_param = uri_param
        self.gcp_conn_id = gcp_conn_id
        self.docker_url = docker_url
        self.user = user
        self.max_workers = max_workers

    def execute(self, context: Any) -> dict[str, Any]:
        uri = _resolve_uri(context, self.uri_param, self.source_uri, self.task_id, "source_uri")
        if uri is None:
            raise AirflowSkipException(f"no data URI: neither the run parameter {self.uri_param!r} nor "
                                       "source_uri is set; prep reads the data volume as it is")
        hook = TfpipeGcsHook(self.gcp_conn_id)
        hook.get_conn()  # credentials first: a bad key fails before any container starts
        cli = _docker_cli(self.docker_url)
        labels = _task_labels(context, "stage_in")
        remove_leftovers(cli, labels, "gcs-stage-in", self.log)
        image = resolve_image(self.image, task=self.task_id, allow_floating_tag=self.allow_floating_tag)
        with VolumeHelper(cli, image=image, host_path=self.data_volume, mount_point=DATA_MOUNT, labels=labels,
                          role="gcs-stage-in", log=self.log) as helper:
            return stage_in(hook, helper, uri, self.data_path, user=self.user, max_workers=self.max_workers,
                            log=self.log)


class GcsPublishOperator(BaseOperator):
    """Publish an exported model version to ``gs://bucket/prefix/<model_name>/<version>/``.

    Runs after export. The version is read out of the models volume **through the Docker engine**
    (``get_archive`` on a helper container of ``image`` that mounts the volume read-only) and
    uploaded from the worker, in parallel; objects already uploaded intact by an earlier try are
    skipped, and the ``_COMPLETE`` marker (file list with CRC32Cs) is written last, so a retry
    after an interruption completes the version and readers never see a partial one. When
    neither the run's Param ``uri_param`` nor ``destination_uri`` is set, the task skips itself.

    :param models_volume: the models volume: a directory on the Docker engine's host.
    :param model_name: the exported model's name (``export.model_name``).
    :param image: the trainer image (the helper container runs it).
    :param destination_uri: ``gs://bucket/prefix`` used when the run does not set the Param (templated).
    :param uri_param: name of the run Param that chooses the URI (``"publish_uri"``); ``None`` ignores Params.
    :param export_task_id: the export task whose result (XCom) names the version.
    :param version: publish this version instead of the export task's (templated).
    :param gcp_conn_id: Airflow connection with the Google credentials.
    :param docker_url: the Docker engine, local or remote.
    :param max_workers: parallel uploads.
    :param allow_floating_tag: accept an unpinned ``image``.
    :param kwargs: passed to ``BaseOperator``.
    """

    template_fields = ("destination_uri", "version")
    ui_color = "#d6eaff"

    def __init__(self, *, models_volume: str, model_name: str, image: str | None, destination_uri: str | None = None,
                 uri_param: str | None = "publish_uri", export_task_id: str = "export",
                 version: int | str | None = None, gcp_conn_id: str = "google_cloud_default",
                 docker_url: str = "unix://var/run/docker.sock", max_workers: int = 8,
                 allow_floating_tag: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if image is not None:  # None: the Airflow Variable tfpipe_image, read in execute()
            check_image_ref("image", image, allow_floating_tag=allow_floating_tag)
        self.allow_floating_tag = allow_floating_tag
        check_name("model_name", model_name)
        _check_common(destination_uri, "destination_uri", max_workers)
        self.models_volume = check_host_path("models_volume", models_volume)
        self.model_name = model_name
        self.image = image
        self.destination_uri = destination_uri
        self.uri_param = uri_param
        self.export_task_id = export_task_id
        self.version = version
        self.gcp_conn_id = gcp_conn_id
        self.docker_url = docker_url
        self.max_workers = max_workers

    def _version(self, context: Any) -> int:
        value: Any = self.version
        if value in (None, "", "None"):
            result = context["ti"].xcom_pull(task_ids=self.export_task_id)
            if not result or result.get("version") is None:
                raise AirflowSkipException(f"{self.export_task_id} exported no version: nothing to publish")
            if result.get("model_name") not in (None, self.model_name):
                raise AirflowFailException(f"{self.export_task_id} exported model {result['model_name']!r}, but this "
                                           f"task publishes {self.model_name!r}. Fix: give both the same model_name.")
            value = result["version"]
        if not str(value).isdigit() or int(value) < 1:
            raise AirflowFailException(f"version must be a whole number >= 1, got {value!r}")
        return int(value)

    def execute(self, context: Any) -> dict[str, Any]:
        base = _resolve_uri(context, self.uri_param, self.destination_uri, self.task_id, "destination_uri")
        if base is None:
            raise AirflowSkipException(f"no publish URI: neither the run parameter {self.uri_param!r} nor "
                                       "destination_uri is set; the model stays in the models volume only")
        version = self._version(context)
        dest = version_uri(base, self.model_name, version)
        hook = TfpipeGcsHook(self.gcp_conn_id)
        hook.get_conn()
        list_objects(hook, dest, prefix=dest.folder, action="checking")  # a missing bucket fails here
        cli = _docker_cli(self.docker_url)
        labels = _task_labels(context, "publish")
        remove_leftovers(cli, labels, "gcs-publish", self.log)
        container_dir = f"{contract.CONTAINER_MODELS}/{self.model_name}/{version}"
        with tempfile.TemporaryDirectory(prefix="tfpipe-publish-") as tmp:
            image = resolve_image(self.image, task=self.task_id, allow_floating_tag=self.allow_floating_tag)
            with VolumeHelper(cli, image=image, host_path=self.models_volume,
                              mount_point=contract.CONTAINER_MODELS, read_only=True, labels=labels,
                              role="gcs-publish", log=self.log) as helper:
                stream = helper.get_archive(container_dir)
                if stream is None:
                    raise AirflowFailException(
                        f"version {version} of {self.model_name!r} is not in the models volume "
                        f"({self.models_volume}/{self.model_name}/{version} on the engine's host). Fix: run "
                        "export first, or check models_volume and model_name.")
                directory = _extract_version(stream, str(version), tmp)
            files = local_files(directory)
            self.log.info("publishing %s version %d (%d file(s), %s) to %s", self.model_name, version, len(files),
                          _mb(sum(f.size for f in files)), dest)
            ti = context["ti"]
            info = {"model_name": self.model_name, "version": version, "dag_id": ti.dag_id, "run_id": ti.run_id}
            result = publish_version(hook, dest, files, info=info, max_workers=self.max_workers, log=self.log)
        return {**result, "model_name": self.model_name, "version": version}


def _check_common(uri: str | None, field_name: str, max_workers: int) -> None:
    """Argument checks shared by both operators (form only: no I/O at construction)."""
    if uri is not None and "{{" not in str(uri):
        GcsUri.parse(uri, field_name=field_name)
    if not isinstance(max_workers, int) or isinstance(max_workers, bool) or not 1 <= max_workers <= 64:
        raise TfpipeConfigError(f"max_workers: must be a whole number in 1..64, got {max_workers!r}. Fix: e.g. 8.")



__all__ = [
    "GcsPublishOperator",
    "GcsStageInOperator",
    "GcsAccessError",
    "GcsTransferError",
    "MANIFEST_NAME",
    "MARKER_NAME",
    "PublishConflictError",
    "StageInError",
    "list_published_versions",
    "plan_layout",
    "plan_sync",
    "publish_version",
    "stage_in",
]
