"""``gcs_stage_in_ratio``: tfpipe's stage-in against google-cloud-storage's transfer manager.

A is :class:`tfpipe.operators.gcs.GcsStageInOperator` ``execute()`` (outside Airflow, with the
parts of a task context it reads): it lists ``gs://BUCKET/raw/``, downloads every object on this
process (the worker) and hands them to the Docker engine, which writes them into a fresh data
volume through a helper container, manifest last. B is what a user would write by hand with the
library: list the same prefix, then ``transfer_manager.download_many`` of every object into a
fresh local directory, at the library's defaults (process workers, 8 of them). A third arm, the
same call with thread workers, is reported as information (``thread_workers``).

Publish is reported beside it as information (``publish``): ``local_files`` + ``publish_version``
(CRC32Cs, the upload, the ``_COMPLETE`` marker) against ``transfer_manager.upload_many`` of the
same files (process workers), each to a fresh prefix.

Both sides talk to one ``gcp-storage-emulator`` (the one the tests use) started here on a free
loopback port in its own process group. Wall and machine CPU time (``bench.run.timed``: the
emulator's and dockerd's CPU time count on both sides alike) are reported per pair.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

#: The generated bucket: 500 objects of 400 kB (200 MB), in two folder levels like a real data set.
OBJECTS = 500
OBJECT_BYTES = 400_000
#: The published "model": 50 files of 400 kB (20 MB); the emulator takes uploads at a few MB/s.
PUBLISH_FILES = 50
#: Parallel transfers on every side: the operators' default and the transfer manager's.
WORKERS = 8
PREFIX = "raw/"


def _object_name(index: int) -> str:
    return f"{PREFIX}shard-{index % 10}/part-{index:05d}.bin"


@contextlib.contextmanager
def emulator(logfile: Path) -> Iterator[str]:
    """A running in-memory ``gcp-storage-emulator`` (``http://127.0.0.1:PORT``), stopped by its process group."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    binary = Path(sys.executable).parent / "gcp-storage-emulator"
    with open(logfile, "ab") as log:
        proc = subprocess.Popen([str(binary), "start", "--host=127.0.0.1", f"--port={port}", "--in-memory"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    host = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the GCS emulator exited with {proc.returncode} (see {logfile})")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{host}/storage/v1/b?project=bench", timeout=2):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the GCS emulator did not answer on {host} within 30 s (see {logfile})")
            time.sleep(0.1)
        yield host
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _client() -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    return storage.Client(project="bench", credentials=AnonymousCredentials())


def _seed(bucket: Any, names: list[str], size: int) -> None:
    """Upload ``names`` with distinct random bodies of ``size`` bytes (not timed)."""
    from google.cloud.storage import transfer_manager

    pairs = [(io.BytesIO(os.urandom(size)), bucket.blob(name)) for name in names]
    for result in transfer_manager.upload_many(pairs, worker_type=transfer_manager.THREAD, max_workers=WORKERS):
        if isinstance(result, Exception):
            raise result


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    os.chmod(path, 0o777)
    return path


def _count_files(path: Path) -> int:
    return sum(1 for p in path.rglob("*") if p.is_file() and not p.name.endswith("manifest.json"))


def _download_many(bucket_name: str, target: Path, worker_type: str) -> None:
    """B: what a user writes with the library: list the prefix, then one ``download_many``."""
    from google.cloud.storage import transfer_manager

    blobs = list(_client().list_blobs(bucket_name, prefix=PREFIX))
    pairs = []
    for blob in blobs:
        path = target / blob.name[len(PREFIX):]
        path.parent.mkdir(parents=True, exist_ok=True)
        pairs.append((blob, str(path)))
    transfer_manager.download_many(pairs, worker_type=worker_type, max_workers=WORKERS, raise_exception=True)


def gcs_stage_in(ctx: Any) -> dict[str, Any]:
    """The ``gcs_stage_in_ratio`` figure (see the module's docstring)."""
    # The helpers live in the bench script, which may be ``__main__``: take them from the module
    # that made ``ctx`` instead of importing bench/run.py a second time.
    bench = sys.modules[type(ctx).__module__]
    from google.cloud.storage import transfer_manager

    from tfpipe.gcs.publish import local_files, publish_version, version_uri
    from tfpipe.hooks.gcs import GcsUri, TfpipeGcsHook
    from tfpipe.operators.gcs import GcsStageInOperator

    logfile = bench.LOGS / "gcs_stage_in_ratio.log"
    saved_env = os.environ.get("STORAGE_EMULATOR_HOST")
    with emulator(logfile) as host:
        os.environ["STORAGE_EMULATOR_HOST"] = host
        try:
            bucket = _client().create_bucket(f"tfpipe-bench-{ctx.session}")
            started = time.monotonic()
            _seed(bucket, [_object_name(i) for i in range(OBJECTS)], OBJECT_BYTES)
            bench.log(f"gcs_stage_in_ratio: {OBJECTS} objects, {OBJECTS * OBJECT_BYTES / 1e6:.0f} MB seeded in "
                      f"{time.monotonic() - started:.0f} s")
            uri = f"gs://{bucket.name}/{PREFIX}"
            threads: list[tuple[float, float]] = []

            def stage_in(i: int) -> tuple[float, float]:
                target = _fresh(ctx.tmp / "gcs-stage-in")
                op = GcsStageInOperator(task_id="stage_in", data_volume=str(target), data_path="data/",
                                        image=ctx.image, source_uri=uri, max_workers=WORKERS)
                ti = SimpleNamespace(dag_id="bench_gcs", run_id=f"bench__{ctx.session}_{i}", task_id="stage_in",
                                     try_number=1, map_index=-1)
                result: dict[str, Any] = {}
                took = bench.timed(lambda: result.update(op.execute({"ti": ti, "params": {}})))
                if result.get("downloaded") != OBJECTS or _count_files(target / "data") != OBJECTS:
                    raise bench.BenchError(f"stage-in staged {result.get('downloaded')} of {OBJECTS} objects")
                return took

            def library(i: int) -> tuple[float, float]:
                # B and the thread-worker arm alternate which goes first, so drift hits both alike
                arms = [(transfer_manager.PROCESS, None), (transfer_manager.THREAD, threads)]
                took: tuple[float, float] = (0.0, 0.0)
                for worker_type, into in arms if i % 2 == 0 else arms[::-1]:
                    target = _fresh(ctx.tmp / f"gcs-{worker_type}")
                    sample = bench.timed(lambda: _download_many(bucket.name, target, worker_type))
                    if _count_files(target) != OBJECTS:
                        raise bench.BenchError(f"download_many ({worker_type}) left {_count_files(target)} files")
                    if into is None:
                        took = sample
                    else:
                        into.append(sample)
                return took

            a, b, notes = bench.interleave(ctx, "gcs_stage_in_ratio", stage_in, library)
            a_cpu, b_cpu = ctx.cpu["gcs_stage_in_ratio"]
            stats = bench.ratio_stats(a, b, a_cpu, b_cpu)
            thread_stats = bench.ratio_stats(a, [t[0] for t in threads], a_cpu, [t[1] for t in threads])

            # publish, as information: a fresh version prefix per sample on both sides
            source = _fresh(ctx.tmp / "gcs-publish")
            for index in range(PUBLISH_FILES):
                path = source / "variables" / f"part-{index:03d}" if index % 2 else source / f"file-{index:03d}"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(os.urandom(OBJECT_BYTES))
            base = GcsUri.parse(f"gs://{bucket.name}/models")

            def publish(i: int) -> tuple[float, float]:
                dest = version_uri(base, "tfpipe", i + 1)
                result: dict[str, Any] = {}
                took = bench.timed(lambda: result.update(publish_version(
                    TfpipeGcsHook(), dest, local_files(str(source)), max_workers=WORKERS)))
                if result.get("uploaded") != PUBLISH_FILES:
                    raise bench.BenchError(f"publish uploaded {result.get('uploaded')} of {PUBLISH_FILES} files")
                return took

            def upload_many(i: int) -> tuple[float, float]:
                def work() -> None:
                    target = _client().bucket(bucket.name)
                    pairs = [(str(p), target.blob(f"library/{i}/{p.relative_to(source).as_posix()}"))
                             for p in sorted(source.rglob("*")) if p.is_file()]
                    transfer_manager.upload_many(pairs, worker_type=transfer_manager.PROCESS, max_workers=WORKERS,
                                                 raise_exception=True)

                return bench.timed(work)

            pa, pb, pnotes = bench.interleave(ctx, "gcs_publish", publish, upload_many)
            pa_cpu, pb_cpu = ctx.cpu["gcs_publish"]
            publish_stats = bench.ratio_stats(pa, pb, pa_cpu, pb_cpu)
        finally:
            if saved_env is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = saved_env
    stats["thread_workers"] = {k: thread_stats[k] for k in ("ratio", "min", "max", "b_median_s", "cpu_ratio",
                                                           "b_cpu_median_s") if k in thread_stats}
    stats["publish"] = {k: v for k, v in publish_stats.items() if k != "per_pair"}
    stats.update(objects=OBJECTS, bytes=OBJECTS * OBJECT_BYTES, workers=WORKERS, publish_files=PUBLISH_FILES,
                 notes=notes + pnotes)
    stats["info"] = (
        f"{OBJECTS} objects, {OBJECTS * OBJECT_BYTES / 1e6:.0f} MB: stage-in {stats['a_median_s']} s "
        f"(CPU {stats.get('a_cpu_median_s')} s) vs download_many with process workers {stats['b_median_s']} s "
        f"(CPU {stats.get('b_cpu_median_s')} s), with thread workers {thread_stats['b_median_s']} s (A/B "
        f"{thread_stats['ratio']}, CPU {thread_stats.get('cpu_ratio')}); publish of {PUBLISH_FILES} files "
        f"against upload_many (processes): A/B {publish_stats['ratio']} ({publish_stats['a_median_s']} vs "
        f"{publish_stats['b_median_s']} s), CPU {publish_stats.get('cpu_ratio')}")
    if stats["ratio"] > 1.0:
        stats["why"] = stats["info"]
    return stats
