"""The bench's harness: interleaved A/B pairs, their statistics, the verdict and the command line.

Every figure runs its two sides alternately (A B, B A, A B, ...: ``interleave``) so drift of a
shared machine lands on both, and reports the median of the per-pair ratios A/B with their range,
for wall time and for CPU time. A target is met when the median of the pairs is within it, or
when the pairs' range spans it: a figure is judged against its own noise. Nothing here is a test.

The figures live in ``bench/figures/``, one module each, and import this module; ``bench/run.py``
lists them and calls :func:`main`. Imports run one way: run -> figures -> harness.
"""

import argparse
import dataclasses
import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path
from statistics import median
from typing import Any, Callable

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RESULTS = BENCH / "results.json"
LOGS = REPO / ".cache" / "bench"
RESULT_PREFIX = "BENCH_RESULT "  # the last stdout line of every bench/in_image script
UID_GID = (1000, 1000)  # the trainer image's user: files on mounts belong to it
#: What the whole bench needs at five pairs on a 2-core machine (the figures' ``seconds`` summed,
#: with a margin): a figure that would start with less than its own estimate left is not run.
DEFAULT_BUDGET_S = 4900


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class BenchError(RuntimeError):
    """A figure could not be measured; the message goes to the table and results.json."""


@dataclasses.dataclass(frozen=True)
class Figure:
    name: str
    target: float | None  # None: information, no target
    what: str  # A / B, one line
    run: Callable[["Context"], dict[str, Any]]
    seconds: float = 60  # its wall time at five pairs on a 2-core machine: not started with less left
    judged_on: str = "ratio"  # the entry's field the target applies to: "ratio" (wall) or "cpu_ratio"


def ratio_stats(a: list[float], b: list[float], a_cpu: list[float] | None = None,
                b_cpu: list[float] | None = None) -> dict[str, Any]:
    """Median, min and max of the per-pair ratios a[i] / b[i], and of the CPU-time ratios when given."""
    n = min(len(a), len(b))
    if n == 0:
        raise BenchError("no complete A/B pair was measured")
    ratios = [a[i] / b[i] for i in range(n)]
    stats: dict[str, Any] = {"ratio": round(median(ratios), 4), "min": round(min(ratios), 4),
                             "max": round(max(ratios), 4), "pairs": n, "a_median_s": round(median(a[:n]), 4),
                             "b_median_s": round(median(b[:n]), 4), "per_pair": [round(r, 4) for r in ratios]}
    cpu = [x / y for x, y in zip(a_cpu or [], b_cpu or []) if y > 0]
    if cpu:
        stats.update(cpu_ratio=round(median(cpu), 4), cpu_min=round(min(cpu), 4), cpu_max=round(max(cpu), 4),
                     a_cpu_median_s=round(median(a_cpu[:len(cpu)]), 4), b_cpu_median_s=round(median(b_cpu[:len(cpu)]), 4))
    return stats


def verdict(entry: dict[str, Any]) -> str:
    """``ok`` when the median of the pairs is within the target, ``ok (noise)`` when it is not but the
    pairs' range spans the target, ``MISSED`` when every pair is over it."""
    if "error" in entry:
        return "ERROR"
    field = entry.get("judged_on", "ratio")
    judged, target = entry.get(field), entry.get("target")
    if target is None or judged is None:
        return "-"
    if judged <= target:
        return "ok"
    low = entry.get("cpu_min" if field == "cpu_ratio" else "min")
    return "ok (noise)" if low is not None and low <= target else "MISSED"


def machine_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy, from /proc/stat: for figures whose work spreads over
    Airflow, dockerd and containers (it also counts strangers, so those want a quiet machine)."""
    with open("/proc/stat") as handle:
        fields = [int(v) for v in handle.readline().split()[1:8]]
    return (sum(fields[:3]) + fields[5] + fields[6]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """Run ``fn``; return (wall seconds, the machine's busy CPU seconds) it took."""
    cpu0, wall0 = machine_cpu_s(), time.monotonic()
    fn()
    return time.monotonic() - wall0, machine_cpu_s() - cpu0


def make_dirs(*paths: Path) -> None:
    """Create directories and hand them to uid 1000 (what the operators' helper container does)."""
    for path in paths:
        path.mkdir(parents=True, exist_ok=True)
        try:
            os.chown(path, *UID_GID)
        except PermissionError:
            path.chmod(0o777)


def fresh_home(parent: Path, name: str) -> Path:
    """A TFPIPE_HOME holding only a copy of the digits CSV."""
    source = REPO / ".demo" / "data" / "digits" / "digits.csv"
    if not source.exists():
        raise BenchError(f"{source} is missing: run `make data`")
    home = parent / name
    (home / "data" / "digits").mkdir(parents=True)
    shutil.copy(source, home / "data" / "digits" / "digits.csv")
    return home


def run_logged(cmd: list[str], logfile: Path, *, timeout: float, env: dict[str, str] | None = None,
               kill_container: str | None = None) -> str:
    """Run ``cmd`` in the repository; stderr goes to ``logfile``, stdout too and is returned; BenchError on failure."""
    with open(logfile, "a") as handle:
        handle.write(f"\n$ {' '.join(cmd)[:2000]}\n")
        handle.flush()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=handle, text=True, env=env, cwd=REPO,
                                  timeout=timeout)
        except subprocess.TimeoutExpired as err:
            if kill_container:
                subprocess.run(["docker", "rm", "-f", kill_container], capture_output=True)
            raise BenchError(f"timed out after {timeout:.0f} s: {' '.join(cmd)[:200]} (see {logfile})") from err
        handle.write(proc.stdout)
    if proc.returncode != 0:
        raise BenchError(f"exit {proc.returncode}: {' '.join(cmd)[:200]} (see {logfile})")
    return proc.stdout


