"""Worker crashes and Clears in ``make up``'s stack: the retry re-attaches, or resumes from the checkpoint.

Each test drives ``tfpipe_digits`` through the REST API v2 with its containers on the TLS engine,
and kills something for real: every Celery worker (SIGKILL to its process group, so the task runner
dies with it and ``on_kill`` never runs), and in a variant the training container as well. The
scheduler notices the dead task by its heartbeat timeout (short in the test session, see
``STACK_TEST_ENV``) and retries it.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tfpipe.contract import safe_name

pytestmark = [pytest.mark.integration, pytest.mark.deployment]

DIGITS = "tfpipe_digits"
#: long enough that training is still running when the workers are killed
CONF = {"epochs": 40, "batch_size": 32, "seed": 3}


def _run_dir(stack, run_id: str) -> Path:
    return Path(stack.volumes) / "work" / "runs" / DIGITS / safe_name(run_id, 120)


def _attempts(stack, run_id: str) -> list[dict]:
    try:
        return json.loads((_run_dir(stack, run_id) / "attempts.json").read_text())
    except (OSError, ValueError):
        return []


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _train_containers(stack, run_id: str) -> list[dict]:
    """Every training container of the run on the TLS engine (any state)."""
    out = stack.engine_docker("ps", "-a", "--no-trunc", "--filter", f"label=tfpipe.run_id={run_id}",
                              "--filter", "label=tfpipe.task_id=train", "--format", "{{json .}}").stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [r for r in rows if "tfpipe.role=" not in r.get("Labels", "")]


def _created_train_containers(stack, run_id: str, since: float) -> list[str]:
    """Ids of the training containers of the run the engine created since ``since``."""
    out = stack.engine_docker("events", "--since", str(int(since)), "--until", str(int(time.time()) + 1),
                              "--filter", "event=create", "--filter", f"label=tfpipe.run_id={run_id}",
                              "--filter", "label=tfpipe.task_id=train", "--format", "{{json .}}").stdout
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [e["id"] for e in events if "tfpipe.role" not in (e.get("Actor", {}).get("Attributes") or {})]


def _kill_every_worker_mid_training(stack, rest, run_id: str) -> tuple[str, list[int]]:
    """Wait for a checkpoint mid-training, pause the training container, SIGKILL every worker.

    Returns the container's id and the workers. The container stays paused (the caller unpauses or
    kills it): training cannot end before the kill on a fast machine, nor before the retry on a slow
    one, and a paused container is as alive as a running one to the retry.
    """
    rest.wait_for_task(DIGITS, run_id, "train", {"running"}, timeout=600)
    _wait(lambda: (_attempts(stack, run_id) or [{}])[-1].get("last_checkpoint"), 600, "a checkpoint mid-training")
    (container,) = [c for c in _train_containers(stack, run_id) if c["State"] == "running"]
    stack.engine_docker("pause", container["ID"])
    # cleanup starts beside train. A worker killed while it starts a task, before the task reports
    # itself running, leaves that task queued until the scheduler's task_queued_timeout (600 s by
    # default) requeues it: a CI-shape run whose first checkpoint came that early took 12 minutes.
    # The kill lands under train alone.
    rest.wait_for_task(DIGITS, run_id, "cleanup", {"success", "failed", "skipped"}, timeout=600)
    workers = [n for n in range(1, int(stack.settings["workers"]) + 1) if stack.pid(f"worker{n}")]
    for n in workers:
        stack.stop(f"worker{n}", signal.SIGKILL)
    return container["ID"], workers


def _log_of_try(rest, run_id: str, try_number: int) -> str:
    try:
        return rest.task_log(DIGITS, run_id, "train", try_number)
    except AssertionError:  # that try has not started yet
        return ""


def _tries(rest, run_id: str, task_id: str) -> list[dict]:
    return rest.get(f"dags/{DIGITS}/dagRuns/{run_id}/taskInstances/{task_id}/tries")["task_instances"]


def test_worker_killed_mid_training_the_retry_reattaches_to_the_same_container(stack, rest):
    since = time.time() - 1
    run_id = rest.trigger(DIGITS, conf=CONF)
    cid, workers = _kill_every_worker_mid_training(stack, rest, run_id)
    try:  # paused until the retry has re-attached
        for n in workers:
            stack.start_worker(n)
        # the scheduler fails try 1 once its heartbeat times out; try 2 then runs on a worker
        _wait(lambda: "re-attached" in _log_of_try(rest, run_id, 2), 600, "the retry to re-attach")
    finally:
        stack.engine_docker("unpause", cid, check=False)
    run = rest.wait_for_run(DIGITS, run_id, timeout=900)
    assert run["state"] == "success", {t["task_id"]: t["state"] for t in rest.task_instances(DIGITS, run_id)}
    log = rest.task_log(DIGITS, run_id, "train", 2)
    assert f"re-attached to the running train container {cid[:12]}" in log, log[-4000:]
    assert rest.task_instance(DIGITS, run_id, "train")["try_number"] == 2
    assert [t["state"] for t in _tries(rest, run_id, "train")] == ["failed", "success"]
    # one training container ever, and it trained every step once
    assert _created_train_containers(stack, run_id, since) == [cid]
    (attempt,) = _attempts(stack, run_id)
    assert attempt["status"] == "completed" and attempt["resumed_from"] is None, attempt
    assert attempt["start_step"] == 0 and attempt["end_step"] == attempt["target_steps"]
    assert _train_containers(stack, run_id) == [], "the container is removed once its result was read"


def test_worker_and_container_killed_the_retry_resumes_from_the_checkpoint(stack, rest):
    since = time.time() - 1
    run_id = rest.trigger(DIGITS, conf=CONF)
    cid, workers = _kill_every_worker_mid_training(stack, rest, run_id)
    stack.engine_docker("kill", cid)
    for n in workers:
        stack.start_worker(n)
    run = rest.wait_for_run(DIGITS, run_id, timeout=900)
    assert run["state"] == "success", {t["task_id"]: t["state"] for t in rest.task_instances(DIGITS, run_id)}
    log = rest.task_log(DIGITS, run_id, "train", 2)
    assert "re-attached" not in log and "resumed from epoch" in log, log[-4000:]
    created = _created_train_containers(stack, run_id, since)
    assert len(created) == 2 and created[0] == cid
    first, second = _attempts(stack, run_id)
    assert second["resumed_from"]["checkpoint"] == first["last_checkpoint"]
    assert second["end_step"] == second["target_steps"]


def test_clear_of_train_on_a_finished_run_keeps_history_and_finishes_at_once(stack, rest):
    run_id = rest.trigger(DIGITS, conf={"epochs": 2, "batch_size": 100, "seed": 5})
    assert rest.wait_for_run(DIGITS, run_id, timeout=900)["state"] == "success"
    before = {t["task_id"]: t["try_number"] for t in rest.task_instances(DIGITS, run_id)}
    rest.request("POST", f"dags/{DIGITS}/clearTaskInstances",
                 json={"dag_run_id": run_id, "task_ids": ["train"], "include_downstream": True,
                       "only_failed": False, "dry_run": False})
    run = rest.wait_for_run(DIGITS, run_id, timeout=900)
    assert run["state"] == "success" and run["dag_run_id"] == run_id
    after = {t["task_id"]: t["try_number"] for t in rest.task_instances(DIGITS, run_id)}
    assert after["train"] == before["train"] + 1 and after["evaluate"] == before["evaluate"] + 1
    assert after["prep"] == before["prep"], "clearing train must not rerun prep"
    assert [t["try_number"] for t in _tries(rest, run_id, "train")] == [1, 2]
    # the earlier container is gone, so the new try starts one that resumes at the end: no step trained
    first, second = _attempts(stack, run_id)
    assert second["resumed_from"]["step"] == first["end_step"] == second["target_steps"]
    assert second["steps_run"] == 0



def _crash_engine_mid_training(stack, rest, run_id: str, *, live_restore: bool) -> tuple[str, float]:
    """Wait for a checkpoint mid-training, then crash and restart the TLS engine.

    Returns the training container's id and when the engine came back (an engine keeps its event
    log in memory, so only the restarted engine's events can be asked for).
    """
    rest.wait_for_task(DIGITS, run_id, "train", {"running"}, timeout=600)
    _wait(lambda: (_attempts(stack, run_id) or [{}])[-1].get("last_checkpoint"), 600, "a checkpoint mid-training")
    (container,) = [c for c in _train_containers(stack, run_id) if c["State"] == "running"]
    stack.restart_engine(live_restore=live_restore)
    return container["ID"], time.time() - 1


def test_engine_crash_without_live_restore_the_retry_resumes_from_the_checkpoint(stack, rest):
    """(9) The engine dies mid-training and comes back without live-restore: it stops the container,
    the task fails once, and its retry resumes from the last checkpoint."""
    run_id = rest.trigger(DIGITS, conf=CONF)
    cid, restarted = _crash_engine_mid_training(stack, rest, run_id, live_restore=False)
    run = rest.wait_for_run(DIGITS, run_id, timeout=900)
    assert run["state"] == "success", {t["task_id"]: t["state"] for t in rest.task_instances(DIGITS, run_id)}
    assert [t["state"] for t in _tries(rest, run_id, "train")] == ["failed", "success"]
    log = rest.task_log(DIGITS, run_id, "train", 2)
    assert "re-attached" not in log and "resumed from epoch" in log, log[-4000:]
    created = _created_train_containers(stack, run_id, restarted)
    assert len(created) == 1 and created[0] != cid, (cid, created)
    first, second = _attempts(stack, run_id)
    assert second["resumed_from"]["checkpoint"] == first["last_checkpoint"]
    assert second["end_step"] == second["target_steps"]


def test_engine_crash_with_live_restore_the_container_survives_and_the_retry_reattaches(stack, rest):
    """(9) The same crash with live-restore: the container trains on, and the retry re-attaches to it."""
    run_id = rest.trigger(DIGITS, conf=CONF)
    try:
        cid, restarted = _crash_engine_mid_training(stack, rest, run_id, live_restore=True)
        # Frozen until the retry has re-attached, so that training cannot end first on a slow machine.
        stack.engine_docker("pause", cid)
        try:
            _wait(lambda: "re-attached" in _log_of_try(rest, run_id, 2), 600, "the retry to re-attach")
        finally:
            stack.engine_docker("unpause", cid, check=False)
        run = rest.wait_for_run(DIGITS, run_id, timeout=900)
        assert run["state"] == "success", {t["task_id"]: t["state"] for t in rest.task_instances(DIGITS, run_id)}
        assert [t["state"] for t in _tries(rest, run_id, "train")] == ["failed", "success"]
        log = rest.task_log(DIGITS, run_id, "train", 2)
        assert f"re-attached to the running train container {cid[:12]}" in log, log[-4000:]
        assert _created_train_containers(stack, run_id, restarted) == []
        (attempt,) = _attempts(stack, run_id)
        assert attempt["status"] == "completed" and attempt["resumed_from"] is None, attempt
        assert attempt["start_step"] == 0 and attempt["end_step"] == attempt["target_steps"]
    finally:
        # the rest of the session's tests expect the engine as `make up` starts it
        stack.restart_engine(live_restore=False)
