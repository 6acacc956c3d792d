#!/usr/bin/env python3
"""``make bench``: side-by-side speed ratios of tfpipe, measured A/B interleaved on this machine.

Not a test: nothing here asserts a target. Every figure runs A, B, A, B, ... (``--pairs``, at
least 5 by default) so drift of a shared machine hits both sides alike; its ratio is the median
of the per-pair ratios A/B. The table goes to stdout, the figures to ``bench/results.json``::

    {"<name>": {"ratio": median, "min": ..., "max": ..., "pairs": n, "target": ..., "judged_on": ..., ...}}

(plus the details of each figure: medians of A and B in seconds, notes, ``error`` when a figure
failed; a failed figure never stops the others). ``judged_on`` names the field the target applies
to: ``ratio`` (wall time), or ``cpu_ratio`` for ``train_loop_ratio``, whose target is CPU time.
Logs of every figure go to ``.cache/bench/``.

    make bench                                  # everything, < 20 min on 2 CPU cores
    .venv/bin/python bench/run.py --only dag_parse_ratio --pairs 3
    .venv/bin/python bench/run.py --list

The figures and what A and B are: see ``FIGURES`` below and ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import random
import re
import runpy
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any, Callable

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results.json"
LOGS = REPO / ".cache" / "bench"
RESULT_PREFIX = "BENCH_RESULT "
UID_GID = (1000, 1000)  # the trainer image's user: files on mounts belong to it

# The environment `make` exports (Makefile), so `.venv/bin/python bench/run.py` works directly too.
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow"))
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO / "dags")
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__UNIT_TEST_MODE"] = "False"
sys.path.insert(0, str(REPO / "provider"))  # tfpipe, when the venv lacks the editable install
sys.path.insert(0, str(BENCH))  # the figures_*.py modules beside this script

import figures_prep  # noqa: E402

from figures_gcs import gcs_stage_in  # noqa: E402  (bench/ is on sys.path: this script's folder)

from figures_train_loop import train_loop  # noqa: E402

import resume_breakdown  # noqa: E402


# --------------------------------------------------------------------------------------------
# small helpers


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchError(RuntimeError):
    """A figure could not be measured; the message goes to the table and results.json."""


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def ratio_stats(a: list[float], b: list[float], a_cpu: list[float] | None = None,
                b_cpu: list[float] | None = None) -> dict[str, Any]:
    """Median, min and max of the per-pair ratios a[i] / b[i], and of the CPU-time ratios when given.

    Wall time swings on a shared 2-core machine; CPU time (process + children + containers, as each
    figure measures it) is the steadier half of the picture, so every figure reports both."""
    n = min(len(a), len(b))
    if n == 0:
        raise BenchError("no complete A/B pair was measured")
    ratios = [a[i] / b[i] for i in range(n)]
    stats = {"ratio": round(median(ratios), 4), "min": round(min(ratios), 4),
             "max": round(max(ratios), 4), "pairs": n,
             "a_median_s": round(median(a[:n]), 4), "b_median_s": round(median(b[:n]), 4),
             "per_pair": [round(r, 4) for r in ratios]}
    if a_cpu and b_cpu:
        m = min(len(a_cpu), len(b_cpu), n)
        cpu = [a_cpu[i] / b_cpu[i] for i in range(m) if b_cpu[i] > 0]
        if cpu:
            stats.update(cpu_ratio=round(median(cpu), 4), cpu_min=round(min(cpu), 4), cpu_max=round(max(cpu), 4),
                         a_cpu_median_s=round(median(a_cpu[:m]), 4), b_cpu_median_s=round(median(b_cpu[:m]), 4))
    return stats


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (user + nice + system + irq + softirq), from /proc/stat.

    A sample's CPU cost is the difference across it. It counts every process, containers, dockerd and
    Airflow's own included, which is the point for figures whose work spreads over many processes;
    it also counts strangers, so a figure that uses it wants a quiet machine (as ``make bench`` is)."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """Run ``fn``; return (wall seconds, machine CPU seconds) it took: what ``interleave`` takes."""
    cpu0, wall0 = machine_cpu_s(), time.monotonic()
    fn()
    return time.monotonic() - wall0, machine_cpu_s() - cpu0


def chown_tree(path: Path) -> None:
    """Make ``path`` (and what is below it) belong to the image's uid 1000 and be writable."""
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, d) for d in dirs), *(os.path.join(root, f) for f in files)]:
            try:
                os.chown(name, *UID_GID)
            except PermissionError:
                os.chmod(name, 0o777 if os.path.isdir(name) else 0o666)


def make_dirs(*paths: Path) -> None:
    """Create directories and hand them to uid 1000 (what the operators' helper container does)."""
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)
        try:
            os.chown(path, *UID_GID)
        except PermissionError:
            path.chmod(0o777)


def parse_result(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    return None


@dataclasses.dataclass
class Figure:
    name: str
    target: float | None
    what: str
    run: Callable[["Context"], dict[str, Any]]
    gpu: bool = False
    min_seconds: float = 30  # not started when less of the time budget is left
    #: the entry's field the target applies to: "ratio" (wall time) or "cpu_ratio"
    judged_on: str = "ratio"


# --------------------------------------------------------------------------------------------
# the run's context: image, temp dirs, containers, time budget


class Context:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.pairs: int = args.pairs
        self.session = uuid.uuid4().hex[:8]
        self.started = time.monotonic()
        self.cpu: dict[str, tuple[list[float], list[float]]] = {}  # figure -> (A, B) CPU seconds per pair
        self.budget_s: float = args.budget
        self.image = self._image()
        self.tmp = Path(tempfile.mkdtemp(prefix=f"tfpipe-bench-{self.session}-"))
        os.chmod(self.tmp, 0o777)
        LOGS.mkdir(parents=True, exist_ok=True)
        self._images_root: Path | None = None
        self._images_error: str | None = None
        self._names = 0
        self.python = sys.executable

    # -- image ---------------------------------------------------------------------------------
    def _image(self) -> str:
        ref = os.environ.get("TFPIPE_IMAGE")
        if not ref:
            log("TFPIPE_IMAGE is not set: building (or reusing) the trainer image with docker/build-image.sh")
            proc = subprocess.run([str(REPO / "docker" / "build-image.sh")], capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"bench: docker/build-image.sh failed:\n{proc.stderr[-3000:]}")
            ref = proc.stdout.strip().splitlines()[-1]
        if subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode != 0:
            raise SystemExit(f"bench: the trainer image {ref} is not in the Docker engine: run `make image`")
        os.environ["TFPIPE_IMAGE"] = ref
        return ref

    # -- time budget ---------------------------------------------------------------------------
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    # -- containers ----------------------------------------------------------------------------
    def container_name(self, what: str) -> str:
        self._names += 1
        return f"tfpipe-bench-{self.session}-{what}-{self._names}"

    def docker_run_args(self, what: str) -> list[str]:
        """``docker run`` options every bench container gets: a name and the session label."""
        return ["--name", self.container_name(what), "--label", f"tfpipe.bench={self.session}"]

    def in_image(self, script: str, args: list[str], *, logfile: Path, timeout: float,
                 docker_args: list[str] | None = None, mount_root: Path | None = None) -> dict[str, Any]:
        """Run ``bench/in_image/<script>`` in the trainer image against the working tree."""
        root = mount_root or self.tmp
        cmd = ["docker", "run", "--rm", *self.docker_run_args(Path(script).stem.replace("_", "-")),
               "-v", f"{REPO}:/src:ro", "-v", f"{root}:/bench", "-w", "/src",
               "-e", "PYTHONPATH=/src:/opt/tfpipe/deps", "--shm-size", "1g", *(docker_args or []),
               self.image, "python3", f"bench/in_image/{script}", "--root", "/bench", *args]
        out = run_logged(cmd, logfile, timeout=timeout, kill_container=cmd[4])
        result = parse_result(out)
        if result is None:
            raise BenchError(f"{script} printed no result line (see {logfile})")
        if result.get("error"):
            raise BenchError(f"{script}: {result['error']}")
        return result

    def images_root(self) -> Path:
        """The synthetic 64x64 RGB image data set (PNGs + trainer.prep), made once per bench run."""
        if self._images_error:
            raise BenchError(f"the synthetic image data set could not be made: {self._images_error}")
        if self._images_root is None:
            root = self.tmp / "images"
            root.mkdir()
            chown_tree(root)
            os.chmod(root, 0o777)
            log("making the synthetic image data set (1,200 64x64 RGB PNGs, trainer.prep)")
            try:
                result = self.in_image("make_images.py", ["--count", "1200", "--size", "64", "--channels", "3"],
                                       logfile=LOGS / "make_images.log", timeout=300, mount_root=root)
            except BenchError as err:
                self._images_error = str(err)
                raise
            log(f"image data set: {result['examples']} in {result['seconds']} s")
            self._images_root = root
        return self._images_root

    def cleanup(self) -> None:
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=tfpipe.bench={self.session}"],
                             capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)
        if self.args.keep_temp:
            log(f"kept temporary files in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def run_logged(cmd: list[str], logfile: Path, *, timeout: float, env: dict[str, str] | None = None,
               cwd: Path | None = None, kill_container: str | None = None) -> str:
    """Run ``cmd``; stdout+stderr go to ``logfile``; return stdout; BenchError on failure."""
    with open(logfile, "a") as handle:
        handle.write(f"\n$ {' '.join(cmd)[:2000]}\n")
        handle.flush()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=handle, text=True, env=env,
                                  cwd=cwd, timeout=timeout)
        except subprocess.TimeoutExpired as err:
            if kill_container:
                subprocess.run(["docker", "rm", "-f", kill_container], capture_output=True)
            raise BenchError(f"timed out after {timeout:.0f} s: {' '.join(cmd)[:200]} (see {logfile})") from err
        handle.write(proc.stdout)
    if proc.returncode != 0:
        raise BenchError(f"exit {proc.returncode}: {' '.join(cmd)[:200]} (see {logfile})")
    return proc.stdout


