"""The provider's own cost against a hand-written DAG: ``provider_cost_ratio`` and ``dag_parse_ratio``.

- ``provider_cost_ratio``: one ``tfpipe_digits`` run against one run of the same four containers as
  hand-written ``DockerOperator``\\ s (``bench/dags/plain_docker_digits.py``: same image, stage configs,
  mounts and user), both through the same Airflow path (``tfpipe run DAG_ID``: ``dag.test()`` in a
  fresh process), on identical fresh volume trees.
- ``dag_parse_ratio``: the parse of ``dags/tfpipe_digits.py`` against the parse of
  ``bench/dags/handwritten_digits.py``, the same DAG written by hand (same tasks, Params, doc size).

Both report wall and CPU time; see ``bench/README.md``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from run import (
    BENCH,
    LOGS,
    REPO,
    Context,
    fresh_home,
    interleave,
    log,
    make_dirs,
    median,
    ratio_stats,
    run_logged,
    tfpipe_run_summary,
    timed,
)
from sampling import alternating_medians, stratified_means

#: The conf of both sides: a short run, so the provider's per-task cost is a visible share of it.
#: The threshold lets the short run be blessed, so export runs on both sides.
PROVIDER_CONF = {"epochs": 2, "batch_size": 100, "threshold": 0.5}
PLAIN_DAG = BENCH / "dags" / "plain_docker_digits.py"
PLAIN_DAG_ID = "bench_plain_docker_digits"
HANDWRITTEN_DAG = BENCH / "dags" / "handwritten_digits.py"
#: Fresh interpreters of each DAG file for the `in_dag_processor` reading (alternating A and B).
PARSE_SAMPLES = 7


def _prepared_home(parent: Path, name: str, dag_id: str, model_name: str) -> Path:
    """A fresh TFPIPE_HOME with the digits CSV and the volume directories a user prepares once for
    uid 1000 (what a hand-written DAG of non-root containers needs: a writable runs/<dag_id>)."""
    home = fresh_home(parent, name)
    work, models = home / "work", home / "models"
    make_dirs(work, work / "cache", work / "cache" / "cuda", work / "datasets", work / "runs",
              work / "runs" / dag_id, models, models / model_name)
    return home


def provider_cost(ctx: Context) -> dict[str, Any]:
    """A: ``tfpipe run tfpipe_digits``; B: ``tfpipe run bench_plain_docker_digits``; same conf, same path."""
    logfile = LOGS / "provider_cost_ratio.log"
    parent = ctx.tmp / "provider-cost"
    parent.mkdir()
    folders = {}
    for side, source in (("a", REPO / "dags" / "tfpipe_digits.py"), ("b", PLAIN_DAG)):
        folders[side] = parent / f"dags-{side}"  # one DAG file per folder: each side parses only its own
        folders[side].mkdir()
        shutil.copy(source, folders[side] / source.name)
    task_seconds: dict[str, dict[str, list[float]]] = {"a": {}, "b": {}}

    def one(side: str, i: int) -> tuple[float, float]:
        dag_id, model_name = ("tfpipe_digits", "digits") if side == "a" else (PLAIN_DAG_ID, "digits_plain")
        home = _prepared_home(parent, f"{side}-{i}", dag_id, model_name)
        # dag.test() syncs the configured DAGs folder (the "dags-folder" bundle) before it runs: each
        # side's folder holds only its own DAG file, so each parses and syncs just that one.
        env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(folders[side]), "TFPIPE_HOME": str(home),
               "TFPIPE_IMAGE": ctx.image,
               "AIRFLOW_VAR_TFPIPE_IMAGE": ctx.image, "TFPIPE_BENCH_CONF": json.dumps(PROVIDER_CONF),
               "TFPIPE_BENCH_USER": "1000:1000", "PYTHONUNBUFFERED": "1",
               "PATH": f"{Path(ctx.python).parent}:{os.environ.get('PATH', '')}"}
        conf = PROVIDER_CONF if side == "a" else {}  # B's configs carry the conf already (parse time)
        cmd = [ctx.python, "-m", "tfpipe.cli", "run", dag_id, "--dags-folder", str(folders[side]),
               "--conf", json.dumps(conf)]
        out: dict[str, Any] = {}

        def run() -> None:
            out["proc"] = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)

        wall, cpu = timed(run)
        proc = out["proc"]
        tfpipe_run_summary(proc, cmd, dag_id, home, logfile)
        if i >= 0:  # the warm-up's tasks pay first-run costs: its times would skew the medians
            for task, seconds in _task_seconds(proc.stderr).items():
                task_seconds[side].setdefault(task, []).append(seconds)
        shutil.rmtree(home, ignore_errors=True)
        return wall, cpu

    one("a", -1)  # untimed warm-up of each side: page cache, first-run costs of the DB and the image
    one("b", -1)
    a, b, notes = interleave(ctx, "provider_cost_ratio", lambda i: one("a", i), lambda i: one("b", i))
    a_cpu, b_cpu = ctx.cpu["provider_cost_ratio"]
    stats = ratio_stats(a, b, a_cpu, b_cpu)
    tasks = {side: {t: round(median(v), 2) for t, v in per.items()} for side, per in task_seconds.items()}
    stats.update(a_task_median_s=tasks["a"], b_task_median_s=tasks["b"], notes=notes)
    extra = {t: v for t, v in tasks["a"].items() if t not in tasks["b"]}
    stats["why"] = (
        f"A-B = {stats['a_median_s'] - stats['b_median_s']:.1f} s per run; per stage task A/B: "
        + ", ".join(f"{t} {tasks['a'][t]:.1f}/{v:.1f} s" for t, v in tasks["b"].items() if t in tasks["a"])
        + ("; tasks only A has: " + ", ".join(f"{t} {v:.1f} s" for t, v in extra.items()) if extra else ""))
    stats["info"] = (f"both sides `tfpipe run DAG` (dag.test, fresh process, conf {json.dumps(PROVIDER_CONF)}), "
                     "fresh volume trees prepared for uid 1000 alike; CPU = the whole machine's busy CPU time")
    return stats


def _task_seconds(stderr: str) -> dict[str, float]:
    """Seconds from each task's start to its end, from dag.test's log lines."""
    import re

    from run import _utc

    stamp = r"^(\d{4}-\d\d-\d\dT[\d:.]+)Z? "
    begun: dict[str, float] = {}
    took: dict[str, float] = {}
    for m in re.finditer(stamp + r".*\[DAG TEST\] (starting|end) task(?: task)?_id=(\w+)", stderr, re.M):
        t = _utc(m.group(1))
        if m.group(2) == "starting":
            begun[m.group(3)] = t
        elif m.group(3) in begun:
            took[m.group(3)] = t - begun[m.group(3)]
    return took


# --------------------------------------------------------------------------------------------
# dag_parse_ratio

PARSE_PROBE = r'''
import json, runpy, sys, time
import airflow                # imported before the clock starts: every DAG file processor has it,
from airflow.sdk import DAG   # and every DAG file (the reference too) builds a DAG from it
path, depth = sys.argv[1], int(sys.argv[2])

def parse():
    cpu, started = time.process_time(), time.perf_counter()
    runpy.run_path(path, run_name="bench_dag_file")
    return time.perf_counter() - started, time.process_time() - cpu

def nested(depth):  # one small frame per level (1 local): the caller's stack, `depth` frames deep
    return nested(depth - 1) if depth else parse()

seconds, cpu = nested(depth)
print(json.dumps({"seconds": seconds, "cpu": cpu}))
'''

#: The caller depths (frames of ``nested``) a ``dag_parse_ratio`` pair parses each file at. A file's
#: exec time depends on how deep its caller's stack already is: CPython 3.11 keeps frames in 16 kB
#: chunks, maps a new chunk when a call does not fit in the current one and unmaps it when that
#: call returns, so an import tree that keeps crossing a chunk's end pays an mmap, a munmap and page
#: faults each time. Where the ends fall is an accident of the caller (Airflow's DAG processor, its
#: task runner and ``airflow dags test`` each parse at their own depth): called from depth 0 the
#: hand-written file crossed none and tfpipe's 511 times, from depth 20 5711 and 247
#: (bench/NOTES.md, 2026-12-06 18:35). One chunk holds about 146 of ``nested``'s frames (14 words
#: each), so a pair takes 12 depths 12 apart across one chunk, each pair shifted so the six pairs of
#: a run cover the chunk at 1-3 frame steps, and both files get the same depths.
PARSE_DEPTH_STEP = 12
PARSE_DEPTH_STRATA = 12


def parse_depths(pair: int) -> list[int]:
    """The caller depths of ``dag_parse_ratio``'s pair ``pair`` (0-based): one per stratum."""
    shift = (pair * 5) % PARSE_DEPTH_STEP
    return [k * PARSE_DEPTH_STEP + shift for k in range(PARSE_DEPTH_STRATA)]


