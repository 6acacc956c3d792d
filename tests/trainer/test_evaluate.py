"""The evaluate stage: metrics on the eval split and the blessing gate."""

import json
import os

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from trainer import evaluate, export, prep, train  # noqa: E402
from trainer.errors import NotBlessed  # noqa: E402


def test_metrics_and_a_blessing_above_the_threshold(trained):
    result = evaluate.run(trained.config("evaluate"))
    evaluation = trained.read("evaluation.json")
    blessing = trained.read("blessing.json")
    schema = json.load(open(os.path.join(trained.work, "datasets",
                                         trained.read("dataset.json")["fingerprint"],
                                         "schema.json")))
    matrix = np.array(evaluation["confusion_matrix"])
    assert matrix.shape == (3, 3) and matrix.sum() == schema["counts"]["eval"]
    assert evaluation["metrics"]["accuracy"] == pytest.approx(np.trace(matrix) / matrix.sum())
    assert [c["support"] for c in evaluation["per_class"]] == matrix.sum(axis=1).tolist()
    assert evaluation["metrics"]["accuracy"] >= 0.9 and evaluation["metrics"]["loss"] < 0.5
    assert result["blessed"] is True and blessing["blessed"] is True
    assert blessing["baseline"] is None and blessing["threshold"] == 0.8
    assert "no baseline" in blessing["reason"]
    assert trained.read("config", "evaluate.json")["stage"] == "evaluate"


def test_below_the_threshold_is_not_blessed(trained):
    with pytest.raises(NotBlessed) as info:
        evaluate.run(trained.config("evaluate", evaluation={"threshold": 1.01}))
    result = info.value.result
    assert result["blessed"] is False and "below the threshold 1.0100" in result["reason"]
    blessing = trained.read("blessing.json")
    assert blessing["blessed"] is False and blessing["decision"] == "not blessed"
    assert blessing["candidate"]["value"] == result["value"]


def test_a_candidate_worse_than_the_baseline_is_not_blessed(trained):
    # the template's good model becomes the baseline (version 1) ...
    evaluate.run(trained.config("evaluate"))
    export.run(trained.config("export"))
    baseline = json.load(open(os.path.join(trained.models, "blobs", "1", "metadata.json")))
    good = baseline["evaluation"]["metrics"]["accuracy"]
    # ... the candidate of another run is barely trained
    weak = {"epochs": 1, "learning_rate": 1e-5, "optimizer": "sgd"}
    prep.run(trained.config("prep", run_id="weak"))
    train.run(trained.config("train", run_id="weak", training=weak))
    with pytest.raises(NotBlessed) as info:
        evaluate.run(trained.config("evaluate", run_id="weak", training=weak,
                                    evaluation={"threshold": 0.0, "tolerance": 0.05}))
    blessing = trained.read("blessing.json", run_id="weak")
    assert blessing["baseline"]["version"] == 1 and blessing["baseline"]["value"] == good
    assert blessing["candidate"]["value"] < good - 0.05
    assert "worse than baseline version 1" in info.value.result["reason"]
    # within tolerance of the baseline: blessed
    ok = evaluate.run(trained.config("evaluate", run_id="weak", training=weak,
                                     evaluation={"threshold": 0.0, "tolerance": 1.0}))
    assert ok["blessed"] is True and ok["baseline"]["version"] == 1
    # a version exported by the same DAG run is never its own baseline
    again = evaluate.run(trained.config("evaluate"))
    assert again["baseline"] is None


def test_decide_boundaries():
    baseline = {"version": 3, "value": 0.9}
    assert evaluate.decide(0.9, "accuracy", 0.9, 0.0, None)[0] is True
    assert evaluate.decide(0.89, "accuracy", 0.5, 0.01, baseline)[0] is True
    assert evaluate.decide(0.88, "accuracy", 0.5, 0.01, baseline)[0] is False


@pytest.mark.parametrize("metric", ["macro_f1", "macro_precision", "macro_recall"])
def test_every_contract_metric_gates_the_blessing(trained, metric):
    """Each metric a DAG can choose (contract.METRICS) is what the gate compares."""
    from trainer import contract

    assert metric in contract.METRICS
    evaluate.run(trained.config("evaluate", evaluation={"metric": metric, "threshold": 0.5}))
    blessing = trained.read("blessing.json")
    value = trained.read("evaluation.json")["metrics"][metric]
    assert blessing["metric"] == metric and blessing["candidate"]["value"] == pytest.approx(value)
    with pytest.raises(NotBlessed) as info:
        evaluate.run(trained.config("evaluate", evaluation={"metric": metric, "threshold": value + 0.001}))
    assert metric in info.value.result["reason"]
