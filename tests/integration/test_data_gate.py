"""The data gate through Airflow, night after night on one table: a unit change, a column removed and
a new category taking a third of the rows each stop the run at ``validate`` with the column named,
leave the model versions as they were and say so in the run's note; ``accept_data_change`` lets a
stopped change through and records it; the next ordinary night (new rows) passes against it."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from tests.conftest import DIGITS_CSV, run_dag, write_dag

pytestmark = pytest.mark.integration

DAG_ID = "tfpipe_test_gate"
CITIES = ("berlin", "paris", "rome", "madrid", "lisbon")


def write_orders(path: Path, *, rows: int, seed: int, grams: bool = True, drop: str | None = None,
                 new_city_share: float = 0.0) -> None:
    """An orders table: ``weight`` (grams, or kilograms), ``price``, ``city`` (text), label ``returned``.
    The same seed gives the same rows, so a larger ``rows`` appends new rows to an earlier night's."""
    rng = random.Random(seed)
    header = [c for c in ("order_id", "weight", "price", "city", "returned") if c != drop]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for i in range(rows):
            weight = max(50.0, rng.gauss(1500, 300))
            price = round(rng.uniform(5, 100), 2)
            city = "oslo" if rng.random() < new_city_share else rng.choice(CITIES)
            returned = int((weight > 1600) != (city == "rome"))
            row = {"order_id": f"o{seed}-{i}", "weight": round(weight if grams else weight / 1000, 4),
                   "price": price, "city": city, "returned": returned}
            writer.writerow([row[c] for c in header])


@pytest.fixture(scope="module")
def nights(tmp_path_factory, trainer_image):
    """Six nights of one DAG; each night's summary, log, validation.json, note and the versions after it."""
    if not DIGITS_CSV.exists():
        pytest.fail(f"{DIGITS_CSV} is missing: run `make data`")
    root = tmp_path_factory.mktemp("gate")
    home, dags = root / "home", root / "dags"
    table = home / "data" / "orders" / "orders.csv"
    table.parent.mkdir(parents=True)
    write_dag(dags, DAG_ID, data={"path": "orders/orders.csv", "label": "returned", "key": "order_id"},
              training={"model": "mlp", "epochs": 1, "batch_size": 128},
              evaluation={"threshold": 0.0, "tolerance": 1.0})
    plan = [
        ("baseline", dict(rows=1000, seed=1), {}),
        ("unit_change", dict(rows=1000, seed=1, grams=False), {}),
        ("column_removed", dict(rows=1000, seed=1, drop="price"), {}),
        ("new_category", dict(rows=1000, seed=1, new_city_share=1 / 3), {}),
        ("accepted", dict(rows=1000, seed=1, grams=False), {"accept_data_change": True}),
        ("ordinary", dict(rows=1100, seed=1, grams=False), {}),
    ]
    out = {}
    for name, data, conf in plan:
        write_orders(table, **data)
        summary, log = run_dag(DAG_ID, conf, home=home, image=trainer_image, dags_folder=dags)
        run_dir = home / "work" / "runs" / DAG_ID / summary["run_id"].replace(":", "_").replace("+", "_")
        validation = next((json.loads(p.read_text()) for p in (home / "work" / "runs" / DAG_ID).glob(
            "*/validation.json") if p.parent.name == run_dir.name), None)
        versions = sorted(int(p.name) for p in (home / "models" / DAG_ID).iterdir() if p.name.isdigit()) \
            if (home / "models" / DAG_ID).is_dir() else []
        out[name] = {"summary": summary, "log": log, "validation": validation, "versions": versions,
                     "note": _note(summary["run_id"]), "run_dir": run_dir}
    return out


def _note(run_id: str) -> str | None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalars(select(DagRun).where(DagRun.dag_id == DAG_ID, DagRun.run_id == run_id)).one()
        return run.note


@pytest.mark.parametrize("night,column,check", [
    ("unit_change", "weight", "numeric_drift"),
    ("column_removed", "price", "column_missing"),
    ("new_category", "city", "categorical_drift"),
])
def test_a_changed_night_stops_at_validate_naming_the_column_and_leaves_the_versions(nights, night, column, check):
    """A unit change (grams to kilograms), a column removed and a new category taking a third of the rows
    each fail the run at ``validate`` on its first try (rejected data is not retried), before train; the
    task's error names the column and the measure; validation.json records the anomaly against version 1;
    the model versions are still only the baseline's; the run's note says the data was rejected."""
    got = nights[night]
    summary = got["summary"]
    assert summary["state"] == "failed", got["log"][-4000:]
    assert summary["tasks"]["validate"] == {"state": "failed", "try_number": 1}
    assert summary["tasks"]["train"]["state"] in ("upstream_failed", None)
    assert f"'{column}'" in got["log"] or f" {column} " in got["log"], got["log"][-4000:]
    assert check in got["log"] and "accept_data_change" in got["log"]
    anomalies = {(a["column"], a["check"]) for a in got["validation"]["anomalies"]}
    assert (column, check) in anomalies, anomalies
    assert got["validation"]["decision"] == "rejected" and got["validation"]["baseline"]["version"] == 1
    assert got["versions"] == [1]
    assert got["note"] and got["note"].startswith("tfpipe: run failed at validate; data rejected vs v1: "), got["note"]
    assert f"{column} {check}" in got["note"]
    assert (got["run_dir"] / "report.html").is_file(), "the stopped run has a report with the data check"


def test_the_first_night_has_no_baseline_and_says_it_checked_the_config_only(nights):
    """With no blessed model yet, the gate validates against the config only, says so, and the night trains
    and exports version 1."""
    got = nights["baseline"]
    assert got["summary"]["state"] == "success" and got["versions"] == [1], got["log"][-4000:]
    assert got["validation"]["baseline"] is None and got["validation"]["decision"] == "passed"
    assert "no blessed model yet" in got["log"]


def test_accept_data_change_lets_a_stopped_change_through_and_the_run_records_it(nights):
    """The unit change, triggered with ``accept_data_change``, trains and exports version 2; validation.json
    records the anomaly and that the run accepted it; the note says so."""
    got = nights["accepted"]
    assert got["summary"]["state"] == "success" and got["versions"] == [1, 2], got["log"][-4000:]
    assert got["validation"]["decision"] == "accepted" and got["validation"]["accepted"] is True
    assert ("weight", "numeric_drift") in {(a["column"], a["check"]) for a in got["validation"]["anomalies"]}
    assert "data change accepted vs v1" in got["note"]


def test_an_ordinary_night_passes_against_the_accepted_data_which_became_the_baseline(nights):
    """The next night (the same source in kilograms, with new rows) passes: its baseline is version 2, the
    accepted data set, and it exports version 3."""
    got = nights["ordinary"]
    assert got["summary"]["state"] == "success" and got["versions"] == [1, 2, 3], got["log"][-4000:]
    assert got["validation"]["decision"] == "passed" and got["validation"]["anomalies"] == []
    assert got["validation"]["baseline"]["version"] == 2
