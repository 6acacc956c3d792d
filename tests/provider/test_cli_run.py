"""`tfpipe run` against the real metadata DB: missing pools, re-running only the failed tasks, `latest`.

The DAGs run here are tiny DAGs of Python tasks (no containers): what is proven is the command's
own work around ``dag.test()`` (pools, the Clear of ``--rerun --only-failed``) and how the debug
commands pick a run, not the stages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO, parse_summary
from tfpipe import contract
from tfpipe.cli.common import resolve_run
from tfpipe.cli.run import ensure_pools
from tfpipe.config import PipelineConfig
from tfpipe.dag_factory import training_pipeline

TINY_DAG = '''"""A DAG of Python tasks written by tests/provider/test_cli_run.py."""
from pathlib import Path

import pendulum
from airflow.sdk import DAG, task

MARKS = Path({marks!r})


def record(name):
    with open(MARKS / name, "a") as f:
        f.write("ran\\n")


with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    @task(retries=0, pool={pool!r})
    def steady():
        record("steady")

    @task(retries=0)
    def flaky():
        record("flaky")
        if not (MARKS / "fixed").exists():
            raise RuntimeError("fails until the test writes MARKS/fixed")

    @task(retries=0)
    def after_flaky():
        record("after_flaky")

    @task(retries=0)
    def beside():
        record("beside")

    steady() >> flaky() >> after_flaky()
    beside()
'''


def _tiny_dag(tmp_path: Path, dag_id: str, pool: str = "default_pool") -> tuple[Path, Path]:
    """(dags folder, marks dir) of a DAG whose ``flaky`` fails until ``marks/fixed`` exists."""
    dags, marks = tmp_path / "dags", tmp_path / "marks"
    dags.mkdir()
    marks.mkdir()
    (dags / f"{dag_id}.py").write_text(TINY_DAG.format(marks=str(marks), dag_id=dag_id, pool=pool))
    return dags, marks


def _tfpipe_run(dag_id: str, dags: Path, *extra: str) -> tuple[dict, str, int]:
    """``tfpipe run`` in a fresh interpreter, on this test session's metadata DB."""
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "tfpipe.cli", "run", dag_id, "--dags-folder", str(dags), *extra],
                          env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    return parse_summary(proc.stdout, proc.stderr, proc.returncode), proc.stderr, proc.returncode


def _runs(marks: Path, name: str) -> int:
    path = marks / name
    return len(path.read_text().splitlines()) if path.exists() else 0


# --- pools ---------------------------------------------------------------------------------------

def _pool_slots(name: str) -> int | None:
    from airflow.models.pool import Pool

    pool = Pool.get_pool(name)
    return None if pool is None else pool.slots


def _drop_pool(name: str) -> None:
    from airflow.models.pool import Pool

    if Pool.get_pool(name) is not None:
        Pool.delete_pool(name)


def test_ensure_pools_creates_the_gpu_pool_with_one_slot_and_leaves_existing_pools_alone():
    from airflow.models.pool import Pool

    missing, existing = f"tfpipe_gpu_{uuid.uuid4().hex[:8]}", f"tfpipe_gpu_{uuid.uuid4().hex[:8]}"
    default_slots = _pool_slots(Pool.DEFAULT_POOL_NAME)
    settings = {
        "image": {"ref": "tfpipe/trainer:1f14aed53083"},
        "volumes": {"data": "/srv/ml/data", "work": "/srv/ml/work", "models": "/srv/ml/models"},
        "data": {"path": "digits/digits.csv"},
        "export": {"model_name": "digits"},
    }
    try:
        Pool.create_or_update_pool(existing, 3, "set by an operator", False)
        dags = [training_pipeline(PipelineConfig.from_dict({"dag_id": dag_id, "gpu_pool": pool, **settings}))
                for dag_id, pool in (("pools_missing", missing), ("pools_existing", existing))]
        assert [dag.get_task("train").pool for dag in dags] == [missing, existing]
        assert _pool_slots(missing) is None, "building the DAG creates no pool"
        for dag in dags:
            ensure_pools(dag)
        # one slot: one training job at a time on the GPUs, as `airflow pools set gpu 1` in the README
        assert _pool_slots(missing) == 1
        assert Pool.get_pool(missing).description == "created by tfpipe: one training job at a time"
        assert _pool_slots(existing) == 3, "a pool that exists keeps the slots its operator gave it"
        assert Pool.get_pool(existing).description == "set by an operator"
        assert _pool_slots(Pool.DEFAULT_POOL_NAME) == default_slots, "the default pool is never touched"
    finally:
        _drop_pool(missing)
        _drop_pool(existing)


def test_tfpipe_run_creates_the_missing_pool_of_a_task_and_runs_it(tmp_path):
    pool = f"tfpipe_cli_pool_{uuid.uuid4().hex[:8]}"
    dag_id = "tfpipe_cli_pool"
    dags, marks = _tiny_dag(tmp_path, dag_id, pool=pool)
    (marks / "fixed").write_text("")
    assert _pool_slots(pool) is None
    try:
        summary, log, code = _tfpipe_run(dag_id, dags)
        assert code == 0 and summary["state"] == "success", log[-4000:]
        assert summary["tasks"]["steady"]["state"] == "success" and _runs(marks, "steady") == 1
        assert _pool_slots(pool) == 1, "tfpipe run created the pool the task uses"
    finally:
        _drop_pool(pool)


