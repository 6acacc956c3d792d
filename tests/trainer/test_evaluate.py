"""The evaluate stage: metrics on the eval split and the blessing gate."""

import json
import os
import shutil

import numpy as np
import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow  # noqa: E402,F401

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
    # both runs read the same data set: the production model's same-split score is its recorded one
    assert blessing["baseline"]["version"] == 1 and blessing["baseline"]["recorded_value"] == good
    assert blessing["baseline"]["same_split"] is True and blessing["baseline"]["value"] == pytest.approx(good)
    assert blessing["candidate"]["value"] < good - 0.05
    assert "worse than baseline version 1 (%.4f on this run's eval split)" % blessing["baseline"]["value"] \
        in info.value.result["reason"]
    # within tolerance of the baseline: blessed
    ok = evaluate.run(trained.config("evaluate", run_id="weak", training=weak,
                                     evaluation={"threshold": 0.0, "tolerance": 1.0}))
    assert ok["blessed"] is True and ok["baseline"]["version"] == 1
    # a version exported by the same DAG run is never its own baseline
    again = evaluate.run(trained.config("evaluate"))
    assert again["baseline"] is None


def _two_versions(trained):
    """Version 1 exported by the template's run, version 2 by run "old"; version 2's metadata path
    and contents, for a test to edit."""
    evaluate.run(trained.config("evaluate"))
    export.run(trained.config("export"))
    prep.run(trained.config("prep", run_id="old"))
    train.run(trained.config("train", run_id="old"))
    evaluate.run(trained.config("evaluate", run_id="old"))
    export.run(trained.config("export", run_id="old"))
    path = os.path.join(trained.models, "blobs", "2", "metadata.json")
    return path, json.load(open(path))


def test_a_version_exported_before_auc_existed_is_no_baseline_for_an_auc_gate(trained, capsys):
    """Version 1 (this run's) has auc; version 2, from another run, is as exported before auc
    existed. An auc gate skips version 2, saying why, and compares with version 1."""
    path, metadata = _two_versions(trained)
    del metadata["evaluation"]["metrics"]["auc"]
    with open(path, "w") as handle:
        json.dump(metadata, handle)
    prep.run(trained.config("prep", run_id="new"))
    train.run(trained.config("train", run_id="new"))
    capsys.readouterr()
    result = evaluate.run(trained.config("evaluate", run_id="new", evaluation={"metric": "auc", "threshold": 0.5}))
    assert "version 2 of %s has no auc in metadata.json; not a baseline" % os.path.join(trained.models, "blobs") \
        in capsys.readouterr().out
    version_1 = json.load(open(os.path.join(trained.models, "blobs", "1", "metadata.json")))
    assert result["baseline"]["version"] == 1
    assert result["baseline"]["recorded_value"] == version_1["evaluation"]["metrics"]["auc"] > 0.9
    assert result["baseline"]["value"] == pytest.approx(result["baseline"]["recorded_value"], abs=1e-3)
    blessing = trained.read("blessing.json", run_id="new")
    assert blessing["passed_over"] == [{"version": 2, "why": "no auc in its metadata"}]
    assert blessing["reason"].endswith("(passed over version 2: no auc in its metadata)"), blessing["reason"]


def test_a_version_trained_on_other_classes_is_no_baseline(trained, capsys):
    """Version 2, from another run, lists the classes in another order (as when data.classes grows
    or is reordered) and records an accuracy no candidate reaches: the gate skips it, saying why, and
    compares with version 1, trained on the same classes. With version 2's list restored, version 2
    is the baseline: the list alone made the difference (and the gate compares its score on this run's
    eval split, not the recorded one no candidate reaches)."""
    path, metadata = _two_versions(trained)
    classes = metadata["data"]["class_names"]
    assert classes == ["0", "1", "2"], classes
    metadata["data"]["class_names"] = ["2", "1", "0"]
    metadata["evaluation"]["metrics"]["accuracy"] = 2.0
    with open(path, "w") as handle:
        json.dump(metadata, handle)
    prep.run(trained.config("prep", run_id="new"))
    train.run(trained.config("train", run_id="new"))
    gate = {"threshold": 0.0, "tolerance": 0.05}
    capsys.readouterr()
    result = evaluate.run(trained.config("evaluate", run_id="new", evaluation=gate))
    assert ("version 2 of %s was trained on the classes ['2', '1', '0'], this data set has ['0', '1', '2']: "
            "its accuracy measured another task; not a baseline" % os.path.join(trained.models, "blobs")
            in capsys.readouterr().out)
    assert result["blessed"] is True and result["baseline"]["version"] == 1
    blessing = trained.read("blessing.json", run_id="new")
    assert blessing["passed_over"] == result["passed_over"] == [{"version": 2, "why": "trained on other classes"}]
    assert blessing["reason"].endswith("(passed over version 2: trained on other classes)"), blessing["reason"]
    report = open(os.path.join(trained.run_dir("new"), "report.html")).read()
    assert "version 1: " in report and "(passed over version 2: trained on other classes)" in report
    # the newest version alone, trained on other classes: no baseline, and the reason says why
    metadata_1 = os.path.join(trained.models, "blobs", "1", "metadata.json")
    shutil.move(metadata_1, metadata_1 + ".aside")
    alone = evaluate.run(trained.config("evaluate", run_id="new", evaluation=gate))
    assert alone["baseline"] is None and alone["reason"].endswith(
        "there is no baseline (passed over version 2: trained on other classes; version 1: no readable "
        "metadata.json)"), alone["reason"]
    assert "none (passed over version 2: trained on other classes; version 1: no readable metadata.json)" in \
        open(os.path.join(trained.run_dir("new"), "report.html")).read()
    shutil.move(metadata_1 + ".aside", metadata_1)
    metadata["data"]["class_names"] = classes
    with open(path, "w") as handle:
        json.dump(metadata, handle)
    again = evaluate.run(trained.config("evaluate", run_id="new", evaluation=gate))
    assert again["baseline"]["version"] == 2 and again["baseline"]["recorded_value"] == 2.0
    assert again["baseline"]["same_split"] is True and again["baseline"]["value"] <= 1.0
    assert "baseline version 2 (%.4f on this run's eval split)" % again["baseline"]["value"] in again["reason"]


