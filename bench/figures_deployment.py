"""``deployment_overhead_ratio``: a tfpipe run under ``make up``'s scheduler against a plain DAG there.

A is one ``tfpipe_digits`` run, B one run of ``bench/dags/plain_docker_digits.py`` (the same four
containers as hand-written ``DockerOperator``\\ s), both triggered through the REST API v2 of the
same stack (PostgreSQL, Redis, CeleryExecutor with two workers, the TLS engine) and timed from the
trigger to the run's ``end_date`` as the metadata DB records it (so the REST polling interval adds
nothing). Besides the ratio it reports, for each side, the median of each task's timeline from the
task instances: the wait before it (its upstream's end, or the run's queueing for a first task, to
its start; split into the scheduler's part, ready to queued, and the executor's, queued to
running) and its time in the task (start to end); and the run's head (queued to the first task's
start) and tail (the last task's end to the run's end). See ``bench/README.md``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
import uuid
from typing import Any

from run import BENCH, LOGS, REPO, BenchError, Context, free_port, interleave, log, machine_cpu_s, median, \
    ratio_stats, run_logged

#: The conf both sides run with (the plain DAG bakes it into its stage configs at parse time). At it
#: neither side blesses, so export is skipped on both. A lower threshold would not make it fair:
#: unpausing tfpipe_digits creates a scheduled run, whose 15-epoch model version its evaluate then
#: compares with, and a 2-epoch candidate never matches it.
CONF = {"epochs": 2, "batch_size": 100}
PLAIN_DAG = "bench_plain_docker_digits"
TFPIPE_DAG = "tfpipe_digits"


def _iso(stamp: str | None) -> float | None:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None


def upstream_map(tasks: list[dict[str, Any]]) -> dict[str, set[str]]:
    """``{task_id: its upstream task ids}`` from the REST API's ``dags/{id}/tasks`` list."""
    upstream: dict[str, set[str]] = {t["task_id"]: set() for t in tasks}
    for task in tasks:
        for down in task.get("downstream_task_ids") or []:
            upstream.setdefault(down, set()).add(task["task_id"])
    return upstream