def tfpipe_run_summary(proc: subprocess.CompletedProcess, cmd: list[str], dag_id: str, home: Path,
                       logfile: Path) -> dict[str, Any]:
    """Log a finished ``tfpipe run``; return its summary, or BenchError unless it succeeded without retries
    (a retried task makes a sample incomparable)."""
    with open(logfile, "a") as handle:
        handle.write(f"\n$ {' '.join(cmd)}  (TFPIPE_HOME={home})\n{proc.stderr}\n{proc.stdout}\n")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1]) if lines else {}
    if proc.returncode != 0 or summary.get("state") != "success":
        raise BenchError(f"tfpipe run {dag_id} ended {summary.get('state', 'without a summary')} "
                         f"(exit {proc.returncode}; see {logfile})")
    retried = [t for t, v in summary.get("tasks", {}).items() if v.get("try_number", 1) != 1]
    if retried:
        raise BenchError(f"tfpipe run {dag_id}: task(s) {retried} were retried: the timing is not comparable")
    return summary


def interleave(ctx: Context, name: str, run_a: Callable[[int], Any], run_b: Callable[[int], Any],
               *, pairs: int | None = None, min_pairs: int = 5) -> tuple[list[float], list[float], list[str]]:
    """A, B, A, B, ...: return the seconds of each side and notes (e.g. stopped for time).

    ``run_a``/``run_b`` return wall seconds, or ``(wall_s, cpu_s)``; the CPU seconds are kept in
    ``ctx.cpu[name] = (a_cpu, b_cpu)`` for ``ratio_stats``. After ``min_pairs`` pairs a figure stops
    early when the next pair would not fit in the run's time budget (noted in the result)."""
    pairs = pairs or ctx.pairs
    a: list[float] = []
    b: list[float] = []
    a_cpu: list[float] = []
    b_cpu: list[float] = []
    ctx.cpu[name] = (a_cpu, b_cpu)
    notes: list[str] = []

    def take(value: Any, wall: list[float], cpu: list[float]) -> None:
        if isinstance(value, tuple):
            wall.append(float(value[0]))
            cpu.append(float(value[1]))
        else:
            wall.append(float(value))

    for i in range(pairs):
        pair_started = time.monotonic()
        take(run_a(i), a, a_cpu)
        take(run_b(i), b, b_cpu)
        took = time.monotonic() - pair_started
        cpu_text = f", CPU A/B {a_cpu[-1] / b_cpu[-1]:.3f}" if a_cpu and b_cpu and len(b_cpu) == len(b) and b_cpu[-1] else ""
        log(f"{name}: pair {i + 1}/{pairs}: A {a[-1]:.3f} s, B {b[-1]:.3f} s, A/B {a[-1] / b[-1]:.3f}{cpu_text}")
        if i + 1 < pairs and i + 1 >= min(min_pairs, pairs) and ctx.left() < took * 1.2:
            notes.append(f"stopped after {i + 1} of {pairs} pairs: the next pair ({took:.0f} s) would "
                         f"exceed the bench's time budget ({ctx.budget_s:.0f} s)")
            break
    return a, b, notes


# --------------------------------------------------------------------------------------------
# orchestration_overhead_ratio


def _utc(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp).replace(tzinfo=dt.timezone.utc).timestamp()


def fresh_home(parent: Path, name: str) -> Path:
    """A TFPIPE_HOME holding only a copy of the digits CSV (as tests/conftest.py makes)."""
    source = REPO / ".demo" / "data" / "digits" / "digits.csv"
    if not source.exists():
        raise BenchError(f"{source} is missing: run `make data`")
    home = parent / name
    (home / "data" / "digits").mkdir(parents=True)
    shutil.copy(source, home / "data" / "digits" / "digits.csv")
    return home


def pipeline_config_of(dag_file: Path, home: Path):
    """The PipelineConfig a tfpipe DAG file builds (with TFPIPE_HOME=home), without Airflow."""
    import tfpipe
    from tfpipe.config import PipelineConfig

    captured: dict[str, Any] = {}

    def capture(cfg, **_kwargs):
        captured["cfg"] = cfg if isinstance(cfg, PipelineConfig) else PipelineConfig.from_dict(cfg)

    saved_home = os.environ.get("TFPIPE_HOME")
    had = "training_pipeline" in tfpipe.__dict__
    saved = tfpipe.__dict__.get("training_pipeline")
    tfpipe.training_pipeline = capture
    os.environ["TFPIPE_HOME"] = str(home)
    try:
        runpy.run_path(str(dag_file), run_name="bench_dag_config")
    finally:
        if had:
            tfpipe.training_pipeline = saved
        else:
            del tfpipe.training_pipeline
        if saved_home is None:
            os.environ.pop("TFPIPE_HOME", None)
        else:
            os.environ["TFPIPE_HOME"] = saved_home
    if "cfg" not in captured:
        raise BenchError(f"{dag_file} did not call training_pipeline()")
    return captured["cfg"]


def host_path(cfg, container_path: str) -> Path:
    from tfpipe import contract

    for prefix, source in ((contract.CONTAINER_DATA, cfg.volumes.data), (contract.CONTAINER_WORK, cfg.volumes.work),
                           (contract.CONTAINER_MODELS, cfg.volumes.models)):
        if container_path == prefix or container_path.startswith(prefix + "/"):
            return Path(source + container_path[len(prefix):])
    raise BenchError(f"{container_path} is on no volume")


def stage_docker_args(spec, config: dict[str, Any], cfg=None) -> list[str]:
    """The `docker run` options equivalent to what the stage operator gives its container."""
    from tfpipe import contract

    private = dict(getattr(getattr(cfg, "resources", None), "private_environment", None) or {})

    args = ["--user", spec.user, "--network", spec.network_mode]
    if spec.shm_size:
        args += ["--shm-size", spec.shm_size]
    if spec.mem_limit:
        args += ["--memory", spec.mem_limit]
    if spec.cpus:
        args += ["--cpus", str(spec.cpus)]
    for mount in spec.mounts:
        args += ["--mount", f"type=bind,source={mount.source},target={mount.target}"
                 + (",readonly" if mount.read_only else "")]
    for key, value in {**spec.environment, **private, contract.CONFIG_ENV: contract.dumps(config)}.items():
        args += ["-e", f"{key}={value}"]
    return args