def pairwise_auc(scores, positives):
    """The definition, pair by pair: P(positive scores above negative), a tie counting half."""
    pos, neg = scores[positives], scores[~positives]
    return float(((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean())


def test_roc_auc_is_the_chance_a_positive_outscores_a_negative():
    assert evaluate.roc_auc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert evaluate.roc_auc([0.5, 0.5, 0.2, 0.9], [1, 0, 0, 1]) == pytest.approx(0.875)  # a tie: half
    assert evaluate.roc_auc([1, 2, 3, 4], [0, 0, 1, 1]) == 1.0
    assert evaluate.roc_auc([1, 2, 3, 4], [1, 1, 0, 0]) == 0.0
    assert evaluate.roc_auc([7, 7, 7], [1, 0, 1]) == 0.5
    assert evaluate.roc_auc([1, 2], [1, 1]) is None and evaluate.roc_auc([1, 2], [0, 0]) is None
    rng = np.random.RandomState(0)
    for size in (2, 9, 500):
        scores = np.round(rng.uniform(size=size), 2)  # rounded: many ties
        positives = rng.uniform(size=size) < 0.3
        positives[:2] = [True, False]
        assert evaluate.roc_auc(scores, positives) == pytest.approx(pairwise_auc(scores, positives), abs=1e-12)


def test_auc_is_one_class_against_the_rest_averaged_over_the_classes_it_is_defined_for():
    rng = np.random.RandomState(1)
    logits = rng.normal(size=(60, 2))
    labels = (rng.uniform(size=60) < 0.5 + 0.2 * np.tanh(logits[:, 1] - logits[:, 0])).astype(int)
    binary = evaluate.compute_metrics(logits, labels, ["no", "yes"])
    probability = np.exp(logits[:, 1]) / np.exp(logits).sum(axis=1)
    # two classes: the usual AUC of the positive class's probability, and both classes' AUC is it
    assert binary["metrics"]["auc"] == pytest.approx(pairwise_auc(probability, labels == 1), abs=1e-12)
    assert [c["auc"] for c in binary["per_class"]] == pytest.approx([binary["metrics"]["auc"]] * 2)
    # three classes, the third absent from the split: its AUC is undefined, the mean is the others'
    logits = rng.normal(size=(40, 3))
    labels = rng.randint(0, 2, size=40)
    three = evaluate.compute_metrics(logits, labels, ["a", "b", "c"])
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    expected = [pairwise_auc(probabilities[:, c], labels == c) for c in (0, 1)]
    assert [c["auc"] for c in three["per_class"]] == pytest.approx(expected + [None], abs=1e-12)
    assert three["metrics"]["auc"] == pytest.approx(np.mean(expected), abs=1e-12)
    assert evaluate.compute_metrics(logits, np.zeros(40, int), ["a", "b", "c"])["metrics"]["auc"] == 0.0


def test_decide_boundaries():
    """The gate at its edges: the threshold and baseline - tolerance reached exactly or not, the reason
    saying which baseline figure it compared (same split or recorded), and slices below the floor
    refusing a blessing the other checks grant."""
    baseline = {"version": 3, "value": 0.9, "same_split": True}
    assert evaluate.decide(0.9, "accuracy", 0.9, 0.0, None)[0] is True
    assert evaluate.decide(0.89, "accuracy", 0.5, 0.01, baseline)[0] is True
    assert evaluate.decide(0.88, "accuracy", 0.5, 0.01, baseline)[0] is False
    passed_over = [{"version": 4, "why": "trained on other classes"}]
    assert evaluate.decide(0.88, "accuracy", 0.5, 0.01, baseline, passed_over) == (
        False, "accuracy 0.8800 is worse than baseline version 3 (0.9000 on this run's eval split) minus "
               "tolerance 0.0100 (passed over version 4: trained on other classes)")
    recorded = dict(baseline, same_split=False)
    assert evaluate.decide(0.88, "accuracy", 0.5, 0.01, recorded)[1] == (
        "accuracy 0.8800 is worse than baseline version 3 (0.9000 recorded: it cannot score this run's data) "
        "minus tolerance 0.0100")
    assert evaluate.decide(0.95, "accuracy", 0.5, 0.01, baseline, (), "slice plan=basic: ...") == (
        False, "accuracy 0.9500 reaches the threshold 0.5000 and baseline version 3 (0.9000 on this run's eval "
               "split) minus tolerance 0.0100, but slice plan=basic: ...")
    assert evaluate.decide(0.4, "accuracy", 0.5, 0.01, None, passed_over) == (
        False, "accuracy 0.4000 is below the threshold 0.5000")


@pytest.mark.parametrize("metric", ["macro_f1", "macro_precision", "macro_recall", "auc"])
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
