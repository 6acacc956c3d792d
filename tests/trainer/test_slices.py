"""Slices of the eval split (``evaluation.slices``): metrics of the candidate and the production model
per value of a text, yes/no or bucketed numeric column, missing cells included, and the slice floor."""

import csv
import os

import numpy as np
import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow as tf  # noqa: E402

from conftest import Workspace, write_mixed_csv  # noqa: E402
from trainer import common, data, evaluate, export, prep, slices, train  # noqa: E402
from trainer import config as config_mod  # noqa: E402
from trainer.errors import BadInput, NotBlessed  # noqa: E402

CHURN = {"path": "churn.csv", "label": "churn", "columns": {"customer_id": "ignore"}}
TRAINING = {"epochs": 3, "learning_rate": 0.02}
SLICES = ["plan", "autopay", {"column": "tenure", "buckets": [20, 40]}]
GATE = {"threshold": 0.0, "tolerance": 1.0, "slices": SLICES}

#: A schema of the churn table's kind: numeric, yes/no and text columns.
SCHEMA = {"format": "csv", "features": [{"name": "tenure", "type": "float"}, {"name": "autopay", "type": "boolean"},
                                        {"name": "plan", "type": "categorical"}, {"name": "zip", "type": "int"}]}


def write_churn(path, seed):
    """:func:`conftest.write_mixed_csv`'s table, with every 9th ``autopay`` cell empty (a missing yes/no)."""
    write_mixed_csv(path, seed=seed)
    rows = list(csv.DictReader(open(path)))
    for i, row in enumerate(rows):
        if i % 9 == 4:
            row["autopay"] = ""
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.fixture(scope="module")
def nights(tmp_path_factory):
    """Night 1 (seed 0) trained and exported as version 1; night 2 (seed 1) prepared and trained.
    Returns ``(workspace, evaluate config factory of night 2)``."""
    ws = Workspace(tmp_path_factory.mktemp("slices"))
    path = os.path.join(ws.data, "churn.csv")
    for seed, run_id in ((0, "night1"), (1, "night2")):
        write_churn(path, seed)
        prep.run(ws.config("prep", run_id=run_id, data=CHURN, training=TRAINING))
        train.run(ws.config("train", run_id=run_id, data=CHURN, training=TRAINING))
        if run_id == "night1":
            evaluate.run(ws.config("evaluate", run_id=run_id, data=CHURN, training=TRAINING, evaluation=GATE))
            export.run(ws.config("export", run_id=run_id, data=CHURN, training=TRAINING))

    def config(**evaluation):
        return ws.config("evaluate", run_id="night2", data=CHURN, training=TRAINING, evaluation=dict(GATE, **evaluation))
    return ws, config


def test_slice_values_of_text_yes_no_and_bucketed_numeric_columns_with_missing_cells():
    """Text: one value per text, "" missing (listed last); yes/no: false, true, missing from 0/1/NaN;
    numeric: < e1, [e1, e2), >= e2 (an edge opens its bucket) and missing from NaN."""
    specs = slices.resolve(["plan", "autopay", {"column": "tenure", "buckets": [12, 24]}], SCHEMA)
    assert [(s["column"], s["kind"], s["source"], s["index"]) for s in specs] == [
        ("plan", "text", "categories", 0), ("autopay", "boolean", "features", 1), ("tenure", "numeric", "features", 0)]
    names, codes = slices.slice_values(specs[0], np.array(["b", "", "a", "b"], dtype=object))
    assert names == ["a", "b", None] and codes.tolist() == [1, 2, 0, 1]
    names, codes = slices.slice_values(specs[1], np.array([1.0, np.nan, 0.0, 1.0]))
    assert names == ["false", "true", None] and codes.tolist() == [1, 2, 0, 1]
    names, codes = slices.slice_values(specs[2], np.array([3.0, 12.0, 23.9, 24.0, np.nan, 99.0]))
    assert names == ["< 12", "[12, 24)", ">= 24", None] and codes.tolist() == [0, 1, 1, 2, 3, 2]
    x = {"features": np.array([[5.0, 1.0, 0.0, 10001.0]], np.float32), "categories": np.array([[b"basic"]])}
    assert slices.column_values(specs[0], x).tolist() == ["basic"]
    assert slices.column_values(specs[2], x).tolist() == [5.0]