# --- --rerun --only-failed -----------------------------------------------------------------------

def test_rerun_only_failed_reruns_the_failed_task_and_its_upstream_failed_ones_only(tmp_path):
    dag_id = "tfpipe_cli_only_failed"
    dags, marks = _tiny_dag(tmp_path, dag_id)
    first, log, code = _tfpipe_run(dag_id, dags)
    assert code == 1 and first["state"] == "failed", log[-4000:]
    states = {task: info["state"] for task, info in first["tasks"].items()}
    assert states == {"steady": "success", "flaky": "failed", "after_flaky": "upstream_failed",
                      "beside": "success"}, states

    (marks / "fixed").write_text("")
    again, log, code = _tfpipe_run(dag_id, dags, "--rerun", first["run_id"], "--only-failed")
    assert code == 0 and again["state"] == "success", log[-4000:]
    assert again["run_id"] == first["run_id"], "the same run, not a new one"
    cleared = next(line for line in log.splitlines() if line.startswith("tfpipe: cleared "))
    assert sorted(cleared[len("tfpipe: cleared "):].split(", ")) == \
        ["after_flaky (after try 0)", "flaky (after try 1)"], cleared
    assert {task: info["state"] for task, info in again["tasks"].items()} == dict.fromkeys(states, "success")
    # the failed task ran again (a new try), the one that never ran ran once, the succeeded ones not again
    assert again["tasks"]["flaky"]["try_number"] == 2 and _runs(marks, "flaky") == 2
    assert _runs(marks, "after_flaky") == 1
    for kept in ("steady", "beside"):
        assert again["tasks"][kept]["try_number"] == first["tasks"][kept]["try_number"] == 1, kept
        assert _runs(marks, kept) == 1, f"{kept} succeeded before and must not run again"


def _history(dag_id: str, run_id: str) -> dict[str, list[tuple[int, str]]]:
    """Each task's earlier tries in the run's task instance history: ``[(try_number, state), ...]``."""
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(TaskInstanceHistory).where(
            TaskInstanceHistory.dag_id == dag_id, TaskInstanceHistory.run_id == run_id))
        history: dict[str, list[tuple[int, str]]] = {}
        for row in rows:
            history.setdefault(row.task_id, []).append((row.try_number, str(getattr(row.state, "value", row.state))))
    return {task: sorted(tries) for task, tries in history.items()}


def test_a_rerun_of_the_whole_run_keeps_its_id_and_history_and_gives_every_task_its_next_try(tmp_path):
    """``--rerun RUN_ID`` alone clears every task of the run: the same run, each cleared try kept in
    the task instance history (the upstream-failed one's try 0 too, as the UI's Clear keeps it),
    every task run again as try 2 (the one that never ran as try 1)."""
    dag_id = "tfpipe_cli_rerun_all"
    dags, marks = _tiny_dag(tmp_path, dag_id)
    first, log, code = _tfpipe_run(dag_id, dags)
    assert code == 1 and first["tasks"]["flaky"]["state"] == "failed", log[-4000:]
    assert _history(dag_id, first["run_id"]) == {}

    (marks / "fixed").write_text("")
    again, log, code = _tfpipe_run(dag_id, dags, "--rerun", first["run_id"])
    assert code == 0 and again["state"] == "success", log[-4000:]
    assert again["run_id"] == first["run_id"], "the same run, not a new one"
    assert {task: info["try_number"] for task, info in again["tasks"].items()} == {
        "steady": 2, "flaky": 2, "beside": 2, "after_flaky": 1}
    assert _history(dag_id, first["run_id"]) == {
        "steady": [(1, "success")], "flaky": [(1, "failed")], "beside": [(1, "success")],
        "after_flaky": [(0, "upstream_failed")]}
    assert [_runs(marks, task) for task in ("steady", "flaky", "beside", "after_flaky")] == [2, 2, 2, 1]


EXIT_DAG = '''"""A DAG of one Python task that marks, per process, how the process ends."""
import atexit
import os
import sys

import pendulum
from airflow.sdk import DAG, task

MARKS = {marks!r}


# Everything it needs is bound now: at teardown, module globals may already be gone.
def _mark(name, _open=os.open, _write=os.write, _close=os.close, _getpid=os.getpid, _marks=MARKS,
          _flags=os.O_CREAT | os.O_WRONLY):
    fd = _open(f"{{_marks}}/{{name}}-{{_getpid()}}", _flags, 0o644)
    _write(fd, b"ran")
    _close(fd)


class _FreedAtTeardown:
    def __del__(self, _mark=_mark):
        _mark("teardown")


if not hasattr(sys, "_tfpipe_exit_probe"):  # once per process, however often it parses this file
    sys._tfpipe_exit_probe = _FreedAtTeardown()  # only the interpreter's teardown frees it
    atexit.register(_mark, "atexit")

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    @task(retries=0)
    def one():
        # A process pool left running with a live worker, as OpenLineage's listener leaves one
        # in the process that ran the DAG: it must not keep that process from ending.
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        sys._tfpipe_exit_pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
        sys._tfpipe_exit_pool.submit(os.getpid).result()
        # and a thread that is not a daemon, still working when the run ends: it must be joined
        import threading
        import time

        threading.Thread(target=lambda: (time.sleep(1), _mark("thread")), daemon=False).start()
        _mark("task")

    one()
'''