def orchestration(ctx: Context) -> dict[str, Any]:
    from tfpipe import contract
    from tfpipe.specs import plan_pipeline
    from tfpipe.tries import TryIdentity, resolve_try

    dag_id = "tfpipe_digits"
    dag_file = REPO / "dags" / f"{dag_id}.py"
    logfile = LOGS / "orchestration_overhead_ratio.log"
    parent = ctx.tmp / "orchestration"
    parent.mkdir()
    startup: list[float] = []
    first_task_api: list[float] = []
    tail: list[float] = []
    task_seconds: dict[str, list[float]] = {}
    stage_seconds: dict[str, list[float]] = {}

    def airflow_run(i: int) -> float:
        home = fresh_home(parent, f"airflow-{i}")
        env = {**os.environ, "TFPIPE_HOME": str(home), "TFPIPE_IMAGE": ctx.image, "PYTHONUNBUFFERED": "1"}
        env["PATH"] = f"{Path(ctx.python).parent}:{env.get('PATH', '')}"
        cmd = [ctx.python, "-m", "tfpipe.cli", "run", dag_id]
        started_wall = time.time()
        started = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
        seconds = time.perf_counter() - started
        tfpipe_run_summary(proc, cmd, dag_id, home, logfile)
        stamp = r"^(\d{4}-\d\d-\d\dT[\d:.]+)Z? "
        events = [(m.group(2), m.group(3), _utc(m.group(1))) for m in re.finditer(
            stamp + r".*\[DAG TEST\] (starting|end) task(?: task)?_id=(\w+)", proc.stderr, re.M)]
        running = re.search(stamp + r".*\[DAG TEST\] running task", proc.stderr, re.M)
        started_api = re.search(stamp + r".*\] Task started ", proc.stderr, re.M)
        if events:
            startup.append(events[0][2] - started_wall)
            begun: dict[str, float] = {}
            for kind, task, t in events:
                if kind == "starting":
                    begun[task] = t
                elif task in begun:
                    task_seconds.setdefault(task, []).append(t - begun[task])
            tail.append(started_wall + seconds - events[-1][2])
        if running and started_api:
            first_task_api.append(_utc(started_api.group(1)) - _utc(running.group(1)))
        shutil.rmtree(home, ignore_errors=True)
        return seconds

    def plain_run(i: int) -> float:
        home = fresh_home(parent, f"plain-{i}")
        cfg = pipeline_config_of(dag_file, home)
        run_id = f"bench__plain_{ctx.session}_{i}"
        stages = []
        for spec in plan_pipeline(cfg):  # configs and directories first: outside the timed span
            plan = resolve_try(spec, TryIdentity(cfg.dag_id, run_id, spec.task_id))
            config = plan.config
            make_dirs(*(host_path(cfg, d) for d in plan.writable_dirs))
            cmd = ["docker", "run", "--rm", *ctx.docker_run_args(f"plain-{spec.stage}"),
                   *stage_docker_args(spec, config, cfg), spec.image, *spec.command]
            stages.append((spec.stage, cmd))
        started = time.perf_counter()
        for stage, cmd in stages:
            stage_started = time.perf_counter()
            with open(logfile, "a") as handle:
                handle.write(f"\n$ docker run ... {stage} (TFPIPE_HOME={home})\n")
                handle.flush()
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=handle, text=True, timeout=600)
                handle.write(proc.stdout)
            stage_seconds.setdefault(stage, []).append(time.perf_counter() - stage_started)
            if proc.returncode == contract.ExitCode.NOT_BLESSED and stage == "evaluate":
                break  # as Airflow does: export is skipped
            if proc.returncode != 0 or contract.parse_result_line(proc.stdout.splitlines()) is None:
                raise BenchError(f"plain docker run of {stage} exited {proc.returncode} (see {logfile})")
        seconds = time.perf_counter() - started
        shutil.rmtree(home, ignore_errors=True)
        return seconds

    a, b, notes = interleave(ctx, "orchestration_overhead_ratio", airflow_run, plain_run)
    stats = ratio_stats(a, b)
    stats["notes"] = notes
    stats["b_stage_median_s"] = {s: round(median(v), 2) for s, v in stage_seconds.items()}
    stats["a_task_median_s"] = {t: round(median(v), 2) for t, v in task_seconds.items()}
    if startup and task_seconds:
        start, end = median(startup), median(tail)
        api = median(first_task_api) if first_task_api else 0.0
        stages = stats["b_stage_median_s"]
        tasks = stats["a_task_median_s"]
        other = {t: v for t, v in tasks.items() if t not in stages}
        first = next(iter(tasks))
        per_stage = [tasks[t] - stages[t] for t in stages if t in tasks]
        between = max(0.0, stats["a_median_s"] - start - sum(tasks.values()) - end)
        stats.update(a_startup_median_s=round(start, 2), a_first_task_api_start_s=round(api, 2),
                     a_exit_median_s=round(end, 2))
        parts = [f"{start:.1f} s before the first task (interpreter, Airflow and provider imports, DagBag "
                 f"parse, metadata DB writes)",
                 f"{api:.1f} s for dag.test's in-process execution API to start, paid by the first task "
                 f"({first})"]
        if other:
            parts.append("the tasks without a stage container take " + ", ".join(
                f"{t} {v - (api if t == first else 0):.1f} s" for t, v in other.items())
                + (" (after the API start)" if first in other else ""))
        if per_stage:
            parts.append(f"each stage task takes about {median(per_stage):.1f} s more than its plain "
                         f"`docker run` (task runner, state and XCom through the execution API, docker-py, the "
                         f"helper container preparing the volume directories)")
        parts.append(f"{between:.1f} s between tasks and {end:.1f} s after the last one (scheduling loop, "
                     f"summary, interpreter exit)")
        stats["why"] = (f"A-B = {stats['a_median_s'] - stats['b_median_s']:.1f} s per run: " + "; ".join(parts)
                        + f". Plain docker run of the 4 stages: {stats['b_median_s']:.1f} s")
    return stats


# --------------------------------------------------------------------------------------------
# input_pipeline_ratio, checkpoint_overhead_ratio (in-image)


def input_pipeline(ctx: Context) -> dict[str, Any]:
    root = ctx.images_root()
    result = ctx.in_image("input_pipeline.py", ["--pairs", str(ctx.pairs), "--epochs", "2", "--uncached"],
                          logfile=LOGS / "input_pipeline_ratio.log", timeout=900, mount_root=root)
    stats = ratio_stats(result["a"], result["b"], result["a_cpu"], result["b_cpu"])
    if result.get("c"):
        uncached = ratio_stats(result["c"], result["b"])
        stats["uncached_ratio"] = uncached["ratio"]
        stats["uncached_note"] = ("C/B with training.cache false (TFRecords re-read and parsed every epoch): "
                                  f"median {uncached['ratio']}, min {uncached['min']}, max {uncached['max']}")
    stats["info"] = (f"{stats['a_median_s'] * 1000:.0f} vs {stats['b_median_s'] * 1000:.0f} ms per step (cnn, batch "
                     f"{result['batch_size']}, {result['image_shape']} uint8, {result['steps_per_loop']} steps per "
                     f"compiled call); process CPU time A/B "
                     f"{stats['cpu_ratio']}" + (f"; {stats['uncached_note']}" if "uncached_note" in stats else ""))
    alone = result["pipeline_alone_s_per_batch"]
    stats["pipeline_alone_ms_per_batch"] = round(alone * 1000, 2)
    share = f"the pipeline alone makes a batch in {alone * 1000:.1f} ms ({alone / stats['b_median_s'] * 100:.0f}% of a step)"
    if stats["cpu_ratio"] <= 1.10:
        # Same CPU, more wall time: A waited. A shared VM's swings do that (pairs straddling them
        # spread widely), and so did a feed that training no longer used (bench/NOTES.md,
        # 2026-12-04 15:20): the per-pair spread tells the two apart.
        stats["why"] = (f"{share} and the process CPU time A/B is {stats['cpu_ratio']}: A spent no more CPU, it "
                        f"waited; on a shared 2-core machine a step takes about twice as long while another process "
                        f"holds a core, so pairs that straddle such a change swing widely (per pair "
                        f"{stats['min']}-{stats['max']}); a steady excess in every pair is a wait in the feed itself. "
                        f"Rerun with `--only input_pipeline_ratio --pairs 10` on a quiet machine")
    else:
        stats["why"] = (f"{share}; the process CPU time A/B is {stats['cpu_ratio']}: feeding from tf.data costs CPU "
                        f"that a 2-core machine takes from the training step's threads")
    stats.update(unit=result["unit"], batch_size=result["batch_size"], image_shape=result["image_shape"],
                 steps_per_epoch=result["steps_per_epoch"], epochs_per_sample=result["epochs_per_sample"],
                 steps_per_loop=result["steps_per_loop"], calls_per_epoch=result["calls_per_epoch"], model="cnn")
    return stats


