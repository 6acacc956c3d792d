"""``gcs_stage_in_ratio``: tfpipe's stage-in against google-cloud-storage's transfer manager.

A is :class:`tfpipe.operators.gcs.GcsStageInOperator` ``execute()`` (outside Airflow, with the
parts of a task context it reads): it lists ``gs://BUCKET/raw/``, downloads every object on this
process (the worker) and hands them to the Docker engine, which writes them into a fresh data
volume through a helper container, manifest last. B is what a user would write by hand with the
library: list the same prefix, then ``transfer_manager.download_many`` of every object into a
fresh local directory, at the library's defaults (process workers, 8 of them). Two more arms are
reported as information: the same call with thread workers (``thread_workers``), and the same call
followed by what a user without tfpipe must add before a container on the engine can read the files
(``download_then_docker_cp``): ``docker create`` of a container of the trainer image with the
target directory mounted, ``docker cp`` of the downloaded folder into it, ``docker rm``.

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
#: The emulator's own entry point, with a listen backlog of 128 instead of socketserver's 5: with 8
#: workers connecting at once (every request is a new connection: it speaks HTTP/1.0) the kernel
#: drops the SYNs past 5 and the clients wait out TCP's 1 s retransmission timer. Cloud Storage does
#: not; left alone, the figure would mostly count how often each side opens 8 connections at once.
EMULATOR_MAIN = ("import socketserver, sys; socketserver.TCPServer.request_queue_size = 128; "
                 "from gcp_storage_emulator.__main__ import main; sys.exit(main(sys.argv[1:]))")


def _object_name(index: int) -> str:
    return f"{PREFIX}shard-{index % 10}/part-{index:05d}.bin"


@contextlib.contextmanager
def emulator(logfile: Path) -> Iterator[tuple[str, int]]:
    """A running in-memory ``gcp-storage-emulator``: (``http://127.0.0.1:PORT``, its pid); stopped by its
    process group."""
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
            if proc.poll() is not None:
                raise RuntimeError(f"the GCS emulator exited with {proc.returncode} (see {logfile})")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{host}/storage/v1/b?project=bench", timeout=2):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the GCS emulator did not answer on {host} within 30 s (see {logfile})")
            time.sleep(0.1)
        yield host, proc.pid
    finally:  # in memory: nothing to flush, so no grace period
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _engine_pids() -> list[int]:
    """dockerd of /var/run/docker.sock and its containerd: they write A's files into the volume."""
    try:
        dockerd = int(Path("/var/run/docker.pid").read_text().strip())
    except (OSError, ValueError):
        return []
    pids = [dockerd]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == dockerd:
                pids.append(int(stat.parent.name))
    return pids


def _cpu_s(pids: list[int]) -> float:
    """CPU seconds of this process, its reaped children and ``pids`` (with their reaped children)."""
    own = os.times()
    total = own.user + own.system + own.children_user + own.children_system
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def _timed(fn: Any, pids: list[int], machine: list[float], machine_cpu_s: Any) -> tuple[float, float]:
    """(wall s, CPU s of the processes doing the work); the machine's busy CPU s goes to ``machine``.

    The working processes (this one and its process workers, the emulator, dockerd and containerd)
    are what A and B spend; the machine-wide clock also counts whoever else shares the machine.
    """
    # Untimed: the page cache's dirty data of the last sample (200 MB per arm) goes to disk first.
    # Left there, it was paid by whichever side next made the engine fsync (A's container create:
    # 0.01 s on a clean cache, about 0.5 s after B's 400 MB), not by the side that wrote it.
    os.sync()
    cpu0, machine0, wall0 = _cpu_s(pids), machine_cpu_s(), time.monotonic()
    fn()
    wall = time.monotonic() - wall0
    machine.append(machine_cpu_s() - machine0)
    return wall, _cpu_s(pids) - cpu0


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


def _upload_many(bucket_name: str, source: Path, prefix: str, worker_type: str) -> None:
    """B of publish: one ``upload_many`` of every file below ``source``."""
    from google.cloud.storage import transfer_manager

    bucket = _client().bucket(bucket_name)
    pairs = [(str(p), bucket.blob(f"{prefix}{p.relative_to(source).as_posix()}"))
             for p in sorted(source.rglob("*")) if p.is_file()]
    transfer_manager.upload_many(pairs, worker_type=worker_type, max_workers=WORKERS, raise_exception=True)


def _download_then_docker_cp(bucket_name: str, staging: Path, target: Path, ctx: Any, bench: Any) -> None:
    """B as far as a container: ``download_many`` into ``staging`` on this machine, then the files into
    ``target/data`` through the engine with the docker CLI (Go's tar on both ends: its fastest form)."""
    from google.cloud.storage.transfer_manager import PROCESS

    _download_many(bucket_name, staging, PROCESS)
    logfile = bench.LOGS / "gcs_stage_in_ratio.log"
    args = ctx.docker_run_args("docker-cp")  # named and labelled: the bench's cleanup removes it if left
    bench.run_logged(["docker", "create", *args, "--mount", f"type=bind,src={target},dst=/data", ctx.image, "true"],
                     logfile, timeout=120)
    try:
        bench.run_logged(["docker", "cp", f"{staging}/.", f"{args[1]}:/data/data"], logfile, timeout=300)
    finally:
        subprocess.run(["docker", "rm", "-f", args[1]], capture_output=True)


def gcs_stage_in(ctx: Any) -> dict[str, Any]:
    """The ``gcs_stage_in_ratio`` figure (see the module's docstring)."""
    # The helpers live in the bench script, which may be ``__main__``: take them from the module
    # that made ``ctx`` instead of importing bench/run.py a second time.
    bench = sys.modules[type(ctx).__module__]
    saved_env = os.environ.get("STORAGE_EMULATOR_HOST")
    with emulator(bench.LOGS / "gcs_stage_in_ratio.log") as (host, emulator_pid):
        os.environ["STORAGE_EMULATOR_HOST"] = host
        try:
            return _measure(ctx, bench, [emulator_pid, *_engine_pids()])
        finally:
            if saved_env is None:
                os.environ.pop("STORAGE_EMULATOR_HOST", None)
            else:
                os.environ["STORAGE_EMULATOR_HOST"] = saved_env


def _measure(ctx: Any, bench: Any, pids: list[int]) -> dict[str, Any]:
    from google.cloud.storage.transfer_manager import PROCESS, THREAD

    from tfpipe.gcs.publish import local_files, publish_version, version_uri
    from tfpipe.hooks.gcs import GcsUri, TfpipeGcsHook
    from tfpipe.operators.gcs import GcsStageInOperator

    bucket = _client().create_bucket(f"tfpipe-bench-{ctx.session}")
    started = time.monotonic()
    _seed(bucket, [_object_name(i) for i in range(OBJECTS)], OBJECT_BYTES)
    bench.log(f"gcs_stage_in_ratio: {OBJECTS} objects, {OBJECTS * OBJECT_BYTES / 1e6:.0f} MB seeded in "
              f"{time.monotonic() - started:.0f} s")
    machine: dict[str, list[float]] = {}
    samples: dict[str, list[tuple[float, float]]] = {}

    def timed(arm: str, fn: Any) -> tuple[float, float]:
        sample = _timed(fn, pids, machine.setdefault(arm, []), bench.machine_cpu_s)
        samples.setdefault(arm, []).append(sample)
        return sample

    def library(i: int, arms: dict[str, Any]) -> tuple[float, float]:
        """B (process workers, the library's default) and the thread-worker arm, first one then the
        other first, so drift hits both alike; returns B's sample."""
        names = list(arms) if i % 2 == 0 else list(arms)[::-1]
        return {name: timed(name, arms[name]) for name in names}[next(iter(arms))]

    uri = f"gs://{bucket.name}/{PREFIX}"

    def stage_in(i: int) -> tuple[float, float]:
        target = _fresh(ctx.tmp / "gcs-stage-in")
        op = GcsStageInOperator(task_id="stage_in", data_volume=str(target), data_path="data/", image=ctx.image,
                                source_uri=uri, max_workers=WORKERS)
        ti = SimpleNamespace(dag_id="bench_gcs", run_id=f"bench__{ctx.session}_{i}", task_id="stage_in",
                             try_number=1, map_index=-1)
        result: dict[str, Any] = {}
        took = timed("stage_in", lambda: result.update(op.execute({"ti": ti, "params": {}})))
        if result.get("downloaded") != OBJECTS or _count_files(target / "data") != OBJECTS:
            raise bench.BenchError(f"stage-in staged {result.get('downloaded')} of {OBJECTS} objects")
        return took

    def download_many(i: int) -> tuple[float, float]:
        targets = {kind: _fresh(ctx.tmp / f"gcs-{kind}") for kind in (PROCESS, THREAD)}
        staging, volume = _fresh(ctx.tmp / "gcs-cp-staging"), _fresh(ctx.tmp / "gcs-cp-volume")
        arms = {f"download_{kind}": lambda kind=kind: _download_many(bucket.name, targets[kind], kind)
                for kind in (PROCESS, THREAD)}
        arms["download_cp"] = lambda: _download_then_docker_cp(bucket.name, staging, volume, ctx, bench)
        took = library(i, arms)
        for kind, target in {**targets, "docker cp": volume / "data"}.items():
            if _count_files(target) != OBJECTS:
                raise bench.BenchError(f"download_many ({kind}) left {_count_files(target)} files")
        return took

    *_, notes = bench.interleave(ctx, "gcs_stage_in_ratio", stage_in, download_many)

    # publish, as information: a fresh version prefix per sample on every side
    source = _fresh(ctx.tmp / "gcs-publish")
    for index in range(PUBLISH_FILES):
        path = source / "variables" / f"part-{index:03d}" if index % 2 else source / f"file-{index:03d}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(OBJECT_BYTES))
    base = GcsUri.parse(f"gs://{bucket.name}/models")

    def publish(i: int) -> tuple[float, float]:
        result: dict[str, Any] = {}
        took = timed("publish", lambda: result.update(publish_version(
            TfpipeGcsHook(), version_uri(base, "tfpipe", i + 1), local_files(str(source)), max_workers=WORKERS)))
        if result.get("uploaded") != PUBLISH_FILES:
            raise bench.BenchError(f"publish uploaded {result.get('uploaded')} of {PUBLISH_FILES} files")
        return took

    def upload_many(i: int) -> tuple[float, float]:
        return library(i, {f"upload_{kind}": lambda kind=kind: _upload_many(bucket.name, source, f"{kind}/{i}/", kind)
                           for kind in (PROCESS, THREAD)})

    *_, publish_notes = bench.interleave(ctx, "gcs_publish", publish, upload_many)

    def versus(a_arm: str, b_arm: str) -> dict[str, Any]:
        stats = bench.ratio_stats(*([s[0] for s in samples[arm]] for arm in (a_arm, b_arm)),
                                  *([s[1] for s in samples[arm]] for arm in (a_arm, b_arm)))
        machine_ratio = bench.ratio_stats(machine[a_arm], machine[b_arm])
        stats.update(machine_cpu_ratio=machine_ratio["ratio"], a_machine_cpu_median_s=machine_ratio["a_median_s"],
                     b_machine_cpu_median_s=machine_ratio["b_median_s"])
        return stats

    stats = versus("stage_in", f"download_{PROCESS}")
    threads = versus("stage_in", f"download_{THREAD}")
    copied = versus("stage_in", "download_cp")
    publish_stats = {"upload_many_processes": versus("publish", f"upload_{PROCESS}"),
                     "upload_many_threads": versus("publish", f"upload_{THREAD}")}
    for entry in (threads, copied, *publish_stats.values()):
        entry.pop("per_pair", None)
    stats.update(thread_workers=threads, download_then_docker_cp=copied, publish=publish_stats,
                 objects=OBJECTS, bytes=OBJECTS * OBJECT_BYTES,
                 workers=WORKERS, publish_files=PUBLISH_FILES, notes=notes + publish_notes,
                 cpu_counts="this process and its children, the emulator, dockerd and containerd "
                            "(machine_cpu_ratio: the whole machine's busy CPU time, strangers included)")
    pub_p, pub_t = publish_stats["upload_many_processes"], publish_stats["upload_many_threads"]
    stats["info"] = (
        f"{OBJECTS} objects, {OBJECTS * OBJECT_BYTES / 1e6:.0f} MB: stage-in {stats['a_median_s']} s (CPU "
        f"{stats.get('a_cpu_median_s')} s) vs download_many with process workers (its default) "
        f"{stats['b_median_s']} s (CPU {stats.get('b_cpu_median_s')} s); against thread workers "
        f"({threads['b_median_s']} s) A/B {threads['ratio']}, CPU {threads.get('cpu_ratio')}; against "
        f"download_many then docker cp into the volume ({copied['b_median_s']} s) A/B {copied['ratio']}, CPU "
        f"{copied.get('cpu_ratio')}. Publish of "
        f"{PUBLISH_FILES} files ({pub_p['a_median_s']} s) vs upload_many: processes A/B {pub_p['ratio']} "
        f"(CPU {pub_p.get('cpu_ratio')}), threads A/B {pub_t['ratio']} (CPU {pub_t.get('cpu_ratio')})")
    if stats["ratio"] > 1.0:
        stats["why"] = stats["info"]
    return stats
