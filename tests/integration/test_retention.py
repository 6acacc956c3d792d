"""The cleanup task through Airflow: it never removes a run the metadata DB holds as active."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.conftest import REPO, dag_command, run_dag, write_dag
from tests.engine_watch import InspectOnCreate

pytestmark = pytest.mark.integration

DAG_ID = "retention_active"


def _set_states(run_id: str, run_state: str, task_states: dict[str, str]) -> None:
    """Change a run's state in the metadata DB, as a scheduler would (a task waiting for its retry)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        dag_run = session.scalars(select(DagRun).where(DagRun.dag_id == DAG_ID, DagRun.run_id == run_id)).one()
        dag_run.state = run_state
        for ti in session.scalars(select(TaskInstance).where(TaskInstance.dag_id == DAG_ID,
                                                             TaskInstance.run_id == run_id)):
            if ti.task_id in task_states:
                ti.state = task_states[ti.task_id]


def _cleanup_result(run_id: str) -> dict:
    """The cleanup task's XCom result (its return value), from the metadata DB."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = list(session.scalars(XComModel.get_many(run_id=run_id, dag_ids=DAG_ID, task_ids="cleanup",
                                                       key="return_value")))
        assert len(rows) == 1, f"cleanup pushed {len(rows)} return values"
        return XComModel.deserialize_value(rows[0])


def test_cleanup_keeps_active_runs_and_removes_them_once_finished(tfpipe_home, trainer_image, tmp_path,
                                                                  docker_client):
    dags = tmp_path / "dags"
    write_dag(dags, DAG_ID, training={"model": "mlp", "epochs": 1, "checkpoint_every_steps": 1000},
              evaluation={"threshold": 0.0, "tolerance": 1.0}, export={"model_name": DAG_ID, "keep_versions": 1},
              retention={"keep_runs": 1, "min_idle_minutes": 0})
    runs_dir = tfpipe_home / "work" / "runs" / DAG_ID

    def run() -> tuple[dict, str]:
        summary, log = run_dag(DAG_ID, {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
        assert summary["state"] == "success" and summary["tasks"]["cleanup"]["state"] == "success", log[-6000:]
        return summary, log

    def run_dir(summary: dict):
        from tfpipe import contract

        return runs_dir / contract.safe_name(summary["run_id"], 120)

    first, _ = run()
    assert run_dir(first).is_dir()
    # the first run now waits for a retry of train, per the metadata DB: its checkpoints must stay
    _set_states(first["run_id"], "running", {"train": "up_for_retry", "evaluate": None, "export": None})
    second, log2 = run()
    assert re.search(r"active runs \[[^\]]*" + re.escape(repr(first["run_id"])), log2), log2[-4000:]
    assert (run_dir(first) / "train" / "checkpoints").is_dir(), "an active run's dir was removed"
    assert run_dir(second).is_dir()

    # once it has failed for good it is an old run like any other: removed, and the bytes reported.
    # Cleanup runs beside training, before this run's export replaces the second run's version
    # (keep_versions=1): so the second run stays, for its kept version, until the next run.
    _set_states(first["run_id"], "failed", {"train": "failed", "evaluate": "upstream_failed",
                                            "export": "upstream_failed"})
    # the operator removes its helper when it exits: inspect it the moment the engine creates it
    helpers = InspectOnCreate(docker_client, f"tfpipe.dag_id={DAG_ID}", "tfpipe.role=retention")
    helpers.start()
    try:
        third, log3 = run()
    finally:
        inspected = list(helpers.stop().values())
    assert not helpers.missed, f"helper containers gone before they could be inspected: {helpers.missed}"
    assert sorted(p.name for p in runs_dir.iterdir()) == sorted([run_dir(second).name, run_dir(third).name])
    # one line per removal: the path, its size and the reason; then the summary with what was kept
    # (the third run as the newest and current, the second for its kept version; the one data set)
    first_rel = "runs/%s/%s" % (DAG_ID, run_dir(first).name)
    assert re.search(r"retention: removed run %s \([0-9.]+ [KM]iB\): not among the newest 1 runs, "
                     r"no kept model version, idle [0-9.]+ h" % re.escape(first_rel), log3), log3[-4000:]
    assert re.search(r"retention: removed 1 run dir\(s\) and 0 data set\(s\), freed [0-9.]+ [KM]iB; "
                     r"kept 2 run dir\(s\) and 1 data set\(s\)", log3), log3[-4000:]
    assert not run_dir(first).exists()
    # the XCom result lists what was removed (with its size and reason) and the bytes freed
    result = _cleanup_result(third["run_id"])
    assert [(r["kind"], r["path"]) for r in result["removed"]] == [("run", first_rel)]
    removed = result["removed"][0]
    assert removed["bytes"] > 0 and removed["reasons"][0].startswith("not among the newest 1 runs")
    assert result["freed_bytes"] == removed["bytes"] and result["kept"] == 3 and result["dry_run"] is False
    # the helper: no network, the work volume read-write, the models volume read-only; and gone
    assert len(inspected) == 1, f"{len(inspected)} retention helpers created in one run"
    helper = inspected[0]
    assert helper["Config"]["Labels"]["tfpipe.role"] == "retention"
    assert helper["HostConfig"]["NetworkMode"] == "none"
    mounts = {m["Destination"]: m for m in helper["Mounts"]}
    assert set(mounts) == {"/work", "/models"}, mounts
    assert mounts["/work"]["RW"] is True and mounts["/work"]["Source"] == str(tfpipe_home / "work")
    assert mounts["/models"]["RW"] is False and mounts["/models"]["Source"] == str(tfpipe_home / "models")
    assert not docker_client.containers.list(all=True, filters={"id": helper["Id"]}), "the helper was left behind"
    fourth, log4 = run()
    assert sorted(p.name for p in runs_dir.iterdir()) == sorted([run_dir(third).name, run_dir(fourth).name])
    assert re.search(r"retention: removed 1 run dir\(s\) and 0 data set\(s\), freed [0-9.]+ [KM]iB", log4)
    datasets = [p.name for p in (tfpipe_home / "work" / "datasets").iterdir() if not p.name.startswith(".")]
    assert len(datasets) == 1, "one data set (unchanged data): kept as the newest and as the kept run's"


def test_a_rerun_after_its_run_dir_was_removed_prepares_again_and_trains_from_scratch(
        tfpipe_home, trainer_image, tmp_path):
    """A finished run whose run dir and data set retention removed: clearing ``train`` alone fails
    for good (its data set pointer went with the run dir, and prep is not re-run); a re-run of the
    whole run succeeds, prep recreating the data set and train starting from scratch."""
    import shutil

    from tfpipe import contract

    dag_id = "retention_rerun"
    dags = tmp_path / "dags"
    write_dag(dags, dag_id, training={"model": "mlp", "epochs": 1, "checkpoint_every_steps": 1000},
              evaluation={"threshold": 0.0, "tolerance": 1.0})
    # the run's conf (2 epochs against the DAG's 1) is kept by every re-run below, as the UI's Clear keeps it
    first, log = run_dag(dag_id, {"epochs": 2}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert first["state"] == "success", log[-6000:]
    run_dir = tfpipe_home / "work" / "runs" / dag_id / contract.safe_name(first["run_id"], 120)
    assert [h["epoch"] for h in json.loads((run_dir / "metrics.json").read_text())] == [1, 2]
    datasets = tfpipe_home / "work" / "datasets"
    (fingerprint,) = [p.name for p in datasets.iterdir() if not p.name.startswith(".")]
    shutil.rmtree(run_dir)  # as retention removes them (this test runs as root, the stages as uid 1000)
    shutil.rmtree(datasets / fingerprint)

    train_only, log = run_dag(dag_id, {}, home=tfpipe_home, image=trainer_image, dags_folder=dags,
                              rerun=first["run_id"], rerun_tasks=["train"])
    assert train_only["state"] == "failed", log[-6000:]
    assert train_only["tasks"]["train"] == {"state": "failed", "try_number": 2}, train_only["tasks"]
    # the named task's downstream tasks were cleared with it (left alone they would still read
    # success), and its upstream prep was not
    assert train_only["tasks"]["evaluate"]["state"] == "upstream_failed", train_only["tasks"]
    assert train_only["tasks"]["export"]["state"] == "upstream_failed", train_only["tasks"]
    assert train_only["tasks"]["prep"] == {"state": "success", "try_number": 1}, train_only["tasks"]
    assert "dataset.json does not exist: run the prep stage of this run first" in log
    # --only-failed re-runs train (failed) and what it failed, not prep (succeeded): the same, at once
    only_failed, log = run_dag(dag_id, {}, home=tfpipe_home, image=trainer_image, dags_folder=dags,
                               rerun=first["run_id"], only_failed=True)
    assert only_failed["state"] == "failed", log[-6000:]
    assert only_failed["tasks"]["train"] == {"state": "failed", "try_number": 3}, only_failed["tasks"]
    assert only_failed["tasks"]["prep"] == {"state": "success", "try_number": 1}, only_failed["tasks"]
    assert "dataset.json does not exist: run the prep stage of this run first" in log

    again, log = run_dag(dag_id, {}, home=tfpipe_home, image=trainer_image, dags_folder=dags,
                         rerun=first["run_id"])
    assert again["state"] == "success", log[-6000:]
    assert again["tasks"]["prep"]["try_number"] == 2 and again["tasks"]["train"]["try_number"] == 4
    assert (datasets / fingerprint / "_SUCCESS").is_file(), "prep did not recreate the data set"
    assert (run_dir / "dataset.json").is_file()
    assert "cache hit" not in log and "starting from scratch" in log and "resumed from epoch" not in log
    assert [h["epoch"] for h in json.loads((run_dir / "metrics.json").read_text())] == [1, 2], "the conf was lost"
    # a task the DAG does not have is refused, naming the tasks it does have
    cmd, env = dag_command(dag_id, {}, home=tfpipe_home, image=trainer_image, dags_folder=dags,
                           rerun=first["run_id"], rerun_tasks=["trian"])
    unknown = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert unknown.returncode != 0
    assert f"tfpipe: {dag_id} has no task trian (tasks: " in unknown.stderr and "train" in unknown.stderr