def checkpoint_overhead(ctx: Context) -> dict[str, Any]:
    root = ctx.images_root()
    result = ctx.in_image("checkpoint_overhead.py", ["--pairs", str(ctx.pairs), "--epochs", "2", "--every", "20"],
                          logfile=LOGS / "checkpoint_overhead_ratio.log", timeout=900, mount_root=root)
    stats = ratio_stats(result["a"], result["b"], result["a_cpu"], result["b_cpu"])
    direct = result["saves_per_run"] * result["ms_per_save"] / 1000.0 / stats["b_median_s"]
    stats.update(unit=result["unit"], steps=result["steps"], steps_per_epoch=result["steps_per_epoch"],
                 checkpoint_every_steps=result["checkpoint_every_steps"], saves_per_run=result["saves_per_run"],
                 ms_per_save=result["ms_per_save"], model="cnn",
                 direct_estimate=round(1 + direct, 4),
                 direct_note=(f"{result['saves_per_run']} saves x {result['ms_per_save']} ms = "
                              f"{direct * 100:.1f}% of the median run without checkpoints"))
    stats["info"] = stats["why"] = (
        f"measured directly, {stats['direct_note']} (ratio {stats['direct_estimate']}); the wall-time pairs "
        f"spread {stats['min']}-{stats['max']} on this shared machine; process CPU time A/B {stats['cpu_ratio']}")
    return stats


# --------------------------------------------------------------------------------------------
# resume_cost_ratio


RESUME_EPOCHS = 8
#: The uninterrupted run must take at least this long; the calibration run scales the epochs up if not.
RESUME_MIN_JOB_S = 60.0