def tfpipe_run(dag_id: str, env: dict[str, str], logfile: Path, extra: tuple[str, ...] = ()) -> None:
    """One ``tfpipe run DAG_ID`` (``dag.test`` in a fresh process); BenchError unless it succeeded without
    retries (a retried task makes a sample incomparable)."""
    out = run_logged([sys.executable, "-m", "tfpipe.cli", "run", dag_id, *extra], logfile, timeout=900, env=env)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    summary = json.loads(lines[-1]) if lines else {}
    if summary.get("state") != "success":
        raise BenchError(f"tfpipe run {dag_id} ended {summary.get('state', 'without a summary')} (see {logfile})")
    retried = [t for t, v in summary.get("tasks", {}).items() if v.get("try_number", 1) != 1]
    if retried:
        raise BenchError(f"tfpipe run {dag_id}: task(s) {retried} were retried: the timing is not comparable")


def host_path(spec: Any, container_path: str) -> Path:
    """Where a container path of ``spec`` lies on this machine (through its bind mounts)."""
    for mount in spec.mounts:
        if container_path == mount.target or container_path.startswith(mount.target.rstrip("/") + "/"):
            return Path(mount.source + container_path[len(mount.target):])
    raise BenchError(f"{container_path} is on no mount of the {spec.stage} stage")


def interleave(ctx: "Context", name: str, run_a: Callable[[int], Any], run_b: Callable[[int], Any],
               ) -> tuple[list[float], list[float], list[float], list[float]]:
    """``ctx.pairs`` pairs, the order alternating (A B, B A, ...); returns the wall and CPU seconds of each
    side. ``run_a``/``run_b`` take the pair's index and return ``(wall_s, cpu_s)``."""
    a, b, a_cpu, b_cpu = [], [], [], []
    for i in range(ctx.pairs):
        sides = [(run_a, a, a_cpu), (run_b, b, b_cpu)]
        for fn, wall, cpu in sides if i % 2 == 0 else sides[::-1]:
            seconds, cpu_s = fn(i)
            wall.append(float(seconds))
            cpu.append(float(cpu_s))
        log(f"{name}: pair {i + 1}/{ctx.pairs}: A {a[-1]:.3f} s, B {b[-1]:.3f} s, A/B {a[-1] / b[-1]:.3f}, "
            f"CPU A/B {a_cpu[-1] / b_cpu[-1] if b_cpu[-1] else float('nan'):.3f}")
    return a, b, a_cpu, b_cpu