def task_timeline(tis: list[dict[str, Any]], upstream: dict[str, set[str]],
                  run: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per task that ran: ``wait_s`` (ready -> start), ``scheduling_s`` (ready -> queued),
    ``pickup_s`` (queued -> start) and ``run_s`` (start -> end), in seconds.

    A task is ready when its last upstream task ended; a first task when the run was queued.
    """
    ran = {t["task_id"]: t for t in tis if t.get("start_date") and t.get("end_date")}
    run_queued = _iso(run.get("queued_at") or run.get("start_date"))
    out: dict[str, dict[str, float]] = {}
    for task_id, ti in ran.items():
        ends = [_iso(ran[u]["end_date"]) for u in upstream.get(task_id, ()) if u in ran]
        ready = max(ends) if ends else run_queued
        start, end, queued = _iso(ti["start_date"]), _iso(ti["end_date"]), _iso(ti.get("queued_when"))
        entry = {"run_s": end - start}
        if ready is not None:
            entry["wait_s"] = start - ready
            if queued is not None:
                entry["scheduling_s"] = queued - ready
                entry["pickup_s"] = start - queued
        out[task_id] = entry
    starts = [_iso(t["start_date"]) for t in ran.values()]
    ends = [_iso(t["end_date"]) for t in ran.values()]
    if starts and run_queued is not None:
        out["(head)"] = {"wait_s": min(starts) - run_queued}
    if ends and run.get("end_date"):
        out["(tail)"] = {"wait_s": _iso(run["end_date"]) - max(ends)}
    return out


def median_timeline(samples: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """The per-key medians of several runs' :func:`task_timeline`."""
    keys: dict[str, set[str]] = {}
    for sample in samples:
        for task_id, entry in sample.items():
            keys.setdefault(task_id, set()).update(entry)
    return {task_id: {k: round(median([s[task_id][k] for s in samples if k in s.get(task_id, {})]), 3)
                      for k in sorted(fields)}
            for task_id, fields in keys.items()}


def describe(timeline: dict[str, dict[str, float]], order: list[str]) -> str:
    """``prep 1.2+10.4, train 0.9+30.1, ...``: wait before + time in each task, in run order."""
    parts = []
    for task_id in order:
        entry = timeline.get(task_id)
        if entry:
            wait = entry.get("wait_s")
            parts.append(f"{task_id} {'?' if wait is None else f'{wait:.1f}'}+{entry.get('run_s', 0):.1f}")
    return ", ".join(parts)


def _order(timeline: dict[str, dict[str, float]], tis_order: list[str]) -> list[str]:
    return ["(head)", *[t for t in tis_order if t in timeline], "(tail)"]


def deployment_overhead(ctx: Context) -> dict[str, Any]:
    """A: tfpipe_digits under ``make up``'s stack (REST trigger to success); B: the same containers as
    four plain DockerOperators (``bench/dags/plain_docker_digits.py``) in the same stack."""
    sys.path.insert(0, str(REPO))
    from deploy import stack as stack_module
    from deploy.rest import AirflowRest

    # The deployment tests' state dir: its registry and engine already hold the image.
    env = {**os.environ, "TFPIPE_STACK_DIR": str(REPO / ".cache" / "stack-test"),
           "TFPIPE_STACK_EXTRA_DAGS": str(BENCH / "dags"), "TFPIPE_BENCH_CONF": json.dumps(CONF),
           "TFPIPE_STACK_BRIDGE": "tfpbench1", "TFPIPE_STACK_SUBNET": "10.216.0.1/24"}
    for name in ("API", "PG", "REDIS", "REGISTRY", "ENGINE"):
        env[f"TFPIPE_STACK_{name}_PORT"] = str(free_port())
    logfile = LOGS / "deployment_overhead_ratio.log"
    run_logged([sys.executable, str(REPO / "deploy" / "stack.py"), "up", "--fresh"], logfile, timeout=1800, env=env)
    stack = stack_module.Stack(env)
    try:
        rest = AirflowRest(stack.api_url, stack_module.ADMIN_USER, stack.admin_password())
        timelines: dict[str, list[dict[str, dict[str, float]]]] = {TFPIPE_DAG: [], PLAIN_DAG: []}
        upstream: dict[str, dict[str, set[str]]] = {}
        order: dict[str, list[str]] = {}

        def one(dag_id: str, run_conf: dict[str, Any], record: bool) -> tuple[float, float]:
            cpu0, t0 = machine_cpu_s(), time.time()
            run_id = rest.trigger(dag_id, conf=run_conf, run_id=f"bench-{uuid.uuid4().hex[:10]}")
            run = rest.wait_for_run(dag_id, run_id, timeout=900)
            cpu = machine_cpu_s() - cpu0
            if run["state"] != "success":
                raise BenchError(f"{dag_id} run {run_id} ended {run['state']} (logs under {stack.airflow_home})")
            tis = rest.task_instances(dag_id, run_id)
            retried = sorted(t["task_id"] for t in tis if (t.get("try_number") or 1) > 1)
            if retried:
                raise BenchError(f"{dag_id} run {run_id}: task(s) {retried} were retried: not comparable")
            took = _iso(run["end_date"]) - t0  # trigger to the end the metadata DB records
            if dag_id not in upstream:
                upstream[dag_id] = upstream_map(rest.get(f"dags/{dag_id}/tasks")["tasks"])
            timeline = task_timeline(tis, upstream[dag_id], run)
            order[dag_id] = [t["task_id"] for t in sorted(
                (t for t in tis if t.get("start_date")), key=lambda t: _iso(t["start_date"]))]
            log(f"deployment_overhead_ratio: {dag_id} {took:.1f} s (CPU {cpu:.1f} s); wait+in task: "
                f"{describe(timeline, _order(timeline, order[dag_id]))}")
            if record:
                timelines[dag_id].append(timeline)
            return took, cpu

        rest.wait_for_dag(PLAIN_DAG)
        # Untimed warm-up of each side: the first run after `up` also makes the prep cache (which the
        # other side would then hit) and pays the workers' first imports.
        one(TFPIPE_DAG, CONF, False)
        one(PLAIN_DAG, {}, False)
        a, b, notes = interleave(ctx, "deployment_overhead_ratio",
                                 lambda i: one(TFPIPE_DAG, CONF, True),
                                 lambda i: one(PLAIN_DAG, {}, True))
        a_cpu, b_cpu = ctx.cpu["deployment_overhead_ratio"]
        result = ratio_stats(a, b, a_cpu, b_cpu)
        per_side = {dag_id: median_timeline(samples) for dag_id, samples in timelines.items()}
        result["a_tasks"], result["b_tasks"] = per_side[TFPIPE_DAG], per_side[PLAIN_DAG]
        sched = [e["scheduling_s"] for s in timelines[TFPIPE_DAG] for t, e in s.items()
                 if "scheduling_s" in e and upstream[TFPIPE_DAG].get(t)]
        pickup = [e["pickup_s"] for s in timelines[TFPIPE_DAG] for e in s.values() if "pickup_s" in e]
        result["scheduler_latency_s"] = round(median(sched), 3) if sched else None
        result["executor_pickup_s"] = round(median(pickup), 3) if pickup else None
        result["notes"] = notes + [
            f"A = REST trigger to the recorded end of a {TFPIPE_DAG} run (its tasks: "
            f"{', '.join(order.get(TFPIPE_DAG, []))}; conf {json.dumps(CONF)}); B = the same four containers as "
            "plain DockerOperators, same engine (TLS), same stack (CeleryExecutor, 2 workers). scheduler_latency_s: "
            "median upstream end -> queued per task; executor_pickup_s: median queued -> running. One untimed "
            "warm-up run of each side first.",
            "per task, median seconds waited before it + spent in it: A: "
            + describe(per_side[TFPIPE_DAG], _order(per_side[TFPIPE_DAG], order.get(TFPIPE_DAG, [])))
            + "; B: " + describe(per_side[PLAIN_DAG], _order(per_side[PLAIN_DAG], order.get(PLAIN_DAG, []))),
        ]
        return result
    finally:
        run_logged([sys.executable, str(REPO / "deploy" / "stack.py"), "down"], logfile, timeout=300, env=env)