#: The same exec time where a DAG processor parses: Airflow 3's manager has its own modules loaded,
#: and before it forks the process that parses a file it imports the ``airflow.*`` modules the file
#: names (``[dag_processor] parsing_pre_import_modules``, on by default), with Airflow's own
#: ``iter_airflow_imports``. The hand-written file names the Docker provider and finds it loaded;
#: tfpipe's DAG files name ``airflow.providers.tfpipe``, which imports tfpipe's DAG-building modules
#: and the Docker provider under them, and find those loaded.
PROCESSOR_PROBE = r'''
import importlib, json, runpy, sys, time
import airflow
from airflow.sdk import DAG
import airflow.dag_processing.processor
from airflow.utils.file import iter_airflow_imports
path = sys.argv[1]
for module in iter_airflow_imports(path):
    importlib.import_module(module)
cpu, started = time.process_time(), time.perf_counter()
runpy.run_path(path, run_name="bench_dag_file")
print(json.dumps({"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu}))
'''

BREAKDOWN_PROBE = r'''
import json, runpy, sys, time
import airflow
from airflow.sdk import DAG
t0 = time.process_time()
import airflow.providers.docker.operators.docker
t1 = time.process_time()
if sys.argv[2] == "tfpipe":
    import tfpipe.dag_factory
t2 = time.process_time()
runpy.run_path(sys.argv[1], run_name="bench_dag_file")
t3 = time.process_time()
print(json.dumps({"docker_provider": t1 - t0, "tfpipe_modules": t2 - t1, "dag_build": t3 - t2}))
'''


