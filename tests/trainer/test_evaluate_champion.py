"""Champion vs challenger: the production model scored on tonight's eval split, beside the candidate.

Two nights of a small table with text, yes/no and numeric columns: night 1 is trained and exported
(version 1, the production model), night 2 reads new rows (another seed). The gate compares the
candidate with version 1's score on night 2's eval split; a version 1 that cannot read night 2's data
falls back to its recorded score, and says why.
"""

import csv
import json
import os
import shutil

import numpy as np
import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow as tf  # noqa: E402,F401

from conftest import Workspace, write_mixed_csv  # noqa: E402
from trainer import checkpoints, common, data, evaluate, export, models, prep, train  # noqa: E402
from trainer import config as config_mod  # noqa: E402
from trainer.errors import NotBlessed  # noqa: E402

CHURN = {"path": "churn.csv", "label": "churn", "columns": {"customer_id": "ignore"}}
TRAINING = {"epochs": 3, "learning_rate": 0.02}
#: Version 1's recorded accuracy is rewritten to this: no candidate reaches it, so a gate that
#: compared the recorded figure would refuse every candidate, and one that compares the
#: same-split score does not.
UNREACHABLE = 1.5
GATE = {"threshold": 0.0, "tolerance": 0.2}


def night(ws, run_id, data_section=None, evaluation=None):
    """prep and train of one night (the CSV already written), with ``data_section`` merged in."""
    section = dict(CHURN, **(data_section or {}))
    prep.run(ws.config("prep", run_id=run_id, data=section, training=TRAINING))
    train.run(ws.config("train", run_id=run_id, data=section, training=TRAINING))
    return lambda **extra: ws.config("evaluate", run_id=run_id, data=section, training=TRAINING,
                                     evaluation=dict(GATE, **(evaluation or {})), **extra)


@pytest.fixture(scope="module")
def production(tmp_path_factory):
    """A workspace whose version 1 was trained and exported on night 1 (seed 0), its recorded
    accuracy rewritten to :data:`UNREACHABLE`; copy it with :func:`copy_of`, don't modify it."""
    ws = Workspace(tmp_path_factory.mktemp("champion"))
    write_mixed_csv(os.path.join(ws.data, "churn.csv"), seed=0)
    evaluate_config = night(ws, "night1")
    evaluate.run(evaluate_config())
    export.run(ws.config("export", run_id="night1", data=CHURN, training=TRAINING))
    path = os.path.join(ws.models, "blobs", "1", "metadata.json")
    metadata = json.load(open(path))
    metadata["evaluation"]["metrics"]["accuracy"] = UNREACHABLE
    with open(path, "w") as handle:
        json.dump(metadata, handle)
    return ws


def copy_of(template, tmp_path):
    """A private copy of the ``production`` workspace."""
    shutil.copytree(template.base, str(tmp_path / "ws"))
    return Workspace(tmp_path / "ws")


def independent_scores(ws, config):
    """Version 1's metrics on ``config``'s eval split, the other way: rebuilt from night 1's schema
    and statistics, its ``variables_ckpt`` restored, fed the eval records as the model takes them."""
    night1 = ws.config("evaluate", run_id="night1", data=CHURN, training=TRAINING)
    _, schema1, stats1 = common.load_dataset(night1)
    model = models.build_model(config_mod.resolve(night1), schema1, stats1)
    checkpoints.read_weights(model, os.path.join(ws.models, "blobs", "1", "variables_ckpt", "model"), "version 1")
    dataset_dir, schema2, _ = common.load_dataset(config)
    logits, labels = [], []
    for x, y in data.base_dataset(dataset_dir, schema2, "eval", cache=False).batch(64):
        logits.append(model(x, training=False).numpy())
        labels.append(y.numpy())
    return evaluate.compute_metrics(np.concatenate(logits), np.concatenate(labels), schema2["class_names"])


