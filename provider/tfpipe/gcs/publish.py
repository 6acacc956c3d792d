"""Publishing an exported version to ``gs://bucket/prefix/<model_name>/<version>/``.

Intact objects are skipped, strays of a crashed try deleted, and the ``_COMPLETE`` marker written
last, so readers never see a partial version and a retry completes an interrupted one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tarfile
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from airflow.providers.common.compat.sdk import AirflowFailException

from tfpipe.config import check_name
from tfpipe.exceptions import PublishConflictError
from tfpipe.gcs import Progress, megabytes
from tfpipe.hooks.gcs import GcsUri, TfpipeGcsHook, crc32c_of_bytes, crc32c_of_file, list_objects

LOG = logging.getLogger(__name__)

MARKER_NAME = "_COMPLETE"
MARKER_SCHEMA = 1


@dataclass(frozen=True)
class LocalFile:
    """A file of an exported version on the worker: its path in the version and its CRC32C."""

    rel: str
    path: str
    size: int
    crc32c: str


def local_files(directory: str) -> list[LocalFile]:
    """Every regular file below ``directory``, sorted, with sizes and CRC32Cs."""
    found = []
    for dirpath, dirnames, filenames in os.walk(directory):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if os.path.isfile(path) and not os.path.islink(path):
                found.append(LocalFile(os.path.relpath(path, directory).replace(os.sep, "/"), path,
                                       os.path.getsize(path), crc32c_of_file(path)))
    return found


def version_uri(base: GcsUri, model_name: str, version: int) -> GcsUri:
    """``gs://bucket/prefix/<model_name>/<version>/``."""
    return GcsUri(base.bucket, base.child(model_name, str(version)).prefix + "/")


def publish_version(hook: TfpipeGcsHook, dest: GcsUri, files: list[LocalFile], *, info: Mapping[str, Any] | None = None,
                    max_workers: int = 8, log: logging.Logger = LOG) -> dict[str, Any]:
    """Upload ``files`` to the version folder ``dest``, then its ``_COMPLETE`` marker, idempotently.

    Intact objects are skipped, others replaced, strays deleted, the marker written last. A complete
    version with other files raises :class:`PublishConflictError`.
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

    progress = Progress()
    if todo:
        with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(todo)))) as pool:
            futures = [pool.submit(upload, f) for f in todo]
            try:
                for fut in as_completed(futures):
                    f = fut.result()
                    done_files += 1
                    done_bytes += f.size
                    if progress.due(done_files, len(todo)):
                        log.info("published %d/%d files, %s of %s", done_files, len(todo), megabytes(done_bytes),
                                 megabytes(total_bytes))
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise

    stray = sorted(rel for rel in existing if rel not in expected)
    if stray:
        with hook.errors(f"deleting the stray objects of {dest}", dest, missing="object"):
            bucket.delete_blobs([folder + rel for rel in stray], on_error=lambda blob: None)  # already gone: fine
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
             megabytes(total_bytes), skipped, MARKER_NAME)
    return {"uri": str(dest), "files": len(files), "uploaded": len(todo), "skipped": skipped,
            "bytes_uploaded": total_bytes, "deleted_stray": len(stray), "marker_crc32c": crc32c_of_bytes(body),
            "already_published": False}


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


def extract_version(stream: Iterable[bytes], version: str, tmp: str) -> str:
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
