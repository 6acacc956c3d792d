"""Resume from checkpoints on failure, proven against real kills.

Each scenario runs a DAG through Airflow (``tfpipe run`` = ``dag.test()``) with the real Docker
engine and the TF 2.9 image, and kills something for real: the training container
(``docker kill``, SIGKILL), the task's process (SIGTERM: Airflow runs ``on_kill``), or the whole
Airflow process (SIGKILL to its process group, so ``on_kill`` never runs).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import docker.errors
import pytest

from tests.conftest import REPO, dag_command, parse_summary, run_dag, write_dag

pytestmark = [pytest.mark.integration, pytest.mark.resume]

EPOCHS = 40
CKPT_EVERY = 10
TRAINING = {"model": "mlp", "epochs": EPOCHS, "batch_size": 32, "learning_rate": 0.002,
            "checkpoint_every_steps": CKPT_EVERY, "seed": 7}


class _Run(subprocess.Popen):
    """A ``tfpipe run`` whose output threads drain as it comes. Its ``--verbose`` log passes a pipe's 64 KiB
    before training starts on Airflow 3.0 (debug-level task logs), and a full pipe would stall the run
    there; :meth:`communicate` waits and returns what was drained."""

    def __init__(self, cmd, **kwargs):
        super().__init__(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        self._drained: dict[str, list[str]] = {"out": [], "err": []}
        self._drains = [threading.Thread(target=self._drain, args=(stream, self._drained[key]), daemon=True)
                        for key, stream in (("out", self.stdout), ("err", self.stderr))]
        for drain in self._drains:
            drain.start()

    @staticmethod
    def _drain(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line)

    def communicate(self, input=None, timeout=None):  # noqa: A002 -- Popen's own signature
        self.wait(timeout=timeout)
        for drain in self._drains:
            drain.join(timeout=30)
        return "".join(self._drained["out"]), "".join(self._drained["err"])


def _wait_for(predicate, timeout: float, what: str, poll: float = 0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _run_dir(home: Path, dag_id: str) -> Path | None:
    runs = sorted((home / "work" / "runs" / dag_id).glob("*")) if (home / "work" / "runs" / dag_id).exists() else []
    return runs[-1] if runs else None


def _training_container(client, dag_id: str):
    found = client.containers.list(filters={"label": [f"tfpipe.dag_id={dag_id}", "tfpipe.stage=train"],
                                            "status": "running"})
    found = [c for c in found if "tfpipe.role" not in c.labels]
    return found[0] if found else None


def _checkpointed_mid_training(home: Path, dag_id: str, min_epochs: int = 2):
    """True once the running attempt has saved checkpoints and finished ``min_epochs`` epochs."""
    run_dir = _run_dir(home, dag_id)
    if not run_dir:
        return False
    try:
        attempts = json.loads((run_dir / "attempts.json").read_text())
    except (OSError, ValueError):
        return False
    current = attempts[-1] if attempts else {}
    return current.get("status") == "running" and current.get("last_checkpoint") and \
        current.get("epochs_run", 0) >= min_epochs


def _checkpoints_on_disk(home: Path, dag_id: str, under: str = "") -> list[int]:
    """The steps of the checkpoints in the run's checkpoint directory (or its ``under`` folder).

    Read once the container is dead: a SIGKILL can land between writing a checkpoint and recording
    it in ``attempts.json``, so the record may name the one before; the files are what a resume sees.
    """
    ckpt_dir = _run_dir(home, dag_id) / "train" / "checkpoints" / under
    return sorted(int(p.name[len("ckpt-"):-len(".index")]) for p in ckpt_dir.glob("ckpt-*.index"))


def _newest_whole_checkpoint(home: Path, dag_id: str, on_disk: list[int], log: str) -> int:
    """The newest of ``on_disk`` (the steps on disk once the container died) a retry can restore.

    TensorFlow renames a checkpoint's data into place but writes its index in place, last, so a
    kill inside that write leaves the newest checkpoint unreadable: the retry sets it aside in
    ``corrupt/``, says so in its log, and takes the one before. No older one may be set aside.
    """
    set_aside = _checkpoints_on_disk(home, dag_id, under="corrupt")
    assert set_aside in ([], on_disk[-1:]), (set_aside, on_disk)
    if set_aside:
        assert f"ckpt-{set_aside[0]} cannot be restored" in log and "falling back" in log, log[-6000:]
    return max(set(on_disk) - set(set_aside))


class _TrainingContainerSampler(threading.Thread):
    """Samples how many training containers of a DAG run at once, and which ever existed.

    Only containers created since the sampler was: one an earlier, failed test left behind (its
    labels are the same DAG's) is not this test's.
    """

    def __init__(self, client, dag_id: str):
        super().__init__(daemon=True)
        self.client, self.dag_id = client, dag_id
        self.since = int(time.time()) - 1  # the engine's Created is whole seconds
        self.max_running = 0
        self.ids: set[str] = set()
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            # the low-level list: no per-container inspect that races with a removal
            found = [c for c in self.client.api.containers(
                all=True, filters={"label": [f"tfpipe.dag_id={self.dag_id}", "tfpipe.stage=train"]})
                if "tfpipe.role" not in (c.get("Labels") or {}) and c["Created"] >= self.since]
            self.ids.update(c["Id"] for c in found)
            self.max_running = max(self.max_running, len([c for c in found if c["State"] in ("running", "paused")]))
            time.sleep(0.1)


def _gone_or_exited(container) -> bool:
    """Whether ``container`` is gone, or exited (what a finished try leaves is its own to remove)."""
    try:
        container.reload()
    except docker.errors.NotFound:
        return True
    return container.status == "exited"


def _task_history(dag_id: str, run_id: str) -> dict[str, list[tuple[int, str]]]:
    """``{task_id: [(try_number, state), ...]}`` of the run's earlier tries (Airflow's TI history)."""
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.utils.session import create_session
    from sqlalchemy import select

    history: dict[str, list[tuple[int, str]]] = {}
    with create_session() as session:
        rows = session.scalars(select(TaskInstanceHistory).where(
            TaskInstanceHistory.dag_id == dag_id, TaskInstanceHistory.run_id == run_id))
        for row in rows:
            history.setdefault(row.task_id, []).append((row.try_number, str(getattr(row.state, "value", row.state))))
    return {k: sorted(v) for k, v in history.items()}


def _attempts(home: Path, model_dir: str) -> list[dict]:
    return json.loads((Path(model_dir) / "metadata.json").read_text())["attempts"]


def _epochs_in_history(home: Path, dag_id: str) -> list[int]:
    return [h["epoch"] for h in json.loads((_run_dir(home, dag_id) / "metrics.json").read_text())]


@pytest.mark.compat
def test_container_killed_mid_training_resumes_on_retry(tfpipe_home, trainer_image, docker_client, tmp_path):
    dags = tmp_path / "dags"
    write_dag(dags, "resume_kill", training=TRAINING, retries=2)
    write_dag(dags, "resume_reference", training=TRAINING, retries=0)

    cmd, env = dag_command("resume_kill", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    proc = _Run(cmd, env=env, cwd=REPO)
    try:
        container = _wait_for(lambda: _training_container(docker_client, "resume_kill"), 240, "the training container")
        _wait_for(lambda: _checkpointed_mid_training(tfpipe_home, "resume_kill"), 240, "a checkpoint mid-training")
        container.kill()  # SIGKILL: no chance to save anything more
        on_disk = _checkpoints_on_disk(tfpipe_home, "resume_kill")  # before the retry writes any
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary, log = parse_summary(out, err, proc.returncode), out + err
    assert summary["state"] == "success", log[-6000:]
    assert summary["tasks"]["train"]["try_number"] == 2
    assert summary["tasks"]["prep"]["try_number"] == 1, "retrying training must not rerun prep"
    assert "resumed from epoch" in log

    first, second = _attempts(tfpipe_home, summary["model_dir"])
    assert first["status"] == "interrupted" and second["status"] == "completed"
    assert second["resumed_from"]["step"] > 0
    # the newest whole checkpoint was used: work lost is at most one checkpoint interval (the killed
    # try's record names that one, or the one before when the kill came between writing and
    # recording it)
    newest = _newest_whole_checkpoint(tfpipe_home, "resume_kill", on_disk, log)
    assert second["resumed_from"]["checkpoint"].endswith(f"/ckpt-{newest}")
    recorded = int(Path(first["last_checkpoint"]).name.split("-")[-1])
    assert recorded <= newest <= recorded + CKPT_EVERY, (recorded, newest)
    assert second["start_step"] == second["resumed_from"]["step"]
    # epochs add up to the plan: every epoch recorded once, none trained twice but the interrupted one
    assert _epochs_in_history(tfpipe_home, "resume_kill") == list(range(1, EPOCHS + 1))
    assert first["epochs_run"] + second["epochs_run"] == EPOCHS
    assert second["end_step"] == second["target_steps"]

    # same seed, uninterrupted: the resumed model is as good (batch order is replayed exactly)
    reference, ref_log = run_dag("resume_reference", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert reference["state"] == "success", ref_log[-4000:]
    assert summary["metrics"]["accuracy"] == pytest.approx(reference["metrics"]["accuracy"], abs=0.02)


@pytest.mark.compat
def test_worker_killed_then_cleared_reattaches_to_the_running_container(
        tfpipe_home, trainer_image, docker_client, tmp_path):
    """The worker dies mid-training; the re-run's train try re-attaches to the container that still runs.

    Before Airflow 3.3 (no ``ResumableJobMixin`` in Airflow; the compat run) a try cannot re-attach:
    the re-run removes the still-running container and resumes from its newest checkpoint, with no
    error and no traceback, and never two training containers at once.
    """
    from tfpipe.compat import has_resumable_jobs

    reattaches = has_resumable_jobs()
    dags = tmp_path / "dags"
    write_dag(dags, "reattach_worker", training=TRAINING, retries=2)
    cmd, env = dag_command("reattach_worker", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    proc = _Run(cmd, env=env, cwd=REPO,
                            start_new_session=True)
    sampler = _TrainingContainerSampler(docker_client, "reattach_worker")
    sampler.start()
    orphan = None
    try:
        orphan = _wait_for(lambda: _training_container(docker_client, "reattach_worker"), 240,
                           "the training container")
        _wait_for(lambda: _checkpointed_mid_training(tfpipe_home, "reattach_worker"), 240, "a checkpoint mid-training")
        os.killpg(proc.pid, signal.SIGKILL)  # the worker dies; on_kill never runs
        proc.communicate(timeout=60)
        orphan.reload()
        assert orphan.status == "running", "the orphaned training container outlives its worker"
        run_id = orphan.labels["tfpipe.run_id"]
        # Frozen until the re-run has re-attached (or, before Airflow 3.3, removed it), so that on a
        # slow machine training cannot end before the new try looks (a paused container is as alive
        # as a running one).
        orphan.pause()
        on_disk = _checkpoints_on_disk(tfpipe_home, "reattach_worker")  # frozen: no newer one comes
        # the UI's Clear of train (and downstream), in one process: same run, next try number
        cmd, env = dag_command("reattach_worker", None, home=tfpipe_home, image=trainer_image, dags_folder=dags,
                               rerun=run_id, rerun_tasks=["train"])
        rerun = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        err_lines: list[str] = []
        looked = threading.Event()
        seen = (f"re-attached to the running train container {orphan.id[:12]}" if reattaches
                else "removing leftover container")

        def read_stderr():
            for line in rerun.stderr:
                err_lines.append(line)
                if seen in line:
                    looked.set()

        reader = threading.Thread(target=read_stderr, daemon=True)
        reader.start()
        try:
            deadline = time.time() + 600
            while not looked.wait(1) and rerun.poll() is None and time.time() < deadline:
                pass
            assert looked.is_set(), "".join(err_lines)[-6000:]
        finally:
            if reattaches:
                orphan.unpause()
        out = rerun.stdout.read()
        rerun.wait(timeout=600)
        reader.join(timeout=30)
        log = out + "".join(err_lines)
        summary = parse_summary(out, "".join(err_lines), rerun.returncode)
    finally:
        sampler.stop.set()
        sampler.join()
        if orphan is not None and not _gone_or_exited(orphan):
            orphan.remove(force=True)  # a failed test leaves no paused container to later ones
    assert summary["state"] == "success", log[-6000:]
    assert summary["run_id"] == run_id
    assert sampler.max_running == 1, "two training containers ran at once"
    # the run kept its history: train's first try is recorded, the re-run's is the second
    assert summary["tasks"]["train"]["try_number"] == 2
    assert summary["tasks"]["prep"]["try_number"] == 1, "clearing train must not rerun prep"
    assert _task_history("reattach_worker", run_id)["train"] == [(1, "failed")]
    if not reattaches:
        assert "Traceback" not in log, log[-6000:]
        with pytest.raises(docker.errors.NotFound):
            docker_client.containers.get(orphan.id)
        assert len(sampler.ids) == 2 and orphan.id in sampler.ids, sampler.ids
        last = _attempts(tfpipe_home, summary["model_dir"])[-1]
        assert last["status"] == "completed" and last["resumed_from"]["step"] > 0, last
        # from the newest checkpoint the removed container wrote: at most one interval of steps lost
        # (paused, then removed, it can have been inside a checkpoint's write)
        newest = _newest_whole_checkpoint(tfpipe_home, "reattach_worker", on_disk, log)
        assert last["resumed_from"]["checkpoint"].endswith(f"/ckpt-{newest}"), (newest, last)
        assert last["start_step"] == last["resumed_from"]["step"] and last["end_step"] == last["target_steps"]
        return
    assert f"re-attached to the running train container {orphan.id[:12]}" in log, log[-6000:]
    assert "removing leftover container" not in log
    assert sampler.ids == {orphan.id}, "a second training container was created"
    # one attempt trained every step exactly once: the trainer never restarted
    (attempt,) = _attempts(tfpipe_home, summary["model_dir"])
    assert attempt["status"] == "completed" and attempt["resumed_from"] is None, attempt
    assert attempt["start_step"] == 0 and attempt["end_step"] == attempt["target_steps"]
    assert _epochs_in_history(tfpipe_home, "reattach_worker") == list(range(1, EPOCHS + 1))
    assert "resumed from epoch" not in log
    with pytest.raises(docker.errors.NotFound):
        orphan.reload()  # removed once its result was read


def test_task_killed_by_airflow_stops_its_container_which_checkpoints_then_is_removed(
        tfpipe_home, trainer_image, docker_client, tmp_path):
    """SIGTERM to the task's process (what Airflow's supervisor sends a task it kills): Airflow calls
    the operator's on_kill, which stops the container (SIGTERM: it checkpoints at its current step
    and exits 143) and removes it; the retry then resumes from exactly that checkpoint."""
    dags = tmp_path / "dags"
    epochs = 8  # enough to be killed mid-training; the retry then has little left to do
    write_dag(dags, "resume_on_kill", training={**TRAINING, "epochs": epochs}, retries=1)
    cmd, env = dag_command("resume_on_kill", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    proc = _Run(cmd, env=env, cwd=REPO)
    try:
        container = _wait_for(lambda: _training_container(docker_client, "resume_on_kill"), 240,
                              "the training container")
        _wait_for(lambda: _checkpointed_mid_training(tfpipe_home, "resume_on_kill"), 240, "a checkpoint mid-training")
        proc.send_signal(signal.SIGTERM)  # the task runner's handler calls task.on_kill()
        _wait_for(lambda: not docker_client.api.containers(all=True, filters={"id": container.id}), 60,
                  "on_kill to remove the training container")
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    summary, log = parse_summary(out, err, proc.returncode), out + err
    assert f"on_kill: stopping and removing {container.id[:12]}" in log
    with pytest.raises(docker.errors.NotFound):
        container.reload()
    first, second = json.loads((_run_dir(tfpipe_home, "resume_on_kill") / "attempts.json").read_text())
    # the trainer itself ended try 1 (SIGTERM handler): a SIGKILLed try has no end time
    assert first["status"] == "interrupted" and first["end_time"], first
    stopped_at = int(Path(first["last_checkpoint"]).name.split("-")[-1])
    assert first["start_step"] + first["steps_run"] == stopped_at, "the checkpoint is the step where it stopped"
    assert second["resumed_from"]["checkpoint"] == first["last_checkpoint"]
    assert second["resumed_from"]["step"] == stopped_at
    assert summary["state"] == "success", log[-6000:]
    assert summary["tasks"]["train"]["try_number"] == 2
    assert _epochs_in_history(tfpipe_home, "resume_on_kill") == list(range(1, epochs + 1))


def test_cleared_after_retries_ran_out_resumes_and_skips_corrupt_checkpoint(
        tfpipe_home, trainer_image, docker_client, tmp_path):
    dags = tmp_path / "dags"
    write_dag(dags, "resume_clear", training=TRAINING, retries=0)
    cmd, env = dag_command("resume_clear", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    proc = _Run(cmd, env=env, cwd=REPO)
    try:
        container = _wait_for(lambda: _training_container(docker_client, "resume_clear"), 240, "the training container")
        _wait_for(lambda: _checkpointed_mid_training(tfpipe_home, "resume_clear", min_epochs=3), 240,
                  "checkpoints mid-training")
        container.kill()
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    failed = parse_summary(out, err, proc.returncode)
    assert failed["state"] == "failed" and failed["tasks"]["train"]["state"] == "failed"

    # the newest checkpoint is damaged (a disk or copy went wrong): the next attempt falls back
    ckpt_dir = _run_dir(tfpipe_home, "resume_clear") / "train" / "checkpoints"
    newest = _checkpoints_on_disk(tfpipe_home, "resume_clear")[-1]
    shards = sorted(ckpt_dir.glob(f"ckpt-{newest}.data-*"))
    assert shards, sorted(p.name for p in ckpt_dir.iterdir())
    for shard in shards:
        shard.write_bytes(shard.read_bytes()[:16])

    summary, log = run_dag("resume_clear", None, home=tfpipe_home, image=trainer_image, dags_folder=dags,
                           rerun=failed["run_id"])
    assert summary["state"] == "success", log[-6000:]
    assert summary["run_id"] == failed["run_id"]
    # the container of the failed try is gone from the engine's view as running: a new one resumes
    assert "re-attached" not in log and "Prior job in terminal state" in log
    assert summary["tasks"]["train"]["try_number"] == 2
    assert _task_history("resume_clear", failed["run_id"])["train"] == [(1, "failed")]
    assert "cannot be restored" in log and "resumed from epoch" in log
    first, second = _attempts(tfpipe_home, summary["model_dir"])
    assert not second["resumed_from"]["checkpoint"].endswith(f"/ckpt-{newest}")
    assert 0 < second["resumed_from"]["step"] < newest
    assert _epochs_in_history(tfpipe_home, "resume_clear") == list(range(1, EPOCHS + 1))


def test_new_run_starts_fresh_and_warm_start_says_so(tfpipe_home, trainer_image, tmp_path):
    dags = tmp_path / "dags"
    write_dag(dags, "resume_fresh", training={**TRAINING, "epochs": 3})
    first, log1 = run_dag("resume_fresh", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert first["state"] == "success", log1[-4000:]
    second, log2 = run_dag("resume_fresh", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert second["state"] == "success", log2[-4000:]
    assert "starting from scratch" in log2 and "resumed from" not in log2
    assert "cache hit" in log2, "a new run on unchanged data reuses prep's output"
    warm, log3 = run_dag("resume_fresh", {"warm_start": True}, home=tfpipe_home, image=trainer_image,
                         dags_folder=dags)
    assert warm["state"] == "success", log3[-4000:]
    assert "warm start: model weights initialised from version" in log3
