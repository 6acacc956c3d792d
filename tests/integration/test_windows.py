"""Date-partitioned rolling windows through Airflow (``tfpipe run --logical-date`` = ``dag.test()``)
with every stage a real container.

The digits CSV is cut into 40 daily partitions ``events/dt=2026-10-01 .. dt=2026-11-09``, and a DAG
with ``data.window_days`` 7 runs for two logical dates: each reads its own 7 days (recorded in the
run's ``dataset.json``, the data set's ``fingerprint.json`` and the exported model's
``metadata.json``) and so gets its own fingerprint. A backfill of the first date, on the same work
volume (a cache hit) and on a fresh one (prepared anew), reads exactly that date's window again and
reproduces its fingerprint. A partition missing inside a window fails prep, naming the date.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, dag_command, parse_summary, write_dag
from tfpipe import contract

pytestmark = pytest.mark.integration

DAG_ID = "tfpipe_windows"
DAYS = 40


def _partition_digits(home: Path) -> list[str]:
    """Cut data/digits/digits.csv into DAYS daily partitions under data/events (a header in each)."""
    from datetime import date, timedelta

    header, *rows = (home / "data" / "digits" / "digits.csv").read_text().splitlines()
    names = []
    for day in range(DAYS):
        name = f"dt={date(2026, 10, 1) + timedelta(days=day)}"
        folder = home / "data" / "events" / name
        folder.mkdir(parents=True)
        (folder / "part-0.csv").write_text("\n".join([header] + rows[day::DAYS]) + "\n")
        names.append(name)
    return names


def _run(home: Path, image: str, dags: Path, logical_date: str) -> tuple[dict, str]:
    cmd, env = dag_command(DAG_ID, {}, home=home, image=image, dags_folder=dags)
    proc = subprocess.run(cmd + ["--logical-date", logical_date], env=env, capture_output=True, text=True,
                          timeout=900, cwd=REPO)
    return parse_summary(proc.stdout, proc.stderr, proc.returncode), proc.stdout + proc.stderr


def _dataset_pointer(home: Path, run_id: str) -> dict:
    run_dir = contract.run_dir(DAG_ID, run_id)[len(contract.CONTAINER_WORK) + 1:]
    return json.loads((home / "work" / run_dir / "dataset.json").read_text())


def test_two_dates_read_two_windows_and_a_backfill_reproduces_the_first(tfpipe_home: Path, trainer_image: str,
                                                                          tmp_path: Path):
    partitions = _partition_digits(tfpipe_home)
    dags = tmp_path / "dags"
    write_dag(dags, DAG_ID, data={"path": "events", "window_days": 7},
              training={"model": "mlp", "epochs": 2, "batch_size": 32, "learning_rate": 0.005},
              evaluation={"threshold": 0.0, "tolerance": 1.0})  # mechanics, not quality: both runs export

    first, log = _run(tfpipe_home, trainer_image, dags, "2026-11-01")
    assert first["state"] == "success", log[-8000:]
    later, log = _run(tfpipe_home, trainer_image, dags, "2026-11-08")
    assert later["state"] == "success", log[-8000:]

    # a manual run's data interval ends at its logical date: the 7 days before it are read
    windows = {}
    for summary, end, newest in ((first, "2026-11-01", 30), (later, "2026-11-08", 37)):  # dt=2026-10-31, -11-07
        pointer = _dataset_pointer(tfpipe_home, summary["run_id"])
        window = pointer["window"]
        assert window["partitions"] == partitions[newest - 6:newest + 1] and window["missing"] == []
        assert window["end"] == f"{end}T00:00:00+00:00"
        recorded = json.loads((tfpipe_home / "work" / "datasets" / pointer["fingerprint"] / "fingerprint.json")
                              .read_text())
        assert recorded["window"]["partitions"] == window["partitions"]
        assert sorted(i["path"] for i in recorded["inputs"]) == [f"{p}/part-0.csv" for p in window["partitions"]]
        metadata = json.loads((Path(summary["model_dir"]) / "metadata.json").read_text())
        assert metadata["data"]["window"] == window and metadata["data"]["fingerprint"] == pointer["fingerprint"]
        windows[summary["run_id"]] = pointer
    assert windows[first["run_id"]]["window"]["first"] == "2026-10-25"
    assert windows[later["run_id"]]["window"]["last"] == "2026-11-07"
    assert windows[first["run_id"]]["fingerprint"] != windows[later["run_id"]]["fingerprint"]

    # the backfill: the first date again (a new run: its own run dir) reads the same window, so the
    # same fingerprint, and prep finds that data set prepared
    backfill, log = _run(tfpipe_home, trainer_image, dags, "2026-11-01")
    assert backfill["state"] == "success", log[-8000:]
    assert backfill["run_id"] != first["run_id"]
    again = _dataset_pointer(tfpipe_home, backfill["run_id"])
    assert again["fingerprint"] == windows[first["run_id"]]["fingerprint"]
    assert again["window"] == windows[first["run_id"]]["window"]
    assert "cache hit: data set" in log
    metadata = json.loads((Path(backfill["model_dir"]) / "metadata.json").read_text())
    assert metadata["data"]["window"] == again["window"]

    # and on a fresh work volume over the same data, prepared anew, the same fingerprint again
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "data").mkdir(parents=True)
    shutil.copytree(tfpipe_home / "data" / "events", elsewhere / "data" / "events")
    backfill, log = _run(elsewhere, trainer_image, dags, "2026-11-01")
    assert backfill["state"] == "success", log[-8000:]
    again = _dataset_pointer(elsewhere, backfill["run_id"])
    assert again["fingerprint"] == windows[first["run_id"]]["fingerprint"]
    assert again["window"] == windows[first["run_id"]]["window"]
    assert (elsewhere / "work" / "datasets" / again["fingerprint"] / "_SUCCESS").is_file()  # prepared anew

    # a partition missing inside the window fails prep, naming the date; nothing is retried
    (tfpipe_home / "data" / "events" / "dt=2026-11-03").rename(tfpipe_home / "data" / "dt=2026-11-03")
    failed, log = _run(tfpipe_home, trainer_image, dags, "2026-11-09")
    assert failed["state"] == "failed"
    assert failed["tasks"]["prep"] == {"state": "failed", "try_number": 1}
    assert "lacks the partition(s) 2026-11-03" in log and "2026-11-02 .. 2026-11-08" in log
