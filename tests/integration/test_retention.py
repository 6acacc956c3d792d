"""The cleanup task through Airflow: it never removes a run the metadata DB holds as active."""

from __future__ import annotations

import re

import pytest

from tests.conftest import run_dag, write_dag

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


def test_cleanup_keeps_active_runs_and_removes_them_once_finished(tfpipe_home, trainer_image, tmp_path):
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
    third, log3 = run()
    assert sorted(p.name for p in runs_dir.iterdir()) == sorted([run_dir(second).name, run_dir(third).name])
    assert re.search(r"retention: removed run runs/%s/\S+ \([0-9.]+ [KM]iB\)" % DAG_ID, log3)
    assert re.search(r"retention: removed 1 run dir\(s\) and 0 data set\(s\), freed [0-9.]+ [KM]iB", log3)
    assert not run_dir(first).exists()
    fourth, log4 = run()
    assert sorted(p.name for p in runs_dir.iterdir()) == sorted([run_dir(third).name, run_dir(fourth).name])
    assert re.search(r"retention: removed 1 run dir\(s\) and 0 data set\(s\), freed [0-9.]+ [KM]iB", log4)
    datasets = [p.name for p in (tfpipe_home / "work" / "datasets").iterdir() if not p.name.startswith(".")]
    assert len(datasets) == 1, "one data set (unchanged data): kept as the newest and as the kept run's"
