"""The stage-in's lean media read (``tfpipe.gcs.media.MediaReader``) against the Cloud Storage emulator.

The real client, settled as the hook settles it, reads objects the emulator holds: their exact
bytes through the reader, and ``_download_many`` takes every small object that way, never calling
the library's download. The cases the reader leaves to the library (checksums, encodings, errors,
TLS, proxies, credentials) are in tests/provider/test_gcs_media.py, against servers that answer
them on purpose.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

# The count of the library's downloads (the fixture is used by its name here).
from tests.provider.test_gcs_media import library_downloads  # noqa: F401
from tfpipe.gcs import sync
from tfpipe.gcs.media import MediaReader
from tfpipe.hooks.gcs import settle_environment

pytestmark = [pytest.mark.gcs, pytest.mark.integration]

PROXY_VARS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
              "NO_PROXY", "no_proxy")


@pytest.fixture
def settled(gcs_client, bucket, monkeypatch):
    """``bucket`` of the emulator's client, settled as the hook settles its own (no proxy in the way)."""
    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    settle_environment(gcs_client)
    return bucket


def test_the_reader_reads_the_emulators_objects_exactly(settled):
    """The reader is usable for the emulator's client and returns an object's bytes (every byte
    value, a name to quote), the live generation after an overwrite, and None for an object that
    does not exist (404, the library's to report)."""
    name, body = "raw/a b/ü.bin", bytes(range(256)) * 1000
    blob = settled.blob(name)
    blob.upload_from_string(b"first")
    blob.upload_from_string(body)
    reader = MediaReader(settled.client)
    assert reader.usable
    assert reader.read(settled.blob(name)) == body
    assert reader.read(settled.blob(name, generation=blob.generation)) == body
    assert reader.read(settled.blob("raw/missing.bin")) is None
    # The emulator keeps no older generations: it serves the live object whatever generation is
    # asked (verified: ?generation=<the first upload's> returns the second's bytes). Which
    # generation the reader asks for, and a generation the service lacks, are checked against a
    # server that keeps generations: tests/provider/test_gcs_media.py.


def test_download_many_takes_every_small_object_through_the_reader(settled, library_downloads, tmp_path):  # noqa: F811
    """``_download_many`` of 20 objects (into files and into open files, empty and 300 kB ones
    among them) brings each one's exact bytes, and the library's download never runs."""
    bodies = {f"raw/part-{i:02d}.bin": os.urandom(i * 15_000) for i in range(20)}
    for name, body in bodies.items():
        settled.blob(name).upload_from_string(body)
    listed = {b.name: b for b in settled.client.list_blobs(settled.name)}
    targets = [str(tmp_path / f"{i}.bin") if i % 2 else io.BytesIO() for i in range(20)]
    jobs = [(name, listed[name].generation, len(body), target)
            for (name, body), target in zip(bodies.items(), targets)]
    results = sync._download_many(settled, jobs, 4)
    assert results == [None] * 20
    got = [Path(t).read_bytes() if isinstance(t, str) else t.getvalue() for t in targets]
    assert got == list(bodies.values())
    assert library_downloads == [], "every object came through the reader"