def dag_parse(ctx: Context) -> dict[str, Any]:
    """A: ``dags/tfpipe_digits.py``; B: ``bench/dags/handwritten_digits.py``; exec time of each file."""
    tfpipe_file = REPO / "dags" / "tfpipe_digits.py"
    env = {**os.environ, "TFPIPE_HOME": str(ctx.tmp / "parse-home"), "PYTHONDONTWRITEBYTECODE": "1"}
    logfile = LOGS / "dag_parse_ratio.log"

    def probe(path: Path, depth: int = 0) -> tuple[float, float]:
        out = run_logged([ctx.python, "-c", PARSE_PROBE, str(path), str(depth)], logfile, timeout=120, env=env,
                         cwd=REPO)
        sample = json.loads(out.strip().splitlines()[-1])
        return sample["seconds"], sample["cpu"]

    # A deployed provider is byte-compiled (pip compiles wheels on install; the dag processor writes
    # .pyc): compile tfpipe and both files once, as Airflow's own site-packages already are, so neither
    # side pays compilation inside the timed region. PYTHONDONTWRITEBYTECODE then keeps the tree unchanged.
    run_logged([ctx.python, "-m", "compileall", "-q", str(REPO / "provider")], logfile,
               timeout=120, env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
               cwd=REPO)
    for path in (tfpipe_file, HANDWRITTEN_DAG):  # warm the page cache: untimed
        probe(path)
    # One sample of a 0.1 s parse swings by 20% and more on a shared 2-core machine, and the VM's
    # pace drifts within seconds; and the exec time depends on the caller's stack depth (above). Each
    # pair parses each file once at each of its depths, alternating (A B, B A, ...), and the pair's A
    # and B are their means over the depths (wall and CPU apart).
    held: dict[int, tuple[float, float]] = {}
    strata: dict[str, list[list[float]]] = {"a": [[] for _ in range(PARSE_DEPTH_STRATA)],
                                            "b": [[] for _ in range(PARSE_DEPTH_STRATA)]}

    def pair_a(i: int) -> tuple[float, float]:
        means, readings = stratified_means(probe, tfpipe_file, HANDWRITTEN_DAG, parse_depths(i))
        for side, path in (("a", tfpipe_file), ("b", HANDWRITTEN_DAG)):
            for k, (_, cpu) in enumerate(readings[path]):
                strata[side][k].append(cpu)
        held[i] = means[HANDWRITTEN_DAG]  # B's side of this pair, returned by the B call after it
        return means[tfpipe_file]

    a, b, notes = interleave(ctx, "dag_parse_ratio", pair_a, lambda i: held.pop(i))
    a_cpu, b_cpu = ctx.cpu["dag_parse_ratio"]
    stats = ratio_stats(a, b, a_cpu, b_cpu)
    stats["notes"] = notes
    stats["a_ms"], stats["b_ms"] = round(1000 * median(a), 1), round(1000 * median(b), 1)
    stats["a_cpu_ms"], stats["b_cpu_ms"] = round(1000 * median(a_cpu), 1), round(1000 * median(b_cpu), 1)
    stats["method"] = ("exec time (wall and process CPU) of the DAG file alone (runpy.run_path), in a fresh "
                       "interpreter per sample, after `import airflow` and `from airflow.sdk import DAG` (untimed), "
                       f"called {PARSE_DEPTH_STRATA} caller depths {PARSE_DEPTH_STEP} frames apart (one 16 kB chunk "
                       "of CPython's frame stack, shifted per pair); each pair: the means over those depths of one "
                       "sample of each file per depth, alternating; B is the same DAG written by hand "
                       "(bench/dags/handwritten_digits.py)")
    # Per stratum of depths, the CPU medians over the pairs: where the frame stack's chunk ends fall
    # for each file (information; the ratio is over all strata).
    stats["by_depth_cpu_ms"] = [
        {"depths": f"{k * PARSE_DEPTH_STEP}-{k * PARSE_DEPTH_STEP + PARSE_DEPTH_STEP - 1}",
         "a": round(1000 * median(strata["a"][k]), 1), "b": round(1000 * median(strata["b"][k]), 1)}
        for k in range(PARSE_DEPTH_STRATA) if strata["a"][k] and strata["b"][k]]
    # Where the CPU time goes (diagnostic, not in the ratio): 3 samples of each, medians in ms.
    parts: dict[str, list[dict[str, float]]] = {"tfpipe": [], "handwritten": []}
    for _ in range(3):
        for kind, path in (("tfpipe", tfpipe_file), ("handwritten", HANDWRITTEN_DAG)):
            out = run_logged([ctx.python, "-c", BREAKDOWN_PROBE, str(path), kind], logfile, timeout=120,
                             env=env, cwd=REPO)
            parts[kind].append(json.loads(out.strip().splitlines()[-1]))
    breakdown = {kind: {k: round(1000 * median([p[k] for p in samples]), 1) for k in samples[0]}
                 for kind, samples in parts.items()}
    stats["breakdown_cpu_ms"] = breakdown
    # As a DAG processor parses (information, not the ratio). A parse there is a fifth of the
    # figure's, so one sample swings by as much as the two files differ: the same alternating
    # medians as a pair of the figure.
    def processor_probe(path: Path) -> tuple[float, float]:
        out = run_logged([ctx.python, "-c", PROCESSOR_PROBE, str(path)], logfile, timeout=120, env=env, cwd=REPO)
        sample = json.loads(out.strip().splitlines()[-1])
        return sample["seconds"], sample["cpu"]

    processor = alternating_medians(processor_probe, tfpipe_file, HANDWRITTEN_DAG, PARSE_SAMPLES)
    a_proc, b_proc = (round(1000 * processor[path][1], 1) for path in (tfpipe_file, HANDWRITTEN_DAG))
    stats["in_dag_processor"] = {
        "a_cpu_ms": a_proc, "b_cpu_ms": b_proc, "cpu_ratio": round(a_proc / b_proc, 4),
        "a_ms": round(1000 * processor[tfpipe_file][0], 1), "b_ms": round(1000 * processor[HANDWRITTEN_DAG][0], 1),
        "method": "the same exec time after `import airflow.dag_processing.processor` and the pre-import a DAG "
                  "processor makes of the airflow.* modules each file names (parsing_pre_import_modules, the "
                  f"default); {PARSE_SAMPLES} samples of each, alternating, wall and CPU medians"}
    t, h = breakdown["tfpipe"], breakdown["handwritten"]
    stats["why"] = (f"{tfpipe_file.name} {stats['a_ms']:.0f} ms ({stats['a_cpu_ms']:.0f} ms CPU) against "
                    f"{stats['b_ms']:.0f} ms ({stats['b_cpu_ms']:.0f} ms CPU) by hand; CPU: Docker provider import "
                    f"{t['docker_provider']:.0f}/{h['docker_provider']:.0f} ms, tfpipe's modules {t['tfpipe_modules']:.0f} "
                    f"ms, the DAG itself {t['dag_build']:.0f}/{h['dag_build']:.0f} ms; where a DAG processor parses "
                    f"(airflow.* imports pre-imported): {a_proc:.0f} against {b_proc:.0f} ms CPU")
    log(f"dag_parse_ratio: {stats['why']}")
    return stats