def resume_cost(ctx: Context) -> dict[str, Any]:
    from tfpipe.config import PipelineConfig
    from tfpipe.specs import plan_pipeline
    from tfpipe.tries import TryIdentity, resolve_try

    root = ctx.images_root()
    logfile = LOGS / "resume_cost_ratio.log"

    def plan(epochs: int):
        cfg = PipelineConfig.from_dict({
            "dag_id": "bench_resume",
            "image": {"ref": ctx.image},
            "volumes": {"data": str(root / "data"), "work": str(root / "work"), "models": str(root / "models")},
            "data": {"path": "images", "format": "images", "image_size": [64, 64], "channels": 3,
                     "eval_fraction": 0.2, "shard_size": 250},
            "training": {"model": "cnn", "epochs": epochs, "batch_size": 32, "checkpoint_every_steps": 20},
            "export": {"model_name": "bench_resume"},
        })
        return cfg, next(s for s in plan_pipeline(cfg) if s.stage == "train")

    epochs = RESUME_EPOCHS
    cfg, spec = plan(epochs)
    prep_pointer = root / "work" / "runs" / "bench" / "prep" / "dataset.json"
    if not prep_pointer.exists():
        raise BenchError(f"{prep_pointer} is missing: the image data set was not prepared")
    kills: list[dict[str, Any]] = []

    def start(run_id: str, try_number: int) -> tuple[subprocess.Popen, str, Path, float]:
        try_plan = resolve_try(spec, TryIdentity(cfg.dag_id, run_id, "train", try_number))
        config = try_plan.config
        run_dir = host_path(cfg, config["paths"]["run_dir"])
        if try_number == 1:  # the run's prep output and directories: prepared beforehand, untimed
            make_dirs(*(host_path(cfg, d) for d in try_plan.writable_dirs), root / "models")
            shutil.copy(prep_pointer, run_dir / "dataset.json")
            os.chown(run_dir / "dataset.json", *UID_GID)
        args = ctx.docker_run_args("resume")
        name = args[1]
        cmd = ["docker", "run", "--rm", *args, *stage_docker_args(spec, config), spec.image, *spec.command]
        handle = open(logfile, "a")
        handle.write(f"\n$ docker run ... train ({run_id}, try {try_number})\n")
        handle.flush()
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT)
        proc._bench_log = handle  # type: ignore[attr-defined]
        return proc, name, run_dir, started

    # a 60 s job ran 10 times as long on a shared 2-core machine at a load of 12
    def finish(proc: subprocess.Popen, name: str, timeout: float = 1800) -> int:
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired as err:
            subprocess.run(["docker", "rm", "-f", name], capture_output=True)
            proc.wait()
            raise BenchError(f"the train container {name} ran over {timeout:.0f} s (see {logfile})") from err
        finally:
            proc._bench_log.close()  # type: ignore[attr-defined]

    def checkpoint_times(run_dir: Path) -> list[tuple[int, float]]:
        """(step, wall time written) of every checkpoint of the run, oldest first."""
        found = []
        for index in (run_dir / "train" / "checkpoints").glob("ckpt-*.index"):
            try:
                found.append((int(index.name[len("ckpt-"):-len(".index")]), index.stat().st_mtime))
            except (OSError, ValueError):
                pass
        return sorted(found)

    def step_at(run_dir: Path, when: float, started: float) -> float:
        """The step training had reached at wall time ``when``: the newest checkpoint written before
        it, plus the steps the measured pace of this try (steps between checkpoints / seconds) makes
        in the time since. Checkpoints are the only per-step record a killed try leaves."""
        saved = [(step, t) for step, t in checkpoint_times(run_dir) if t <= when]
        if not saved:
            return 0.0
        last_step, last_t = saved[-1]
        if len(saved) >= 2:
            first_step, first_t = saved[0]
            pace = (last_step - first_step) / max(last_t - first_t, 1e-6)
        else:
            pace = last_step / max(last_t - started, 1e-6)  # includes start-up: a low estimate
        return last_step + pace * max(0.0, when - last_t)

    calibration: list[float] = []
    #: (seconds from container start to step 0, steps per second) of each uninterrupted run
    paces: list[tuple[float, float]] = []

    def pace_of(run_dir: Path, started_wall: float) -> tuple[float, float] | None:
        """(start-up seconds, steps/s) of a finished try, from its checkpoints' write times."""
        saved = checkpoint_times(run_dir)
        if len(saved) < 2:
            return None
        (s0, t0), (s1, t1) = saved[0], saved[-1]
        pace = (s1 - s0) / max(t1 - t0, 1e-6)
        return max(0.0, t0 - started_wall - s0 / pace), pace

    def kill_at_step(proc: subprocess.Popen, run_dir: Path, started_wall: float, target: float) -> None:
        """Return once training is at step ``target`` (or the container ended): before the first
        checkpoint by the uninterrupted runs' start-up and pace, after it by this try's own newest
        checkpoint and its pace between checkpoints, so the moment follows the run's progress
        whatever the machine's load does to its speed."""
        startup, pace = (median([p[0] for p in paces]), median([p[1] for p in paces]))
        while proc.poll() is None:
            saved = checkpoint_times(run_dir)
            if saved and saved[-1][0] > target:  # already past it (a checkpoint seen late)
                return
            before = [(s, w) for s, w in saved if s <= target]
            if before and len(saved) >= 2:
                (s0, t0), (s1, t1) = saved[0], saved[-1]
                pace = (s1 - s0) / max(t1 - t0, 1e-6) if s1 > s0 else pace
            step, when = before[-1] if before else (0, started_wall + startup)
            if time.time() >= when + (target - step) / pace:
                return
            time.sleep(0.01)

    def interrupted(i: int) -> tuple[float, float]:
        run_id = f"bench__resume_{ctx.session}_{i}"
        # A kill at a random step, drawn uniformly over the run's steps with a fixed seed per pair:
        # kills land before the first checkpoint, between checkpoints and right after one, as
        # crashes do. The moment follows the try's own progress (see kill_at_step).
        fraction = random.Random(f"resume_cost_ratio/{i}").random()
        target = fraction * total_steps[0]
        cpu_started = machine_cpu_s()
        proc, name, run_dir, started = start(run_id, 1)
        wall_started = time.time()
        kill_at_step(proc, run_dir, wall_started, target)
        killed_wall = time.time()
        if proc.poll() is None:
            subprocess.run(["docker", "kill", name], capture_output=True)
        code = finish(proc, name)
        kill_to_exit = time.time() - killed_wall
        first = time.perf_counter() - started
        entry: dict[str, Any] = {"kill_fraction": round(fraction, 3), "kill_target_step": round(target, 1),
                                 "killed_after_s": round(killed_wall - wall_started, 2), "first_try_s": round(first, 2)}
        if code == 0:  # it finished before the drawn moment: nothing to resume, nothing lost
            entry.update(killed=False, steps_redone=0, second_try_s=0.0)
            kills.append(entry)
            return first, machine_cpu_s() - cpu_started
        reached = step_at(run_dir, killed_wall, wall_started)
        launched = time.time()
        proc, name, _, started = start(run_id, 2)
        code = finish(proc, name)
        second = time.perf_counter() - started
        if code != 0:
            raise BenchError(f"try 2 of {run_id} (the resume) exited {code} (see {logfile})")
        attempts = json.loads((run_dir / "attempts.json").read_text())
        resumed = (attempts[-1].get("resumed_from") or {}).get("step") or 0  # 0: killed before any checkpoint
        redone = max(0.0, reached - resumed)
        entry.update(killed=True, killed_at_step=round(reached, 1), resumed_from_step=resumed,
                     steps_redone=round(redone, 1), target_steps=attempts[-1]["target_steps"],
                     second_try_s=round(second, 2), kill_to_exit_s=round(kill_to_exit, 2),
                     steps_redone_s=round(redone / median([p[1] for p in paces]), 2),
                     second_try_startup_s=resume_breakdown.try_startup(run_dir, launched))
        kills.append(entry)
        return first + second, machine_cpu_s() - cpu_started

    #: the job's steps, read from an uninterrupted run's attempt record
    total_steps: list[int] = [0]

    b_seconds: list[float] = []

    #: start-up phases of each timed uninterrupted run (what the resumed try pays once more)
    b_startups: list[dict[str, float]] = []

    def uninterrupted(i: int) -> tuple[float, float]:
        cpu_started = machine_cpu_s()
        launched = time.time()
        proc, name, run_dir, started = start(f"bench__straight_{ctx.session}_{i}", 1)
        wall_started = time.time()
        code = finish(proc, name)
        seconds = time.perf_counter() - started
        cpu = machine_cpu_s() - cpu_started
        if code != 0:
            raise BenchError(f"the uninterrupted training run exited {code} (see {logfile})")
        b_seconds.append(seconds)
        measured = pace_of(run_dir, wall_started)
        if measured:
            paces.append(measured)
        total_steps[0] = json.loads((run_dir / "attempts.json").read_text())[-1]["target_steps"]
        if i >= 0:
            b_startups.append(resume_breakdown.try_startup(run_dir, launched))
        return seconds, cpu

    # one untimed uninterrupted run first: the length over which pair 1's kill moment is drawn,
    # and the check that the job is long enough (more epochs, and once more, if it is not)
    calibration.append(uninterrupted(-1)[0])
    # Checked again after each scaling: a first run slowed by a cold start (45 s for 8 epochs
    # where 14 epochs then took 44 s) scaled the job too little, and the timed jobs ran under 60 s.
    for round_ in range(2, 5):
        if calibration[-1] >= RESUME_MIN_JOB_S:
            break
        # a margin of 1.3: with 1.15, the timed runs of one make bench came out at 57 s (median)
        epochs = int(epochs * RESUME_MIN_JOB_S * 1.3 / calibration[-1]) + 1
        log(f"resume_cost_ratio: {calibration[-1]:.0f} s is under {RESUME_MIN_JOB_S:.0f} s: {epochs} epochs")
        cfg, spec = plan(epochs)
        paces.clear()
        calibration[:] = [uninterrupted(-round_)[0]]
    if not paces:
        raise BenchError(f"the calibration run left fewer than two checkpoints (see {logfile})")
    b_seconds.clear()
    a, b, notes = interleave(ctx, "resume_cost_ratio", interrupted, uninterrupted)
    stats = ratio_stats(a, b, *ctx.cpu["resume_cost_ratio"])
    if median(b) < RESUME_MIN_JOB_S:
        notes.append(f"the uninterrupted job took {median(b):.0f} s (median), under {RESUME_MIN_JOB_S:.0f} s")
    stats["notes"] = notes
    stats["tries"] = kills
    lost = [x - y for x, y in zip(a, b)]
    redone = [k["steps_redone"] for k in kills]
    stats["seconds_lost_median"] = round(median(lost), 2)
    stats["seconds_lost"] = [round(x, 2) for x in lost]
    stats["steps_redone_median"] = round(median(redone), 1)
    stats["steps_redone"] = redone
    stats["restart_cost_s"] = stats["seconds_lost_median"]
    breakdown = resume_breakdown.summarize(kills, lost)
    stats["restart_breakdown_s"] = breakdown
    stats["uninterrupted_startup_s"] = {
        key: round(median([s[key] for s in b_startups if key in s]), 2)
        for key in ("container", *resume_breakdown.STAGE_PHASES) if any(key in s for s in b_startups)}
    stats["epochs"] = epochs
    stats["workload"] = (f"cnn on 957 synthetic 64x64 RGB images, batch 32, {epochs} epochs x 30 steps, "
                         "checkpoint every 20 steps and every epoch; try 1 killed (docker kill, SIGKILL) at a "
                         "step drawn uniformly over the run's steps (seed fixed per pair), the moment following "
                         "the try's own checkpoints and pace; then try 2 resumes")
    stats["info"] = stats["why"] = (
        f"a kill at a random moment costs {median(lost):.1f} s (median of A-B; per pair "
        f"{', '.join(f'{x:.1f}' for x in lost)} s) and {median(redone):.0f} steps redone (median; per pair "
        f"{', '.join(f'{x:.0f}' for x in redone)}; the step at the kill is the newest checkpoint plus the pace "
        f"measured between this try's checkpoints): a second container start, TensorFlow import, set-up and "
        f"tracing, plus the steps since the last checkpoint (at most 20 here); machine CPU time A/B "
        f"{stats.get('cpu_ratio')}, uninterrupted job {stats['b_median_s']:.0f} s ({epochs} epochs)"
        + (f"; where the seconds lost go (medians, from the resumed try's own start-up record): "
           f"{resume_breakdown.describe(breakdown)}" if breakdown else ""))
    return stats


# --------------------------------------------------------------------------------------------
# rss_drift_ratio

RSS_EPOCHS = 30
RSS_BATCH = 64


