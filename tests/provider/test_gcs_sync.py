"""The stage-in's tar stream (``tfpipe.gcs.sync._tar_stream``), read back with ``tarfile``.

The stream is what the engine extracts into the data volume: each downloaded file with its bytes
and the stage user as owner, each missing parent directory once before its first file, the
manifest's archive last. Real files in a temporary directory; the engine's side runs in
tests/integration/test_gcs_stage_in.py.
"""

from __future__ import annotations

import io
import logging
import tarfile

import pytest

from tfpipe.gcs import sync
from tfpipe.gcs.plan import MANIFEST_NAME, RemoteObject, SyncPlan
from tfpipe.hooks.docker import tar_bytes

pytestmark = pytest.mark.gcs


def _objects(tmp_path, bodies: dict[str, bytes]) -> tuple[list[RemoteObject], dict[str, str]]:
    objects, files = [], {}
    for rel, body in bodies.items():
        path = tmp_path / rel.replace("/", "_")
        path.write_bytes(body)
        objects.append(RemoteObject(name=f"raw/{rel}", rel=rel, generation=1, crc32c=None, size=len(body),
                                    updated=1_700_000_000.0))
        files[rel] = str(path)
    return objects, files


def test_the_stream_holds_each_file_its_new_parents_once_and_the_manifest_last(tmp_path, monkeypatch):
    """Files bigger and smaller than a stream piece, in nested folders: every byte is in the tar,
    owned by ``uid:gid``; a directory already in the target (``dirs``) is not sent again, a new one
    is sent once (mode 755) before its first file; the manifest's archive ends the stream, and each
    downloaded file is removed once it is in the stream."""
    monkeypatch.setattr(sync, "PIECE_BYTES", 1000)
    bodies = {"a.csv": b"x" * 10, "old/b.csv": b"y" * 2500, "new/deep/c.csv": b"", "new/d.csv": bytes(range(256)) * 9}
    objects, files = _objects(tmp_path, bodies)
    survey = sync._Survey(listing={}, plan=SyncPlan(), dirs={"old"}, uid=1000, gid=1001)
    manifest = tar_bytes(MANIFEST_NAME, b'{"schema": 1}', uid=1000, gid=1001)
    pieces = list(sync._tar_stream(objects, files, survey, manifest, len(objects), logging.getLogger("test")))

    assert all(len(piece) >= 1000 for piece in pieces[:-1]), "the pieces are at least PIECE_BYTES but the last"
    with tarfile.open(fileobj=io.BytesIO(b"".join(pieces))) as tar:
        members = tar.getmembers()
        assert [(m.name, m.isdir()) for m in members] == [
            ("a.csv", False), ("old/b.csv", False), ("new", True), ("new/deep", True), ("new/deep/c.csv", False),
            ("new/d.csv", False), (MANIFEST_NAME, False)]
        assert all((m.uid, m.gid) == (1000, 1001) for m in members)
        assert all(m.mode == 0o755 for m in members if m.isdir())
        for rel, body in bodies.items():
            assert tar.extractfile(rel).read() == body, rel
        assert tar.extractfile(MANIFEST_NAME).read() == b'{"schema": 1}'
    assert list(tmp_path.iterdir()) == [], "every downloaded file was removed once streamed"


def test_without_a_new_manifest_the_stream_still_ends_as_a_whole_archive(tmp_path):
    """A sync whose manifest says the same as the target's sends none; its stream still ends with
    the tar's end blocks, so the engine extracts it whole."""
    objects, files = _objects(tmp_path, {"a.csv": b"1,2\n"})
    survey = sync._Survey(listing={}, plan=SyncPlan(), dirs=set(), uid=0, gid=0)
    stream = b"".join(sync._tar_stream(objects, files, survey, None, 1, logging.getLogger("test")))
    assert stream.endswith(tarfile.NUL * 2 * tarfile.BLOCKSIZE)
    with tarfile.open(fileobj=io.BytesIO(stream)) as tar:
        assert tar.getnames() == ["a.csv"]
