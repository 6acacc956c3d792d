"""Stage-in planning (pure): where a bucket's objects go under the data volume, and what a sync does."""

from __future__ import annotations

import posixpath
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tfpipe.exceptions import StageInError
from tfpipe.hooks.gcs import GcsUri

MANIFEST_NAME = ".tfpipe-gcs-manifest.json"
MANIFEST_SCHEMA = 1
_UNSAFE = re.compile(r"[\x00-\x1f\x7f\\]")


@dataclass(frozen=True)
class RemoteObject:
    """One object of the source, and where it goes (``rel``, relative to the target directory)."""

    name: str
    rel: str
    generation: int
    crc32c: str | None
    size: int
    updated: float = 0.0


@dataclass(frozen=True)
class Layout:
    """Where a source goes: ``target_dir`` (relative to the data volume) and each object's ``rel``.

    ``single``: the URI names one object, the file ``data.path``; its manifest is then
    ``.<file>.tfpipe-gcs-manifest.json`` beside it, so two files in one folder keep two.
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

    A ``uri`` naming one object exactly becomes the file ``data_path`` (``data_path/<its name>`` when
    ``data_path`` ends with ``/``); a folder ``uri`` lays every object below ``<prefix>/`` out below
    ``data_path`` by its relative name, skipping folder placeholders.
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