def test_the_command_ends_its_process_after_atexit_without_tearing_the_interpreter_down(tmp_path):
    """``tfpipe run`` (``python -m tfpipe.cli``) joins the threads and stops the process pools a task
    left running, runs the process's ``atexit`` handlers and delivers its summary line through a pipe
    (stdout not unbuffered), then ends the process without the interpreter's teardown, which freed its
    objects one by one for 2-3 s after a DAG run."""
    dag_id = f"exit_{uuid.uuid4().hex[:8]}"
    dags, marks = tmp_path / "dags", tmp_path / "marks"
    dags.mkdir()
    marks.mkdir()
    (dags / f"{dag_id}.py").write_text(EXIT_DAG.format(marks=str(marks), dag_id=dag_id))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags)
    proc = subprocess.Popen([sys.executable, "-m", "tfpipe.cli", "run", dag_id, "--dags-folder", str(dags)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the pool's worker too: it holds the pipes open
        stdout, stderr = proc.communicate()
        pytest.fail(f"tfpipe run did not end (its summary: {stdout.strip()[-300:]!r}): {stderr[-3000:]}")
    summary = parse_summary(stdout, stderr, proc.returncode)
    assert proc.returncode == 0 and summary["state"] == "success", stderr[-4000:]
    assert (marks / f"task-{proc.pid}").exists(), "dag.test runs the task (and its process pool) in this process"
    assert (marks / f"atexit-{proc.pid}").exists(), "the atexit handlers must run"
    assert (marks / f"thread-{proc.pid}").exists(), "threads that are not daemons must be joined"
    assert not (marks / f"teardown-{proc.pid}").exists(), "the interpreter's teardown must be skipped"
    # the same DAG file in a plain interpreter is torn down and writes the mark: the probe works
    subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(dags / (dag_id + '.py'))!r})"],
                   env=env, check=True, timeout=120, cwd=REPO, capture_output=True)
    assert {p.name.split("-")[0] for p in marks.iterdir()} == {"task", "thread", "atexit", "teardown"}


def test_only_failed_needs_rerun():
    proc = subprocess.run([sys.executable, "-m", "tfpipe.cli", "run", "any_dag", "--only-failed"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "--only-failed choose what --rerun RUN_ID clears" in proc.stderr


# --- `latest` of tfpipe shell / tfpipe tensorboard ----------------------------------------------

def test_latest_is_the_run_dir_modified_last_not_the_last_name(tmp_path):
    dag_id = f"tfpipe_latest_{uuid.uuid4().hex[:8]}"  # no runs in the metadata DB: the run dirs decide
    work = tmp_path / "work"
    root = work / "runs" / contract.safe_name(dag_id)
    # created in this order; names sort opposite to their modification times
    ages = {"scheduled__2026-12-03T03_00_00_00_00": 300, "manual__2026-12-02T10_00_00_00_00": 200,
            "manual__2026-12-01T09_00_00_00_00": 10, "backfill__2026-11-30T00_00_00_00_00": 100}
    now = 1_800_000_000
    for name, age in ages.items():
        (root / name).mkdir(parents=True)
        os.utime(root / name, (now - age, now - age))
    stray = root / "notes.txt"  # a file, not a run dir, touched after every run
    stray.write_text("not a run")
    os.utime(stray, (now, now))

    for asked in ("latest", None):
        run_id, dag_run = resolve_run(dag_id, asked, str(work))
        assert (run_id, dag_run) == ("manual__2026-12-01T09_00_00_00_00", None), asked
    os.utime(root / "backfill__2026-11-30T00_00_00_00_00", (now - 1, now - 1))
    assert resolve_run(dag_id, "latest", str(work))[0] == "backfill__2026-11-30T00_00_00_00_00"
    # a named run is that run, whatever is newest
    assert resolve_run(dag_id, "scheduled__2026-12-03T03_00_00_00_00", str(work))[0] == \
        "scheduled__2026-12-03T03_00_00_00_00"


def test_latest_without_run_dirs_or_runs_says_where_it_looked(tmp_path):
    dag_id = f"tfpipe_latest_{uuid.uuid4().hex[:8]}"
    with pytest.raises(SystemExit) as info:
        resolve_run(dag_id, "latest", str(tmp_path / "work"))
    message = str(info.value)
    assert f"no run of {dag_id} found" in message and str(tmp_path / "work" / "runs") in message

