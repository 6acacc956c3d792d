"""``gcs_stage_in_ratio``: ``GcsStageInOperator.execute()`` / list + ``transfer_manager.download_many``.

A generated bucket (500 objects of 400 kB, 200 MB, in two folder levels) in the in-memory GCS
emulator. A is tfpipe's stage-in, through its public operator (``tfpipe.operators.GcsStageInOperator``):
the objects into a fresh data volume through the Docker engine, manifest last. B is what a user writes
with the library: list the prefix, then one ``download_many`` into a fresh local folder at its defaults
(process workers, 8). Wall time and the machine's CPU time.
"""

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
from unittest import mock

from harness import LOGS, BenchError, Context, Figure, interleave, ratio_stats, timed

OBJECTS, OBJECT_BYTES, WORKERS, PREFIX = 500, 400_000, 8, "raw/"
#: The emulator with a listen backlog of 128 instead of socketserver's 5: with 8 workers connecting
#: at once (it speaks HTTP/1.0: a connection per request) the kernel drops the SYNs past 5 and the
#: clients wait out TCP's 1 s retransmission timer. Cloud Storage does not; left alone, the figure
#: would mostly count how often each side opens 8 connections at once.
EMULATOR_MAIN = ("import socketserver, sys; socketserver.TCPServer.request_queue_size = 128; "
                 "from gcp_storage_emulator.__main__ import main; sys.exit(main(sys.argv[1:]))")


@contextlib.contextmanager
def emulator(logfile: Path) -> Iterator[str]:
    """A running in-memory ``gcp-storage-emulator``: its ``http://127.0.0.1:PORT``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with open(logfile, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-c", EMULATOR_MAIN, "start", "--host=127.0.0.1", f"--port={port}",
                                 "--in-memory"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    host = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"the GCS emulator did not answer on {host} (see {logfile})")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{host}/storage/v1/b?project=bench", timeout=2):
                    break
            time.sleep(0.1)
        yield host
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    os.chmod(path, 0o777)
    return path


def measure(ctx: Context) -> dict[str, Any]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage
    from google.cloud.storage import transfer_manager

    from tfpipe.operators import GcsStageInOperator

    with emulator(LOGS / "gcs_stage_in_ratio.log") as host, mock.patch.dict(os.environ, STORAGE_EMULATOR_HOST=host):
        client = storage.Client(project="bench", credentials=AnonymousCredentials())
        bucket = client.create_bucket(f"tfpipe-bench-{ctx.session}")
        seed = [(io.BytesIO(os.urandom(OBJECT_BYTES)), bucket.blob(f"{PREFIX}shard-{i % 10}/part-{i:05d}.bin"))
                for i in range(OBJECTS)]
        transfer_manager.upload_many(seed, worker_type=transfer_manager.THREAD, max_workers=WORKERS, raise_exception=True)

        def sample(fn: Any, target: Path) -> tuple[float, float]:
            # Untimed: the last sample's dirty pages (200 MB) go to disk first; left there, they were paid
            # by whichever side next made the engine fsync, not by the side that wrote them.
            os.sync()
            took = timed(fn)
            arrived = sum(1 for p in target.rglob("*") if p.is_file() and not p.name.endswith("manifest.json"))
            if arrived != OBJECTS:
                raise BenchError(f"{arrived} of {OBJECTS} objects arrived in {target}")
            return took

        def stage_in(i: int) -> tuple[float, float]:
            volume = _fresh(ctx.tmp / "gcs-volume")
            op = GcsStageInOperator(task_id="stage_in", data_volume=str(volume), data_path="data/", image=ctx.image,
                                    source_uri=f"gs://{bucket.name}/{PREFIX}", max_workers=WORKERS)
            ti = SimpleNamespace(dag_id="bench_gcs", run_id=f"bench__{ctx.session}_{i}", task_id="stage_in",
                                 try_number=1, map_index=-1)
            return sample(lambda: op.execute({"ti": ti, "params": {}}), volume / "data")

        def download_many(i: int) -> tuple[float, float]:
            target = _fresh(ctx.tmp / "gcs-local")

            def run() -> None:
                pairs = []
                for blob in client.list_blobs(bucket.name, prefix=PREFIX):
                    path = target / blob.name[len(PREFIX):]
                    path.parent.mkdir(parents=True, exist_ok=True)
                    pairs.append((blob, str(path)))
                transfer_manager.download_many(pairs, max_workers=WORKERS, raise_exception=True)

            return sample(run, target)

        stats = ratio_stats(*interleave(ctx, "gcs_stage_in_ratio", stage_in, download_many))
        stats["info"] = (f"{OBJECTS} objects, {OBJECTS * OBJECT_BYTES / 1e6:.0f} MB: stage-in {stats['a_median_s']:.2f} s "
                         f"(CPU {stats['a_cpu_median_s']:.2f} s) vs download_many {stats['b_median_s']:.2f} s (CPU "
                         f"{stats['b_cpu_median_s']:.2f} s)")
        return stats


FIGURE = Figure("gcs_stage_in_ratio", 1.30, "GcsStageInOperator of 500 objects (200 MB) from the GCS emulator into "
                "a volume / list + transfer_manager.download_many of the same objects", measure, seconds=180)