@pytest.mark.parametrize("item, message", [
    ("plna", "evaluation.slices[0]: no feature column 'plna' in this run's data (did you mean 'plan'?). "
             "Fix: name one of 'autopay', 'plan', 'tenure', 'zip'."),
    ({"column": "plan", "buckets": [1, 2]}, "evaluation.slices[0].buckets: 'plan' is a text column; buckets cut "
                                            "numeric columns. Fix: name the column alone: 'plan'."),
    ({"column": "autopay", "buckets": [0.5]}, "evaluation.slices[0].buckets: 'autopay' is a yes/no column"),
    ("tenure", "evaluation.slices[0]: 'tenure' is a numeric column: its slices need bucket edges. "
               "Fix: write {\"column\": 'tenure', \"buckets\": [ascending edges]}."),
])
def test_a_slice_of_an_unknown_column_or_buckets_on_a_text_column_is_bad_input_naming_field_and_fix(item, message):
    """Only the trainer knows the columns: an unknown one (with a did-you-mean), buckets on a text or
    yes/no column and a numeric column without buckets are refused with the field and the fix."""
    with pytest.raises(BadInput) as info:
        slices.resolve([item], SCHEMA)
    assert str(info.value).startswith(message), str(info.value)


def test_slices_of_images_are_bad_input():
    """Images have no columns: evaluation.slices is refused and the fix says to remove it."""
    with pytest.raises(BadInput, match=r"evaluation.slices: this run's data is images.*Fix: remove evaluation.slices"):
        slices.resolve(["plan"], {"format": "images", "features": []})


@pytest.mark.parametrize("value, message", [
    ("plan", "evaluation.slices: must be a list of columns, got 'plan'. Fix: e.g."),
    ([{"column": "tenure", "buckets": [24, 12]}], "evaluation.slices[0].buckets: must be ascending numbers, "
                                                  "got [24, 12]. Fix: give the bucket edges in ascending order"),
    ([{"column": "tenure", "bucket": [12]}], "evaluation.slices[0].bucket: unknown key (did you mean 'buckets'?). "
                                             "Fix: use column and buckets."),
    ([3], "evaluation.slices[0]: must be a column name or {column, buckets}, got 3."),
])
def test_a_malformed_slices_config_is_refused_when_the_config_is_resolved(ws, value, message):
    """The structure of evaluation.slices is checked with the rest of the config, before any data
    is read: not a list, descending edges, an unknown key, an item of another type."""
    with pytest.raises(BadInput) as info:
        config_mod.resolve(ws.config("evaluate", evaluation={"slices": value}))
    assert str(info.value).startswith(message), str(info.value)


def test_an_unknown_slice_column_stops_the_evaluate_stage_before_it_scores(nights):
    """The stage checks the slices against the data set's schema first: BadInput, no evaluation.json."""
    ws, config = nights
    with pytest.raises(BadInput, match=r"evaluation.slices\[1\]: no feature column 'tenur' .*did you mean 'tenure'"):
        evaluate.run(config(slices=["plan", {"column": "tenur", "buckets": [1]}]))
    assert not os.path.exists(os.path.join(ws.run_dir("night2"), "evaluation.json"))


