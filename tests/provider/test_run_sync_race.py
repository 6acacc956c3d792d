"""`tfpipe run` syncs again when its DAG sync lost a race with another `tfpipe run`.

Two runs started together on a DAG the metadata DB has not seen both insert its new rows in
``dag.test()``'s ``sync_bag_to_db``; the slower one fails on a unique constraint (SQLite's
IntegrityError, then Airflow's retry hits SQLAlchemy's PendingRollbackError) before any run exists.
The errors here are real ones from a real SQLite database, raised from a function of that name.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from tfpipe.cli.run import lost_sync_race, run_dag_test


def _duplicate_insert():
    engine = sa.create_engine("sqlite://")
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE asset (name TEXT UNIQUE)"))
        conn.execute(sa.text("INSERT INTO asset VALUES ('tfpipe://models/twice')"))
    with engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO asset VALUES ('tfpipe://models/twice')"))


def sync_bag_to_db():
    """Named as Airflow's function: the frame name is what marks the DAG sync."""
    _duplicate_insert()




def _raised(fn):
    with pytest.raises(Exception) as info:
        fn()
    return info.value


def test_a_unique_violation_in_the_dag_sync_is_a_lost_race():
    assert lost_sync_race(_raised(sync_bag_to_db))


def test_the_same_violation_elsewhere_is_not():
    assert not lost_sync_race(_raised(_duplicate_insert))
    assert not lost_sync_race(_raised(lambda: (_ for _ in ()).throw(ValueError("sync_bag_to_db"))))


class _Dag:
    """Stands in for the DAG object only: its ``test()`` fails as a lost race ``fails`` times."""

    dag_id = "twice"

    def __init__(self, fails, error=sync_bag_to_db):
        self.fails, self.error, self.calls = fails, error, []

    def test(self, run_conf=None):
        self.calls.append(run_conf)
        if len(self.calls) <= self.fails:
            self.error()
        return "the run"


def test_a_lost_race_syncs_again_once_and_says_so(capsys):
    dag = _Dag(fails=1)
    assert run_dag_test(dag, {"epochs": 2}) == "the run"
    assert dag.calls == [{"epochs": 2}, {"epochs": 2}]
    assert "another process wrote DAG 'twice' to the metadata DB at the same moment" in capsys.readouterr().err


def test_a_second_loss_or_another_error_is_raised():
    with pytest.raises(sa.exc.IntegrityError):
        run_dag_test(_Dag(fails=2), None)
    dag = _Dag(fails=1, error=_duplicate_insert)  # not in the sync: no second try
    with pytest.raises(sa.exc.IntegrityError):
        run_dag_test(dag, None)
    assert len(dag.calls) == 1
