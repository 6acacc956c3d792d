"""The Airflow side of the data gate: its config section, the trigger Param, the task in every DAG
shape, the run note and the OpenLineage data-quality facets."""

from __future__ import annotations

import pytest

from tfpipe import PipelineConfig, training_pipeline
from tfpipe.config import TfpipeConfigError
from tfpipe.lineage import stage_lineage, to_operator_lineage
from tfpipe.plugins.summary import summary_line
from tfpipe.specs import config_template

VOLUMES = {"data": "/srv/data", "work": "/srv/work", "models": "/srv/models"}

#: A validate result as the stage prints it (trainer/validate.py), with one anomaly.
REJECTED = {
    "decision": "rejected", "accepted": False, "baseline": {"version": 3, "fingerprint": "b" * 64},
    "checks": [{"column": "weight", "check": "numeric_drift", "value": 0.83, "threshold": 0.1, "ok": False},
               {"column": "city", "check": "categorical_drift", "value": 0.02, "threshold": 0.1, "ok": True}],
    "anomalies": [{"column": "weight", "check": "numeric_drift", "value": 0.83, "threshold": 0.1, "ok": False}],
    "dataset": {"fingerprint": "a" * 64, "rows": 1200,
                "columns": {"weight": {"missing": 3, "distinct": None, "min": 0.2, "max": 9.5, "mean": 4.1},
                            "city": {"missing": 0, "distinct": 12, "min": None, "max": None, "mean": None}}},
}


def pipeline(**sections):
    return PipelineConfig.from_dict({"dag_id": "gate", "image": {"ref": "tfpipe/trainer:1.0.0"},
                                     "volumes": VOLUMES, "data": {"path": "t.csv"}, **sections})


def test_every_pipeline_validates_between_prep_and_train_and_the_stage_gets_the_validation_section():
    """The DAG runs validate after prep (or prep_merge) and before train, and the validate task's config
    carries the validation section with its defaults (fail on an anomaly)."""
    for data in ({"path": "t.csv"}, {"path": "t", "shards": 3}):
        dag = training_pipeline(pipeline(data=data))
        prepared = "prep_merge" if "shards" in data else "prep"
        assert dag.get_task("validate").upstream_task_ids == {prepared}
        assert dag.get_task("train").upstream_task_ids == {"validate"}
    config = config_template(pipeline(), "validate")
    assert config["stage"] == "validate"
    assert config["validation"]["on_anomaly"] == "fail" and config["validation"]["numeric_drift"] == 0.1


def test_accept_data_change_is_a_trigger_param_that_reaches_the_validate_config():
    """``accept_data_change`` is on the trigger form (default off), so one run can let a real change through."""
    dag = training_pipeline(pipeline())
    assert dag.params["accept_data_change"] is False
    schema = dag.params.get_param("accept_data_change").schema
    assert schema["type"] == "boolean"


@pytest.mark.parametrize("columns,field,words", [
    ({"weight": {"numric_drift": 0.3}}, "validation.columns.weight.numric_drift", "did you mean 'numeric_drift'"),
    ({"weight": {"numeric_drift": 3}}, "validation.columns.weight.numeric_drift", "from 0 to 1"),
    ({"weight": {"skip": "yes"}}, "validation.columns.weight.skip", "true or false"),
    ({"weight": 0.3}, "validation.columns.weight", "mapping of checks"),
])
def test_a_bad_per_column_override_is_refused_at_parse_time_naming_the_field(columns, field, words):
    """``validation.columns`` overrides are checked when the DAG is parsed: the error names the field, the
    problem and the fix."""
    with pytest.raises(TfpipeConfigError) as err:
        pipeline(validation={"columns": columns})
    assert field in str(err.value) and words in str(err.value) and "Fix:" in str(err.value)


def test_row_ratio_bounds_and_the_fail_or_warn_choice_are_checked():
    """min_row_ratio lies in [0, 1], max_row_ratio is at least 1, on_anomaly is fail or warn."""
    for bad in ({"min_row_ratio": 1.5}, {"max_row_ratio": 0.5}, {"on_anomaly": "stop"}):
        with pytest.raises(TfpipeConfigError, match="validation."):
            pipeline(validation=bad)
    assert pipeline(validation={"on_anomaly": "warn", "columns": {"w": {"skip": True}}}).validation.on_anomaly == "warn"


def test_the_run_note_names_each_anomaly_and_the_production_version():
    """A stopped run's note says the data was rejected against which version, naming column, measure,
    value and threshold."""
    line = summary_line({"validate": REJECTED}, train_tries=None, state="failed", failed_tasks=["validate"])
    assert line == ("tfpipe: run failed at validate; data rejected vs v3: weight numeric_drift 0.8300 > 0.1000")
    rows = dict(REJECTED, anomalies=[{"column": None, "check": "row_count", "value": 0.25, "threshold": [0.5, 2.0]}])
    assert summary_line({"validate": rows}, train_tries=None, state="failed").endswith(
        "data rejected vs v3: data set row_count 0.2500 outside [0.5000, 2.0000]")
    accepted = dict(REJECTED, decision="accepted")
    assert "data change accepted vs v3" in summary_line({"validate": accepted}, train_tries=1, state="success")
    assert "data" not in summary_line({"validate": dict(REJECTED, anomalies=[], decision="passed")},
                                      train_tries=1, state="success")


def test_validate_lineage_puts_data_quality_facets_on_the_data_set_it_checked():
    """validate's OpenLineage input is the prepared data set, with OpenLineage's standard dataQualityMetrics
    (row count, per-column nulls, distinct values, min, max) and dataQualityAssertions (one per check, an
    anomaly unsuccessful) input facets."""
    prep = {"fingerprint": "a" * 64, "dataset_dir": "/work/datasets/" + "a" * 64}
    lineage = stage_lineage("validate", volumes=pipeline().volumes, docker_url=None, image=None, data_path="t.csv",
                            result=REJECTED, upstream={"prep": prep})
    (checked,) = lineage.inputs
    assert checked.name == "/srv/work/datasets/" + "a" * 64
    metrics = checked.input_facets["dataQualityMetrics"]
    assert metrics["rowCount"] == 1200 and metrics["columnMetrics"]["weight"]["nullCount"] == 3
    assertions = checked.input_facets["dataQualityAssertions"]["assertions"]
    assert [(a["column"], a["assertion"], a["success"]) for a in assertions] == [
        ("weight", "numeric_drift", False), ("city", "categorical_drift", True)]


def test_validate_lineage_event_carries_the_standard_facets():
    """With the OpenLineage provider (the ``openlineage`` extra), the event's input is an InputDataset whose
    inputFacets are OpenLineage's data-quality facet classes."""
    pytest.importorskip("airflow.providers.openlineage", reason="the openlineage extra is not installed here")
    prep = {"fingerprint": "a" * 64, "dataset_dir": "/work/datasets/" + "a" * 64}
    lineage = stage_lineage("validate", volumes=pipeline().volumes, docker_url=None, image=None, data_path="t.csv",
                            result=REJECTED, upstream={"prep": prep})
    (event_input,) = to_operator_lineage(lineage).inputs
    facets = event_input.inputFacets
    assert facets["dataQualityMetrics"].rowCount == 1200
    assert facets["dataQualityMetrics"].columnMetrics["city"].distinctCount == 12
    assert [a.success for a in facets["dataQualityAssertions"].assertions] == [False, True]