def rss_drift(ctx: Context) -> dict[str, Any]:
    """Peak RSS of the train container at the last epoch / at epoch 2, with and without jemalloc.

    The train stage records its own peak RSS per epoch (VmHWM, reset at each epoch start) in
    metrics.json; both runs are the real stage container as the operator configures it, the
    second with ``resources.jemalloc: false``. They run side by side, so machine load hits both."""
    from tfpipe.config import PipelineConfig
    from tfpipe.specs import config_template, plan_pipeline, resolve_stage_config, writable_dirs

    root = ctx.images_root()
    logfile = LOGS / "rss_drift_ratio.log"
    prep_pointer = root / "work" / "runs" / "bench" / "prep" / "dataset.json"
    if not prep_pointer.exists():
        raise BenchError(f"{prep_pointer} is missing: the image data set was not prepared")
    runs: dict[str, tuple[subprocess.Popen, str, Path, Any]] = {}
    started = time.perf_counter()
    for label, jemalloc in (("jemalloc", True), ("glibc", False)):
        cfg = PipelineConfig.from_dict({
            "dag_id": "bench_rss",
            "image": {"ref": ctx.image},
            "volumes": {"data": str(root / "data"), "work": str(root / "work"), "models": str(root / "models")},
            "data": {"path": "images", "format": "images", "image_size": [64, 64], "channels": 3,
                     "eval_fraction": 0.2, "shard_size": 250},
            "training": {"model": "cnn", "epochs": RSS_EPOCHS, "batch_size": RSS_BATCH,
                         "checkpoint_every_steps": 10000, "keep_checkpoints": 1},
            "export": {"model_name": "bench_rss"},
            "resources": {"jemalloc": jemalloc},
        })
        spec = next(s for s in plan_pipeline(cfg) if s.stage == "train")
        run_id = f"bench__rss_{label}_{ctx.session}"
        config = resolve_stage_config(config_template(cfg, "train"), dag_id=cfg.dag_id, run_id=run_id,
                                      task_id="train", try_number=1, image=ctx.image)
        run_dir = host_path(cfg, config["paths"]["run_dir"])
        make_dirs(*(host_path(cfg, d) for d in writable_dirs("train", cfg, config["paths"]["run_dir"])), root / "models")
        shutil.copy(prep_pointer, run_dir / "dataset.json")
        os.chown(run_dir / "dataset.json", *UID_GID)
        args = ctx.docker_run_args(f"rss-{label}")
        cmd = ["docker", "run", "--rm", *args, *stage_docker_args(spec, config, cfg), spec.image, *spec.command]
        handle = open(LOGS / f"rss_drift_ratio.{label}.log", "w")
        log(f"rss_drift_ratio: {RSS_EPOCHS} epochs of cnn with {label} malloc")
        runs[label] = (subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT), args[1], run_dir, handle)
    curves: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    for label, (proc, name, run_dir, handle) in runs.items():
        try:
            code = proc.wait(timeout=max(60.0, ctx.left()))
        except subprocess.TimeoutExpired as err:
            for _, other, _, _ in runs.values():
                subprocess.run(["docker", "rm", "-f", other], capture_output=True)
            raise BenchError(f"the {label} train container ran past the bench's time budget (see {logfile})") from err
        finally:
            handle.close()
        seconds[label] = round(time.perf_counter() - started, 1)
        if code != 0:
            raise BenchError(f"the {label} train container exited {code} (see {LOGS}/rss_drift_ratio.{label}.log)")
        history = json.loads((run_dir / "metrics.json").read_text())
        curves[label] = [h.get("rss_peak_mb") for h in history]
        if len(curves[label]) != RSS_EPOCHS or not all(curves[label]):
            raise BenchError(f"{run_dir}/metrics.json has no per-epoch rss_peak_mb for all {RSS_EPOCHS} epochs")
    drift = {k: round(v[-1] / v[1], 4) for k, v in curves.items()}
    stats: dict[str, Any] = {
        "ratio": drift["jemalloc"], "min": drift["jemalloc"], "max": drift["jemalloc"], "pairs": 1,
        "without_jemalloc_ratio": drift["glibc"],
        "rss_mb_epoch2": {k: v[1] for k, v in curves.items()},
        "rss_mb_last": {k: v[-1] for k, v in curves.items()},
        "rss_mb_per_epoch": curves, "run_seconds": seconds,
        "workload": (f"train stage container, cnn on 957 synthetic 64x64 RGB images, batch {RSS_BATCH}, "
                     f"{RSS_EPOCHS} epochs, checkpoints at epoch ends; peak RSS per epoch from VmHWM reset at "
                     "each epoch start; the jemalloc and glibc containers run side by side"),
    }
    stats["info"] = stats["why"] = (
        f"peak RSS last epoch / epoch 2: {drift['jemalloc']} with jemalloc "
        f"({curves['jemalloc'][1]:.0f} -> {curves['jemalloc'][-1]:.0f} MiB), {drift['glibc']} with glibc malloc "
        f"({curves['glibc'][1]:.0f} -> {curves['glibc'][-1]:.0f} MiB); one run of each")
    return stats


# --------------------------------------------------------------------------------------------
# image_rebuild_ratio

DOCKER_SHIM = """#!/bin/sh
# bench: a cold build: every `docker build` of build-image.sh runs with --no-cache
if [ "$1" = build ]; then shift; exec {docker} build --no-cache "$@"; fi
exec {docker} "$@"
"""


