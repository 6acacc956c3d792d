"""``evaluation.slices`` is checked when the DAG is parsed: column names, or numeric columns with
ascending bucket edges; a bad entry names its position, the problem and the fix."""

from __future__ import annotations

import pytest

from tfpipe import PipelineConfig
from tfpipe.config import TfpipeConfigError
from tfpipe.specs import config_template

BASE = {"dag_id": "slices", "image": {"ref": "tfpipe/trainer:1.0.0"},
        "volumes": {"data": "/srv/data", "work": "/srv/work", "models": "/srv/models"}, "data": {"path": "t.csv"}}


def test_slices_and_their_floor_reach_the_evaluate_stage_as_written():
    """A text column and a bucketed numeric column, with a floor and its minimum rows, are in evaluate's config."""
    cfg = PipelineConfig.from_dict({**BASE, "evaluation": {
        "slices": ["plan", {"column": "tenure", "buckets": [12, 24.5]}], "slice_floor": 0.7, "slice_min_rows": 50}})
    evaluation = config_template(cfg, "evaluate")["evaluation"]
    assert list(evaluation["slices"]) == ["plan", {"column": "tenure", "buckets": [12, 24.5]}]
    assert (evaluation["slice_floor"], evaluation["slice_min_rows"]) == (0.7, 50)
    assert config_template(PipelineConfig.from_dict(BASE), "evaluate")["evaluation"]["slices"] is None


@pytest.mark.parametrize("slices,field,words", [
    ("plan", "evaluation.slices", "must be a list of columns"),
    ([3], "evaluation.slices[0]", "column name or {column, buckets}"),
    (["plan", {"column": "tenure", "buckets": [24, 12]}], "evaluation.slices[1].buckets", "ascending numbers"),
    ([{"column": "tenure", "bucket": [12]}], "evaluation.slices[0].bucket", "unknown key"),
    ([{"buckets": [12]}], "evaluation.slices[0].column", "must be a column name"),
])
def test_a_bad_slice_is_refused_at_parse_time_naming_its_position(slices, field, words):
    """A bare string, a number, descending edges, a misspelt key or a missing column fail the parse with the
    entry's position, the problem and a fix."""
    with pytest.raises(TfpipeConfigError) as err:
        PipelineConfig.from_dict({**BASE, "evaluation": {"slices": slices}})
    assert str(err.value).startswith(field + ":") and words in str(err.value) and "Fix:" in str(err.value)


def test_a_floor_above_one_is_refused():
    """Metrics lie in [0, 1]: a slice floor above 1 could never pass and fails the parse."""
    with pytest.raises(TfpipeConfigError, match="evaluation.slice_floor"):
        PipelineConfig.from_dict({**BASE, "evaluation": {"slice_floor": 1.5}})