def test_both_models_are_measured_per_slice_value_in_evaluation_json_and_the_report(nights):
    """Night 2, version 1 in production: evaluation.json lists every value of each slice column that
    occurs, missing cells included (as many as the schema counts in the eval split), with the rows
    and both models' metrics; each column's values add up to the whole split, correct answers
    included; a bucket's candidate accuracy is what the model scores on those rows read
    independently; the report has the slice table."""
    ws, config = nights
    evaluate.run(config())
    evaluation = ws.read("evaluation.json", run_id="night2")
    sliced = evaluation["slices"]
    assert [c["column"] for c in sliced["columns"]] == ["plan", "autopay", "tenure"]
    assert sliced["metric"] == "accuracy" and sliced["floor"] == 0 and sliced["below_floor"] == []
    values = {}
    for entry in sliced["values"]:
        values.setdefault(entry["column"], []).append(entry)
    assert [e["value"] for e in values["plan"]] == ["basic", "premium", "standard", None]
    assert [e["value"] for e in values["autopay"]] == ["false", "true", None]
    assert [e["value"] for e in values["tenure"]] == ["< 20", "[20, 40)", ">= 40", None]
    _, schema, _ = common.load_dataset(config())
    total = evaluation["examples"]
    for column, entries in values.items():
        feature = next(f for f in schema["features"] if f["name"] == column)
        assert entries[-1]["rows"] == feature["missing"]["eval"] > 0
        assert sum(e["rows"] for e in entries) == total
        for model, overall in (("candidate", evaluation["metrics"]), ("production", evaluation["baseline"]["metrics"])):
            correct = sum(e[model]["accuracy"] * e["rows"] for e in entries)
            assert correct == pytest.approx(overall["accuracy"] * total)
    # [20, 40) of tenure, the other way: filter the parsed eval records and predict them
    model = evaluate.load_final_model(config_mod.resolve(config()), schema, common.load_dataset(config())[2])
    hits = rows = 0
    dataset_dir = common.load_dataset(config())[0]
    for x, y in data.base_dataset(dataset_dir, schema, "eval", cache=False).batch(50):
        tenure = x["features"][:, 0].numpy()
        keep = (tenure >= 20) & (tenure < 40)
        predicted = tf.argmax(model(x, training=False), axis=1).numpy()
        hits += int((predicted[keep] == y.numpy()[keep]).sum())
        rows += int(keep.sum())
    middle = values["tenure"][1]
    assert middle["rows"] == rows and middle["candidate"]["accuracy"] == pytest.approx(hits / float(rows))
    assert middle["production"] is not None and set(middle["production"]) == set(middle["candidate"])
    report = open(os.path.join(ws.run_dir("night2"), "report.html")).read()
    table = report[report.index("<h2>Slices</h2>"):report.index("<h2>Confusion matrix</h2>")]
    assert "(missing)" in table and "[20, 40)" in table and "production accuracy" in table
    assert "%.4f" % values["plan"][0]["production"]["accuracy"] in table


def test_a_slice_below_the_floor_refuses_the_blessing_and_the_reason_names_it(nights):
    """With slice_floor just above the weakest slice value's accuracy the candidate is not blessed,
    the reason naming that slice (column=value), its accuracy, rows and the floor; with slice_min_rows
    above every slice's rows the floor counts for none and the candidate is blessed."""
    ws, config = nights
    evaluate.run(config())
    entries = ws.read("evaluation.json", run_id="night2")["slices"]["values"]
    weakest = min(entries, key=lambda e: (e["candidate"]["accuracy"], -e["rows"]))
    assert weakest["candidate"]["accuracy"] < 1.0
    floor = weakest["candidate"]["accuracy"] + 1e-4
    name = "%s=%s" % (weakest["column"], "(missing)" if weakest["value"] is None else weakest["value"])
    with pytest.raises(NotBlessed) as info:
        evaluate.run(config(slice_floor=floor, slice_min_rows=weakest["rows"]))
    assert "but slice %s: accuracy %.4f on %d eval rows is below the slice floor %.4f" % (
        name, weakest["candidate"]["accuracy"], weakest["rows"], floor) in info.value.result["reason"]
    blessing = ws.read("blessing.json", run_id="night2")
    assert blessing["blessed"] is False and name in blessing["slices_below_floor"]
    report = open(os.path.join(ws.run_dir("night2"), "report.html")).read()
    assert "below the floor" in report[report.index("<h2>Slices</h2>"):]
    passed = evaluate.run(config(slice_floor=floor, slice_min_rows=max(e["rows"] for e in entries) + 1))
    assert passed["blessed"] is True and passed["slices_below_floor"] == []