def image_rebuild(ctx: Context) -> dict[str, Any]:
    logfile = LOGS / "image_rebuild_ratio.log"
    work = ctx.tmp / "image"
    work.mkdir()
    # Which root the project's image uses (never rebuilt here: no pull, no debootstrap).
    proc = subprocess.run([str(REPO / "docker" / "build-image.sh")], capture_output=True, text=True, timeout=900)
    with open(logfile, "a") as handle:
        handle.write(f"\n$ docker/build-image.sh (the project's image)\n{proc.stderr}{proc.stdout}")
    if proc.returncode != 0:
        raise BenchError(f"docker/build-image.sh failed (see {logfile})")
    match = re.search(r"\] root: (offline|\S+)", proc.stderr)
    if not match:
        raise BenchError(f"cannot tell the root image from build-image.sh's output (see {logfile})")
    root_choice = match.group(1)
    project_cache = Path(os.environ.get("TFPIPE_CACHE") or REPO / ".cache")
    wheelhouses = sorted(project_cache.glob("wheelhouse-py*"))
    docker = shutil.which("docker")
    shim = work / "shim"
    shim.mkdir()
    (shim / "docker").write_text(DOCKER_SHIM.format(docker=docker))
    (shim / "docker").chmod(0o755)
    def copy_tree(name: str) -> Path:
        tree = work / name
        shutil.copytree(REPO / "docker", tree / "docker")
        shutil.copytree(REPO / "trainer", tree / "trainer",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        return tree

    def build(tree: Path, cache: Path, *, cold: bool) -> tuple[float, str]:
        env = {**os.environ, "TFPIPE_CACHE": str(cache), "TFPIPE_ROOT_IMAGE": root_choice}
        if cold:
            env["PATH"] = f"{shim}:{env['PATH']}"
            if wheelhouses:  # the wheels are downloaded already: no network, as on a dev machine
                env["PIP_NO_INDEX"] = "1"
                env["PIP_FIND_LINKS"] = str(cache / wheelhouses[-1].name)
        cmd = [str(tree / "docker" / "build-image.sh")]
        started = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        except subprocess.TimeoutExpired as err:
            raise BenchError(f"{'cold' if cold else 'code-only'} build ran over 900 s") from err
        seconds = time.perf_counter() - started
        # The images this build made (fresh content tags, never the project's): removed right away.
        made = re.findall(r"(?:deps|trainer): docker build (\S+)", proc.stderr)
        if made:
            subprocess.run(["docker", "rmi", *reversed(made)], capture_output=True)  # children first
        with open(logfile, "a") as handle:
            handle.write(f"\n$ {cmd[0]} ({'cold' if cold else 'code-only'}, {seconds:.1f} s; removed {made})\n"
                         f"{proc.stderr}{proc.stdout}")
        if proc.returncode != 0:
            raise BenchError(f"{'cold' if cold else 'code-only'} build failed (see {logfile})")
        deps = re.search(r"deps: docker build (\S+)", proc.stderr)
        if cold and not deps:
            raise BenchError(f"the cold build reused a deps image: not cold (see {logfile})")
        if not cold and deps:
            raise BenchError(f"the code-only build rebuilt the deps image: is the project's deps image missing? "
                             f"(see {logfile})")
        if "trainer: docker build" not in proc.stderr:
            raise BenchError(f"the build reused the trainer image: the change was not seen (see {logfile})")
        return seconds, proc.stdout.strip().splitlines()[-1]

    def code_only(i: int) -> float:
        tree = copy_tree(f"code-{i}")
        with open(tree / "trainer" / "__init__.py", "a") as handle:
            handle.write(f"# bench: code-only change {ctx.session}-{i}\n")
        seconds, _ = build(tree, work / f"cache-code-{i}", cold=False)
        shutil.rmtree(tree, ignore_errors=True)
        return seconds

    def cold_build(i: int) -> float:
        tree = copy_tree(f"cold-{i}")
        with open(tree / "docker" / "deps.Dockerfile", "a") as handle:
            handle.write(f"# bench: cold build {ctx.session}-{i}\n")  # a new deps tag, same recipe
        cache = work / f"cache-cold-{i}"
        cache.mkdir()
        for wheelhouse in wheelhouses:
            target = cache / wheelhouse.name
            target.mkdir()
            for wheel in wheelhouse.iterdir():
                try:
                    os.link(wheel, target / wheel.name)
                except OSError:
                    shutil.copy2(wheel, target / wheel.name)
        seconds, _ = build(tree, cache, cold=True)
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        return seconds

    # Cold builds are the slowest samples of the bench (about 5 minutes each): when the run's time budget
    # cannot take all pairs, fewer are run and the note says so (the margin to the target is wide).
    a, b, notes = interleave(ctx, "image_rebuild_ratio", code_only, cold_build, min_pairs=1)
    stats = ratio_stats(a, b)
    stats["notes"] = notes
    stats["root"] = root_choice
    stats["info"] = (f"code-only rebuild {stats['a_median_s']:.1f} s, cold deps + trainer build "
                     f"{stats['b_median_s']:.0f} s (root: {root_choice})")
    stats["method"] = ("A: build-image.sh on a copy of trainer/ + docker/ with a comment added to "
                       "trainer/__init__.py (deps image cached). B: the same script on a copy whose "
                       "deps.Dockerfile has an extra comment (a new deps tag) and whose `docker build`s run "
                       "with --no-cache: deps and trainer built from the existing root image, wheels from "
                       "the local wheelhouse (no download). Built images are removed after each sample.")
    return stats


# --------------------------------------------------------------------------------------------
# GPU section


def gpu_visible() -> str | None:
    """None when a GPU can be used from containers, else why not."""
    if not shutil.which("nvidia-smi"):
        return "no GPU visible: nvidia-smi is not installed"
    proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if proc.returncode != 0 or "GPU" not in proc.stdout:
        return f"no GPU visible: `nvidia-smi -L` failed ({(proc.stderr or proc.stdout).strip()[:200]})"
    runtimes = subprocess.run(["docker", "info", "--format", "{{json .Runtimes}}"], capture_output=True,
                              text=True).stdout
    if "nvidia" not in runtimes:
        return ("a GPU is visible but Docker has no nvidia runtime: install the NVIDIA Container Toolkit "
                "(`nvidia-ctk runtime configure --runtime=docker`, restart dockerd)")
    return None


def gpu_utilization_sampler(samples: list[float], stop: threading.Event, index: str = "0") -> None:
    while not stop.is_set():
        proc = subprocess.run(["nvidia-smi", "-i", index, "--query-gpu=utilization.gpu", "--format=csv"],
                              capture_output=True, text=True)
        for line in proc.stdout.splitlines()[1:]:  # first line: the csv header
            value = line.strip().rstrip("%").strip()
            if value.isdigit():
                samples.append(float(value))
        stop.wait(0.5)


def gpu_resnet50(ctx: Context) -> dict[str, Any]:
    why_not = gpu_visible()
    if why_not:
        return {"skipped": why_not}
    logfile = LOGS / "gpu_resnet50.log"
    batch = os.environ.get("BENCH_GPU_BATCH", "64")
    cmd = ["docker", "run", "--rm", *ctx.docker_run_args("gpu"), "--gpus", "device=0",
           "-v", f"{REPO}:/src:ro", "-w", "/src", "-e", "PYTHONPATH=/src:/opt/tfpipe/deps", "--shm-size", "1g",
           ctx.image, "python3", "bench/in_image/gpu_resnet50.py", "--batch-size", batch]
    utilization: dict[str, list[float]] = {}
    output: list[str] = []
    with open(logfile, "a") as handle:
        handle.write(f"\n$ {' '.join(cmd)}\n")
        handle.flush()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=handle, text=True, bufsize=1)
        stop: threading.Event | None = None
        thread: threading.Thread | None = None
        watchdog = threading.Timer(900, lambda: subprocess.run(["docker", "rm", "-f", cmd[4]], capture_output=True))
        watchdog.start()
        assert proc.stdout is not None
        for line in proc.stdout:
            handle.write(line)
            output.append(line)
            parts = line.split()
            if line.startswith("BENCH_STEADY start"):
                utilization[parts[2]] = []
                stop = threading.Event()
                thread = threading.Thread(target=gpu_utilization_sampler, args=(utilization[parts[2]], stop))
                thread.start()
            elif line.startswith("BENCH_STEADY end") and stop and thread:
                stop.set()
                thread.join()
                stop = thread = None
        if stop and thread:
            stop.set()
            thread.join()
        code = proc.wait()
        watchdog.cancel()
    result = parse_result("".join(output))
    if result is None:
        raise BenchError(f"gpu_resnet50.py exited {code} without a result (see {logfile})")
    if result.get("error"):
        return {"skipped": result["error"]}
    out: dict[str, Any] = {"model": "resnet50", "batch_size": result["batch_size"],
                           "image_size": result["image_size"], "gpus": result["gpus"]}
    for policy, values in result["policies"].items():
        samples = utilization.get(policy) or []
        out[f"{policy}_images_per_s"] = round(values["images_per_s"], 1)
        out[f"{policy}_gpu_util_pct"] = round(statistics.mean(samples), 1) if samples else None
    fp32, fp16 = out.get("float32_images_per_s"), out.get("mixed_float16_images_per_s")
    if fp32 and fp16:
        out["ratio"] = round(fp16 / fp32, 3)  # mixed precision speed-up (no target)
        out["ratio_is"] = "mixed_float16 images/s / float32 images/s"
    return out


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --------------------------------------------------------------------------------------------

sys.modules.setdefault("run", sys.modules[__name__])  # the figure modules import their helpers from here
from figures_provider import dag_parse, provider_cost  # noqa: E402
from figures_deployment import deployment_overhead  # noqa: E402

FIGURES = [
    Figure("dag_parse_ratio", 1.05,
           "exec time of dags/tfpipe_digits.py / the same DAG written by hand (bench/dags/handwritten_digits.py)",
           dag_parse),
    Figure("provider_cost_ratio", 1.05,
           "tfpipe run tfpipe_digits / the same 4 containers as hand-written DockerOperators (same CLI, dag.test)",
           provider_cost, min_seconds=300),
    Figure("input_pipeline_ratio", 1.10,
           "train step time fed by trainer.data's TFRecord pipeline / by in-memory tensors (cnn, 64x64, CPU)",
           input_pipeline),
    Figure("checkpoint_overhead_ratio", 1.05,
           "Loop.fit wall time with per-epoch + per-20-step checkpoints / with the save a no-op",
           checkpoint_overhead),
    Figure("orchestration_overhead_ratio", None,  # information: Airflow's own cost, not the provider's
           "tfpipe run tfpipe_digits through Airflow / the 4 stage containers by plain docker run",
           orchestration, min_seconds=60),
    Figure("resume_cost_ratio", 1.10,
           "train killed at a random moment + resumed (both tries' wall and machine CPU time) / one uninterrupted "
           "train container (60 s or more)",
           resume_cost, min_seconds=90),
    Figure("rss_drift_ratio", 1.05,
           "train container peak RSS at the last of 30 epochs / at epoch 2, with jemalloc (and without, for contrast)",
           rss_drift, min_seconds=180),
    Figure("image_rebuild_ratio", 0.1,
           "build-image.sh after a trainer-code change / cold deps + trainer build",
           image_rebuild, min_seconds=330),
    Figure("deployment_overhead_ratio", 1.05,
           "tfpipe_digits under make up's stack (REST trigger to success) / the same containers as 4 plain "
           "DockerOperators in that stack", deployment_overhead, min_seconds=600),
    Figure("gcs_stage_in_ratio", 1.00,
           "GcsStageInOperator of 500 objects (200 MB) from the GCS emulator into a volume / list + "
           "transfer_manager.download_many of the same objects (process workers); publish vs upload_many as info",
           gcs_stage_in, min_seconds=120),
    Figure("prep_rows_per_s", None,
           "trainer.prep on the digits CSV repeated to 1M rows / numpy.loadtxt + batched tf.io.serialize_tensor "
           "(rows/s of each, peak RSS; prep and one epoch at 20k, 200k and 1M rows)",
           lambda ctx: figures_prep.prep_speed(ctx, ratio_stats, LOGS), min_seconds=300),
    Figure("train_loop_ratio", 1.00,
           "the train stage's Loop.fit / Keras model.fit with steps_per_execution tuned (mlp on digits, cnn on "
           "64x64 images; same model, data, batch, epochs, validation, checkpoints), CPU time", train_loop,
           min_seconds=240, judged_on="cpu_ratio"),
    Figure("gpu_resnet50", None,
           "GPU only: ResNet-50 images/s, float32 and mixed_float16, GPU utilization in the steady state",
           gpu_resnet50, gpu=True),
]


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def verdict(entry: dict[str, Any]) -> str:
    if "error" in entry:
        return "ERROR"
    if "skipped" in entry:
        return "skipped"
    judged = entry.get(entry.get("judged_on", "ratio"))
    if entry.get("target") is None or judged is None:
        return "-"
    return "ok" if judged <= entry["target"] else "MISSED"