class Context:
    """One bench run: the trainer image, a temporary directory, named containers, the time budget."""

    def __init__(self, pairs: int, budget_s: float, keep_temp: bool) -> None:
        self.pairs, self.budget_s, self.keep_temp = pairs, budget_s, keep_temp
        self.session = uuid.uuid4().hex[:8]
        self.started = time.monotonic()
        self.image_ref: str | None = None
        self.tmp = Path(tempfile.mkdtemp(prefix=f"tfpipe-bench-{self.session}-"))
        os.chmod(self.tmp, 0o777)
        LOGS.mkdir(parents=True, exist_ok=True)
        self._images_root: Path | None = None
        self._names = 0

    @property
    def image(self) -> str:
        """The trainer image, looked up when a figure first needs it: the parse figure does not."""
        if self.image_ref is None:
            cached = REPO / ".cache" / "trainer-image"  # what `make image` wrote
            ref = os.environ.get("TFPIPE_IMAGE") or (cached.read_text().strip() if cached.exists() else "")
            if not ref or subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode != 0:
                raise BenchError(f"the trainer image {ref or '(TFPIPE_IMAGE is not set)'} is not in the Docker "
                                 "engine. Fix: run `make image`, or `make bench`, which builds it first")
            os.environ["TFPIPE_IMAGE"] = self.image_ref = ref
        return self.image_ref

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def docker_run_args(self, what: str) -> list[str]:
        """``docker run`` options every bench container gets: a name and the session label."""
        self._names += 1
        return ["--name", f"tfpipe-bench-{self.session}-{what}-{self._names}", "--label", f"tfpipe.bench={self.session}"]

    def stage_run(self, what: str, spec: Any, config: Any) -> list[str]:
        """``docker run`` of ``spec``'s container with ``config``, as the stage operator configures it."""
        from tfpipe import contract

        args = ["docker", "run", "--rm", *self.docker_run_args(what), "--user", spec.user, "--network", spec.network_mode]
        args += ["--shm-size", spec.shm_size] if spec.shm_size else []
        args += ["--memory", spec.mem_limit] if spec.mem_limit else []
        args += ["--cpus", str(spec.cpus)] if spec.cpus else []
        for mount in spec.mounts:
            args += ["--mount", f"type=bind,source={mount.source},target={mount.target}" + ",readonly" * mount.read_only]
        env = {**spec.environment, **spec.private_environment, contract.CONFIG_ENV: contract.dumps(dict(config))}
        return args + [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")] + [self.image, *spec.command]

    def in_image(self, script: str, args: list[str], *, logfile: Path, timeout: float,
                 mount_root: Path | None = None) -> dict[str, Any]:
        """Run ``bench/in_image/<script>`` in the trainer image against the working tree; its result line."""
        cmd = ["docker", "run", "--rm", *self.docker_run_args(Path(script).stem.replace("_", "-")),
               "-v", f"{REPO}:/src:ro", "-v", f"{mount_root or self.tmp}:/bench", "-w", "/src",
               "-e", "PYTHONPATH=/src:/opt/tfpipe/deps", "--shm-size", "1g",
               self.image, "python3", f"bench/in_image/{script}", "--root", "/bench", *args]
        out = run_logged(cmd, logfile, timeout=timeout, kill_container=cmd[4])
        lines = [line for line in out.splitlines() if line.startswith(RESULT_PREFIX)]
        if not lines:
            raise BenchError(f"{script} printed no result line (see {logfile})")
        return json.loads(lines[-1][len(RESULT_PREFIX):])

    def images_root(self) -> Path:
        """The synthetic 64x64 RGB image data set (PNGs + trainer.prep), made once per bench run."""
        if self._images_root is None:
            root = self.tmp / "images"
            make_dirs(root)
            log("making the synthetic image data set (1,200 64x64 RGB PNGs, trainer.prep)")
            self.in_image("make_images.py", ["--count", "1200", "--size", "64", "--channels", "3"],
                          logfile=LOGS / "make_images.log", timeout=300, mount_root=root)
            self._images_root = root
        return self._images_root

    def image_train_spec(self, dag_id: str, training: dict[str, Any], **sections: Any) -> Any:
        """The train stage of pipeline ``dag_id`` on the synthetic image data set (:meth:`images_root`)."""
        from tfpipe import PipelineConfig
        from tfpipe.specs import plan_pipeline

        root = self.images_root()
        cfg = PipelineConfig.from_dict({
            "dag_id": dag_id, "image": {"ref": self.image},
            "volumes": {name: str(root / name) for name in ("data", "work", "models")},
            "data": {"path": "images", "format": "images", "image_size": [64, 64], "channels": 3,
                     "eval_fraction": 0.2, "shard_size": 250},
            "training": training, "export": {"model_name": dag_id}, **sections})
        return next(s for s in plan_pipeline(cfg) if s.stage == "train")

    def train_try(self, spec: Any, dag_id: str, run_id: str, try_number: int = 1) -> tuple[Any, Path]:
        """A try of an :meth:`image_train_spec`, its plan and run dir; before a first one, untimed, what prep
        leaves a run: its directories and the data set pointer."""
        from tfpipe.tries import TryIdentity, resolve_try

        plan = resolve_try(spec, TryIdentity(dag_id, run_id, "train", try_number))
        run_dir = host_path(spec, plan.run_dir)
        if try_number == 1:
            root = self.images_root()
            make_dirs(*(host_path(spec, d) for d in plan.writable_dirs), root / "models")
            shutil.copy(root / "work" / "runs" / "bench" / "prep" / "dataset.json", run_dir / "dataset.json")
            shutil.chown(run_dir / "dataset.json", *UID_GID)
        return plan, run_dir

    def cleanup(self) -> None:
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=tfpipe.bench={self.session}"],
                             capture_output=True, text=True).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True)
        if self.keep_temp:
            log(f"kept temporary files in {self.tmp}")
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def table(results: dict[str, Any], names: list[str]) -> str:
    """The figures as a Markdown table: median and range of the wall and CPU ratios, target, verdict."""
    header = ["figure", "median A/B", "range", "CPU median", "CPU range", "pairs", "target", "result"]
    rows = []
    for name in names:
        e = results.get(name, {})
        span = lambda low, high: "-" if e.get(low) is None else f"{fmt(e[low])}-{fmt(e.get(high))}"  # noqa: E731
        rows.append([name, fmt(e.get("ratio")), span("min", "max"), fmt(e.get("cpu_ratio")), span("cpu_min", "cpu_max"),
                     fmt(e.get("pairs")),
                     "-" if e.get("target") is None else f"<= {e['target']}"
                     + (" (CPU)" if e.get("judged_on") == "cpu_ratio" else ""), verdict(e)])
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def notes(results: dict[str, Any], names: list[str]) -> list[str]:
    """One line per figure that failed or says something beside its ratio (``info``)."""
    return [f"- `{name}`: {prefix}{results[name][key]}" for name in names if name in results
            for key, prefix in (("error", "not measured: "), ("info", "")) if results[name].get(key)]