def test_the_production_model_is_scored_on_tonights_split_and_the_gate_compares_that(production, tmp_path):
    """Night 2 (new rows): evaluation.json holds version 1's metrics on night 2's eval split, the
    figures the restored version 1 gives on those very records; blessing.json compares the candidate
    with that same-split score (its recorded, unreachable 1.5 kept aside as recorded_value), and so the
    candidate is blessed; the report shows both models side by side."""
    ws = copy_of(production, tmp_path)
    write_mixed_csv(os.path.join(ws.data, "churn.csv"), seed=1)
    config = night(ws, "night2")
    result = evaluate.run(config())
    evaluation = ws.read("evaluation.json", run_id="night2")
    blessing = ws.read("blessing.json", run_id="night2")
    theirs = evaluation["baseline"]
    assert theirs["version"] == 1 and theirs["same_split"] is True and theirs["why"] is None
    assert theirs["examples"] == evaluation["examples"]
    assert theirs["recorded"]["metrics"]["accuracy"] == UNREACHABLE
    expected = independent_scores(ws, config())
    assert theirs["confusion_matrix"] == expected["confusion_matrix"]
    assert theirs["metrics"]["accuracy"] == pytest.approx(expected["metrics"]["accuracy"])
    assert theirs["metrics"]["loss"] == pytest.approx(expected["metrics"]["loss"], rel=1e-3)
    assert [c["f1"] for c in theirs["per_class"]] == pytest.approx([c["f1"] for c in expected["per_class"]])
    # the gate's figure is the same-split one; the recorded one would have refused the candidate
    assert blessing["baseline"]["value"] == theirs["metrics"]["accuracy"] < UNREACHABLE - GATE["tolerance"]
    assert blessing["baseline"]["recorded_value"] == UNREACHABLE and blessing["baseline"]["same_split"] is True
    assert result["blessed"] is True and result["baseline"] == blessing["baseline"]
    assert "baseline version 1 (%.4f on this run's eval split)" % theirs["metrics"]["accuracy"] in result["reason"]
    report = open(os.path.join(ws.run_dir("night2"), "report.html")).read()
    section = report[report.index("<h2>Champion vs challenger</h2>"):report.index("<h2>Confusion matrix</h2>")]
    assert "production v1" in section and "%.4f" % theirs["metrics"]["accuracy"] in section
    assert "%.4f" % theirs["per_class"][1]["f1"] in section


def _drop_column(path, column):
    rows = list(csv.DictReader(open(path)))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, [c for c in rows[0] if c != column])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: v for k, v in row.items() if k != column})


@pytest.mark.parametrize("change, why", [
    ("column_gone", "its column(s) 'plan' are not in this run's data"),
    ("type_changed", "its column 'autopay' was yes/no (boolean), tonight it is text (categorical)"),
    ("savedmodel_broken", "its SavedModel in "),
])
def test_a_production_model_that_cannot_read_tonights_data_falls_back_to_its_recorded_score(
        production, tmp_path, capsys, change, why):
    """Night 2 without version 1's column ``plan``, with ``autopay`` read as text, or with version 1's
    SavedModel unreadable: version 1 cannot score night 2's eval split. A warning, evaluation.json
    and blessing.json say so and why (``same_split`` false), and the gate compares its recorded
    score, here the unreachable 1.5: the candidate is not blessed, the reason naming the recorded
    figure."""
    ws = copy_of(production, tmp_path)
    path = os.path.join(ws.data, "churn.csv")
    write_mixed_csv(path, seed=1)
    extra = None
    if change == "column_gone":
        _drop_column(path, "plan")
    elif change == "type_changed":
        extra = {"columns": {"customer_id": "ignore", "autopay": "categorical"}}
    else:
        with open(os.path.join(ws.models, "blobs", "1", "saved_model.pb"), "wb") as handle:
            handle.write(b"not a SavedModel")
    config = night(ws, "night2", data_section=extra)
    capsys.readouterr()
    with pytest.raises(NotBlessed) as info:
        evaluate.run(config())
    assert "production model (version 1) cannot read this run's data: %s" % why in capsys.readouterr().out
    evaluation = ws.read("evaluation.json", run_id="night2")
    blessing = ws.read("blessing.json", run_id="night2")
    assert evaluation["baseline"]["same_split"] is False and evaluation["baseline"]["why"].startswith(why)
    assert "metrics" not in evaluation["baseline"]
    assert evaluation["baseline"]["recorded"]["metrics"]["accuracy"] == UNREACHABLE
    assert blessing["baseline"]["same_split"] is False and blessing["baseline"]["why"] == evaluation["baseline"]["why"]
    assert blessing["baseline"]["value"] == blessing["baseline"]["recorded_value"] == UNREACHABLE
    assert "worse than baseline version 1 (1.5000 recorded: it cannot score this run's data)" in \
        info.value.result["reason"]
    report = open(os.path.join(ws.run_dir("night2"), "report.html")).read()
    assert "production version 1 cannot score this run's data" in report