def judged_label(entry: dict[str, Any], show: Callable[[Any], str] = str) -> str:
    """The value a target was judged on, as the run prints it: ``ratio 1.0041`` or ``CPU ratio 1.0041``."""
    field = entry.get("judged_on", "ratio")
    return f"{'CPU ratio' if field == 'cpu_ratio' else 'ratio'} {show(entry.get(field))}"


def result_entry(figure: Figure, measured: dict[str, Any], *, seconds: float, image: str) -> dict[str, Any]:
    """A figure's ``results.json`` entry: the fields every figure has first, then its own details."""
    measured = dict(measured)
    return {"ratio": measured.pop("ratio", None), "min": measured.pop("min", None), "max": measured.pop("max", None),
            "pairs": measured.pop("pairs", None), "target": figure.target, "judged_on": figure.judged_on,
            **measured, "seconds": round(seconds, 1),
            "measured_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(), "image": image}


def table(results: dict[str, Any], names: list[str]) -> str:
    header = ["figure", "ratio", "min", "max", "CPU ratio", "CPU min", "CPU max", "pairs", "target", "result",
              "A median s", "B median s"]
    rows = []
    for name in names:
        e = results.get(name, {})
        target = f"<= {e['target']}" if e.get("target") is not None else "-"
        rows.append([name, fmt(e.get("ratio")), fmt(e.get("min")), fmt(e.get("max")), fmt(e.get("cpu_ratio")),
                     fmt(e.get("cpu_min")), fmt(e.get("cpu_max")), fmt(e.get("pairs")),
                     target, verdict(e), fmt(e.get("a_median_s")), fmt(e.get("b_median_s"))])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def explanations(results: dict[str, Any], names: list[str]) -> list[str]:
    out = []
    for name in names:
        e = results.get(name, {})
        if "error" in e:
            out.append(f"- `{name}`: not measured: {e['error']}")
        elif "skipped" in e:
            out.append(f"- `{name}`: skipped: {e['skipped']}")
        elif name == "gpu_resnet50":
            out.append(f"- `{name}`: float32 {e.get('float32_images_per_s')} images/s "
                       f"({e.get('float32_gpu_util_pct')}% GPU), mixed_float16 {e.get('mixed_float16_images_per_s')} "
                       f"images/s ({e.get('mixed_float16_gpu_util_pct')}% GPU), batch {e.get('batch_size')}")
        elif verdict(e) == "MISSED":
            out.append(f"- `{name}` misses its target ({judged_label(e)} > {e['target']}): "
                       f"{e.get('why', 'see results.json')}")
        if e.get("info") and not (verdict(e) == "MISSED" and e["info"] == e.get("why")):
            out.append(f"- `{name}`: {e['info']}")
        for note in e.get("notes") or []:
            out.append(f"- `{name}`: {note}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this figure (repeatable, or comma-separated); see --list")
    parser.add_argument("--pairs", type=int, default=5, help="A/B pairs per figure (default 5)")
    parser.add_argument("--budget", type=float, default=19 * 60,
                        help="seconds the whole run may take; figures stop adding pairs (after the minimum) "
                             "or are skipped when it is used up (default 1140)")
    parser.add_argument("--list", action="store_true", help="list the figures and exit")
    parser.add_argument("--keep-temp", action="store_true", help="keep the temporary directory (debugging)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results file (default bench/results.json)")
    args = parser.parse_args(argv)
    if args.list:
        for f in FIGURES:
            print(f"{f.name:30} target {fmt(f.target)}  {f.what}")
        return 0
    only = {n.strip() for item in args.only for n in item.split(",") if n.strip()}
    unknown = only - {f.name for f in FIGURES}
    if unknown:
        parser.error(f"unknown figure(s) {sorted(unknown)}; see --list")
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    figures = [f for f in FIGURES if not only or f.name in only]

    ctx = Context(args)

    def on_signal(signum, _frame):
        log(f"signal {signum}: cleaning up")
        ctx.cleanup()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log(f"image {ctx.image}, {args.pairs} pairs per figure, {len(figures)} figure(s), temp {ctx.tmp}, "
        f"logs {LOGS}")
    results: dict[str, Any] = {}
    if only and args.output.exists():  # a partial run updates the figures it ran
        try:
            results = json.loads(args.output.read_text())
        except ValueError:
            results = {}
    try:
        for figure in figures:
            started = time.monotonic()
            entry: dict[str, Any]
            if ctx.left() < figure.min_seconds and not figure.gpu:
                entry = {"error": f"only {ctx.left():.0f} s of the bench's time budget ({args.budget:.0f} s) "
                                  f"were left, the figure needs at least {figure.min_seconds:.0f} s"}
            else:
                log(f"--- {figure.name}: {figure.what}")
                try:
                    entry = figure.run(ctx)
                except BenchError as err:
                    entry = {"error": str(err)}
                except Exception as err:  # a bug in one figure must not stop the others
                    with open(LOGS / f"{figure.name}.log", "a") as handle:
                        traceback.print_exc(file=handle)
                    entry = {"error": f"{type(err).__name__}: {err} (traceback in {LOGS / (figure.name + '.log')})"}
            entry = result_entry(figure, entry, seconds=time.monotonic() - started, image=ctx.image)
            if entry.get("error"):
                log(f"{figure.name}: ERROR: {entry['error']}")
            else:
                log(f"{figure.name}: {judged_label(entry, fmt)} (target {fmt(figure.target)}) "
                    f"in {entry['seconds']:.0f} s")
            results[figure.name] = entry
            args.output.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")
    finally:
        ctx.cleanup()

    names = [f.name for f in figures]
    total = ctx.elapsed()
    print()
    print(table(results, names))
    print()
    print(f"total {total / 60:.1f} min on {os.cpu_count()} CPU(s) ({platform.machine()}), image {ctx.image}; "
          f"results in {args.output.relative_to(REPO) if args.output.is_relative_to(REPO) else args.output}")
    notes = explanations(results, names)
    gpu = results.get("gpu_resnet50", {}) if "gpu_resnet50" in names else {}
    gpu_text = f"GPU {', '.join(gpu.get('gpus') or ['?'])}" if gpu.get("ratio") else "no GPU"
    print()
    print("<!-- README fragment (Performance): paste below -->")
    print(textwrap.dedent(f"""\
        Speed targets are measured, never asserted in tests. `make bench` runs every figure as
        interleaved A/B pairs (A, B, A, B, ...) on one machine and reports the median of the per-pair
        ratios A/B; `bench/README.md` says what A and B are. Latest run: {dt.date.today().isoformat()},
        {os.cpu_count()} CPU cores, {gpu_text}, {args.pairs} pairs per figure, {total / 60:.1f} min in all
        (`make bench`; one figure: `.venv/bin/python bench/run.py --only NAME --pairs N`):
        """))
    print(table(results, names))
    if notes:
        print()
        print("\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