def run_figure(figure: Figure, ctx: Context) -> dict[str, Any]:
    """One figure's ``results.json`` entry: the fields every figure has first, then its own details."""
    started = time.monotonic()
    if ctx.left() < figure.seconds:
        measured: dict[str, Any] = {"error": f"only {ctx.left():.0f} s of the bench's budget ({ctx.budget_s:.0f} s) "
                                             f"were left; the figure takes about {figure.seconds:.0f} s"}
    else:
        log(f"--- {figure.name}: {figure.what}")
        try:
            measured = dict(figure.run(ctx))
        except BenchError as err:
            measured = {"error": str(err)}
        except Exception as err:  # a bug in one figure must not stop the others
            with open(LOGS / f"{figure.name}.log", "a") as handle:
                traceback.print_exc(file=handle)
            measured = {"error": f"{type(err).__name__}: {err} (traceback in {LOGS / (figure.name + '.log')})"}
    head = {key: measured.pop(key, None) for key in ("ratio", "min", "max", "cpu_ratio", "cpu_min", "cpu_max", "pairs")}
    return {**head, "target": figure.target, "judged_on": figure.judged_on, **measured,
            "seconds": round(time.monotonic() - started, 1),
            "measured_at": dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(), "image": ctx.image_ref}


def main(figures: list[Figure], argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/run.py", description="tfpipe's speed ratios, measured as "
                                     "interleaved A/B pairs on this machine (not a test)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run only this figure (repeatable, or comma-separated); see --list")
    parser.add_argument("--pairs", type=int, default=5, help="A/B pairs per figure (default 5)")
    parser.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                        help=f"seconds the whole run may take: a figure is not started when less than its own "
                             f"estimate is left (default {DEFAULT_BUDGET_S})")
    parser.add_argument("--list", action="store_true", help="list the figures and exit")
    parser.add_argument("--keep-temp", action="store_true", help="keep the temporary directory (debugging)")
    parser.add_argument("--output", type=Path, default=RESULTS, help="results file (default bench/results.json)")
    args = parser.parse_args(argv)
    if args.list:
        for f in figures:
            print(f"{f.name:30} target {fmt(f.target):5} ~{f.seconds:4.0f} s  {f.what}")
        return 0
    only = {n.strip() for item in args.only for n in item.split(",") if n.strip()}
    unknown = only - {f.name for f in figures}
    if unknown:
        parser.error(f"unknown figure(s) {sorted(unknown)}; see --list")
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    chosen = [f for f in figures if not only or f.name in only]
    # The environment `make` exports (Makefile), so `.venv/bin/python bench/run.py` works directly too.
    os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow"))
    os.environ.update(AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
                      AIRFLOW__CORE__UNIT_TEST_MODE="False")
    ctx = Context(args.pairs, args.budget, args.keep_temp)

    def on_signal(signum: int, _frame: Any) -> None:
        log(f"signal {signum}: cleaning up")
        ctx.cleanup()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log(f"{args.pairs} pairs per figure, {len(chosen)} figure(s), budget {args.budget:.0f} s, "
        f"temp {ctx.tmp}, logs {LOGS}")
    results: dict[str, Any] = {}
    if only and args.output.exists():  # a partial run updates the figures it ran
        try:
            results = json.loads(args.output.read_text())
        except ValueError:
            results = {}
    try:
        for figure in chosen:
            results[figure.name] = entry = run_figure(figure, ctx)
            log(f"{figure.name}: " + (f"ERROR: {entry['error']}" if entry.get("error") else
                                      f"{verdict(entry)}, median {fmt(entry.get(figure.judged_on))} in {entry['seconds']:.0f} s"))
            args.output.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        ctx.cleanup()
    names = [f.name for f in chosen]
    print(table(results, names))
    print("\n".join(["", *notes(results, names)]))
    print(f"\n{(time.monotonic() - ctx.started) / 60:.1f} min, {args.pairs} pairs per figure; results in {args.output}")
    return 0
