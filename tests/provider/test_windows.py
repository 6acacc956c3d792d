"""The Airflow side of date-partitioned windows: the window end a try carries, the config checks,
the lineage facet and ``tfpipe run --logical-date``."""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta, timezone

import pytest

from tfpipe import PipelineConfig, contract
from tfpipe.cli.run import logical_date_arg
from tfpipe.config import TfpipeConfigError
from tfpipe.lineage import stage_lineage, to_operator_lineage
from tfpipe.specs import plan_pipeline
from tfpipe.tries import TryIdentity, resolve_try, utc_iso

VOLUMES = {"data": "/srv/data", "work": "/srv/work", "models": "/srv/models"}


def pipeline(**data):
    return PipelineConfig.from_dict({"dag_id": "windows", "image": {"ref": "tfpipe/trainer:1.0.0"},
                                     "volumes": VOLUMES, "data": {"path": "events", **data}})


def prep_spec(cfg):
    return next(s for s in plan_pipeline(cfg) if s.stage == "prep")


def test_a_windowed_try_carries_its_data_interval_end_in_utc():
    """With data.window_days, every stage's config has run.data_interval_end: the interval end as
    ISO 8601 in UTC (an end given with another offset is converted)."""
    cfg = pipeline(window_days=7)
    end = datetime(2026, 12, 7, 1, 0, tzinfo=timezone(timedelta(hours=1)))
    for spec in plan_pipeline(cfg):
        plan = resolve_try(spec, TryIdentity("windows", "scheduled__2026-12-06", spec.task_id, data_interval_end=end))
        assert plan.config["run"][contract.WINDOW_END_KEY] == "2026-12-07T00:00:00+00:00"


def test_a_try_without_a_window_has_no_window_end():
    """Without data.window_days the stage config's run section stays as it was (no data_interval_end)."""
    plan = resolve_try(prep_spec(pipeline()), TryIdentity("windows", "r", "prep",
                                                          data_interval_end=datetime(2026, 12, 7, tzinfo=timezone.utc)))
    assert contract.WINDOW_END_KEY not in plan.config["run"]


def test_utc_iso_takes_naive_times_as_utc_and_keeps_none():
    """A naive datetime is UTC; a text with Z is read; None stays None."""
    assert utc_iso(datetime(2026, 12, 7)) == "2026-12-07T00:00:00+00:00"
    assert utc_iso("2026-12-07T00:00:00Z") == "2026-12-07T00:00:00+00:00"
    assert utc_iso(None) is None


def test_window_config_checks_name_the_field_and_the_fix():
    """A window over image folders, and data.min_partitions above data.window_days, are refused when
    the DAG is parsed; an unsafe data.partition_key too."""
    with pytest.raises(TfpipeConfigError, match=r"data.window_days: date windows read CSV or Parquet partitions.*Fix: set "
                                                r"data.window_days to 0"):
        pipeline(window_days=7, format="images")
    with pytest.raises(TfpipeConfigError, match=r"data.min_partitions: 8 is above data.window_days 7.*Fix"):
        pipeline(window_days=7, min_partitions=8)
    with pytest.raises(TfpipeConfigError, match="data.partition_key"):
        pipeline(window_days=7, partition_key="dt/x")
    assert pipeline(window_days=7, min_partitions=5, partition_key="day").data.partition_key == "day"


def test_prep_lineage_names_the_partitions_read():
    """Prep's OpenLineage input (the data path) carries a tfpipe_window facet with the partitions read
    and missing, next to the fingerprint."""
    window = {"partition_key": "dt", "days": 2, "end": "2026-12-07T00:00:00+00:00", "first": "2026-12-05",
              "last": "2026-12-06", "partitions": ["dt=2026-12-06"], "missing": ["dt=2026-12-05"]}
    lineage = stage_lineage("prep", volumes=pipeline().volumes, docker_url=None, image=None, data_path="events",
                            result={"fingerprint": "abc", "dataset_dir": "/work/datasets/abc", "window": window},
                            upstream={})
    (raw,) = lineage.inputs
    assert raw.name == "/srv/data/events" and raw.facets["tfpipe_window"] == window


def test_prep_lineage_event_carries_the_window_facet():
    """With the OpenLineage provider (the ``openlineage`` extra), the event's input dataset carries the
    tfpipe_window facet with the partitions read and missing."""
    pytest.importorskip("airflow.providers.openlineage", reason="the openlineage extra is not installed here")
    window = {"partition_key": "dt", "days": 2, "end": "2026-12-07T00:00:00+00:00", "first": "2026-12-05",
              "last": "2026-12-06", "partitions": ["dt=2026-12-06"], "missing": ["dt=2026-12-05"]}
    lineage = stage_lineage("prep", volumes=pipeline().volumes, docker_url=None, image=None, data_path="events",
                            result={"fingerprint": "abc", "dataset_dir": "/work/datasets/abc", "window": window},
                            upstream={})
    facet = to_operator_lineage(lineage).inputs[0].facets["tfpipe_window"]
    assert facet.partitions == ["dt=2026-12-06"] and facet.missing == ["dt=2026-12-05"]


def test_logical_date_option_reads_iso_dates_as_utc():
    """``--logical-date 2026-12-06`` is midnight UTC; an offset is kept; anything else is refused."""
    assert logical_date_arg("2026-12-06") == datetime(2026, 12, 6, tzinfo=timezone.utc)
    assert logical_date_arg("2026-12-06T02:00:00+02:00").utcoffset() == timedelta(hours=2)
    with pytest.raises(argparse.ArgumentTypeError, match="not an ISO 8601 date"):
        logical_date_arg("yesterday")


def test_a_shell_of_a_windowed_prep_reproduces_the_runs_window_end():
    """``tfpipe shell`` builds prep's container of a windowed run with that run's data interval end, so
    ``python3 -m trainer prep`` inside reads the run's window (without it the config has no window end)."""
    from tfpipe import reproduce, training_pipeline

    dag = training_pipeline(pipeline(window_days=7))
    end = datetime(2026, 12, 7, tzinfo=timezone.utc)
    plan = reproduce.task_plan(dag.get_task("prep"), dag_id=dag.dag_id, run_id="scheduled__2026-12-06", try_number=1,
                               params=dag.params.dump(), data_interval_end=end)
    assert plan.config["run"][contract.WINDOW_END_KEY] == "2026-12-07T00:00:00+00:00"
    bare = reproduce.task_plan(dag.get_task("prep"), dag_id=dag.dag_id, run_id="scheduled__2026-12-06", try_number=1,
                               params=dag.params.dump())
    assert not bare.config["run"].get(contract.WINDOW_END_KEY)
