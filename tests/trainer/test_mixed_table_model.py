"""A table with text categories and empty cells, from prep to the served model.

The stages run through their own ``run()`` as the pipeline runs them: prep, train, evaluate,
export. The exported SavedModel is loaded afresh and served raw cells: texts (an unseen one
too), ``""`` and NaN.
"""

import json
import os
import sys

import numpy as np
import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow as tf  # noqa: E402

from conftest import Workspace, write_mixed_csv  # noqa: E402
from trainer import data as data_mod  # noqa: E402
from trainer import common, evaluate, export, models, prep, train  # noqa: E402

CHURN = {"path": "churn.csv", "label": "churn", "columns": {"customer_id": "ignore"}}
SECTIONS = {"data": CHURN, "training": {"epochs": 4, "learning_rate": 0.02},
            "evaluation": {"threshold": 0.7}}


def run_pipeline(ws, run_id=None, training=None):
    """prep, train, evaluate and export of :data:`SECTIONS` (``training`` merged in)."""
    sections = dict(SECTIONS, training=dict(SECTIONS["training"], **(training or {})))
    prep.run(ws.config("prep", run_id=run_id, **sections))
    trained = train.run(ws.config("train", run_id=run_id, **sections))
    evaluate.run(ws.config("evaluate", run_id=run_id, **sections))
    return trained, export.run(ws.config("export", run_id=run_id, **sections))


@pytest.fixture
def churn(tmp_path):
    """A workspace whose data/churn.csv is :func:`conftest.write_mixed_csv`'s 400-row table."""
    ws = Workspace(tmp_path / "churn")
    write_mixed_csv(os.path.join(ws.data, "churn.csv"))
    return ws


def test_a_mixed_table_trains_and_serves_raw_strings_unseen_values_and_gaps(churn):
    """The mlp learns a table with text, boolean and numeric columns and empty cells; the
    exported signature takes one raw input per column (strings for text and booleans, floats
    for numbers) and answers finite probabilities for an unseen category, "" and NaN; the run
    report lists the columns with their types, missing counts and vocabularies."""
    _, result = run_pipeline(churn)
    meta = json.load(open(os.path.join(result["model_dir"], "metadata.json")))
    inputs = meta["signature"]["inputs"]
    assert {n: (i["dtype"], i["type"]) for n, i in inputs.items()} == {
        "tenure": ("float32", "float"), "monthly": ("float32", "float"), "plan": ("string", "categorical"),
        "autopay": ("string", "boolean"), "zip": ("float32", "float")}
    assert meta["evaluation"]["metrics"]["accuracy"] >= 0.7
    assert sorted(next(f for f in meta["data"]["features"] if f["name"] == "plan")["vocabulary"]) == [
        "basic", "premium", "standard"]

    serve = tf.saved_model.load(result["model_dir"]).signatures["serving_default"]
    nan = float("nan")
    out = serve(tenure=tf.constant([5.0, 55.0, nan, 20.0]), monthly=tf.constant([80.0, 30.0, nan, nan]),
                plan=tf.constant(["basic", " premium ", "platinum", ""]),
                autopay=tf.constant(["no", "YES", "", "maybe"]), zip=tf.constant([10001.0, 10002.0, nan, 99999.0]))
    probabilities = out["probabilities"].numpy()
    assert probabilities.shape == (4, 2) and np.isfinite(probabilities).all()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    # short tenure on the basic plan churns, long tenure on premium does not (as the data says)
    assert [n.decode() for n in out["class_name"].numpy()[:2]] == ["1", "0"]

    report = open(result["report"]).read()
    assert "<h3>Columns</h3>" in report and "categorical" in report and "premium" in report
    assert "customer_id" in report  # under ignored columns


def test_the_model_imputes_the_train_mean_and_flags_missing_numbers(churn):
    """Inside the mlp a missing number reads as its train mean (0 after normalising) and, for a
    column with missing train values, a missing-indicator input says so: NaN and the mean differ
    only through that indicator."""
    prep.run(churn.config("prep", **SECTIONS))
    _, schema, stats = common.load_dataset(churn.config("train", **SECTIONS))
    spec = data_mod.input_spec(schema)
    model = models.mlp(spec, 2, stats)
    normalize = model.get_layer("normalize")
    names = spec["feature_names"]
    mean = np.array([[stats["features"][n]["mean"] for n in names]], np.float32)
    gaps = np.where(np.eye(len(names), dtype=bool)[:1], np.nan, mean).astype(np.float32)
    np.testing.assert_allclose(normalize(tf.constant(gaps)).numpy(), 0.0, atol=1e-5)
    indicator = model.get_layer("missing")
    with_missing = [n for n in names if stats["features"][n]["missing"]]
    assert [names[c] for c in indicator.columns] == with_missing == ["tenure", "monthly"]
    assert indicator(tf.constant(gaps)).numpy().tolist() == [[1.0, 0.0]]


def test_warm_start_is_skipped_when_a_vocabulary_changes(churn, capsys):
    """A new night whose text column gained a value has another vocabulary: the exported version's
    one-hot rows would stand for other values, so warm start is skipped with a warning naming the
    column; a night with the same vocabulary warm-starts from it."""
    run_pipeline(churn)
    prep.run(churn.config("prep", run_id="same", data=CHURN))
    same = train.run(churn.config("train", run_id="same", data=CHURN,
                                  training={"epochs": 1, "warm_start": True}))
    assert same["warm_start"]["version"] == 1
    capsys.readouterr()

    plans = {"basic": 2.0, "standard": 0.0, "premium": -2.0, "family": 1.0}
    write_mixed_csv(os.path.join(churn.data, "churn.csv"), plans=plans)
    prep.run(churn.config("prep", run_id="new_vocabulary", data=CHURN))
    changed = train.run(churn.config("train", run_id="new_vocabulary", data=CHURN,
                                     training={"epochs": 1, "warm_start": True}))
    assert changed["warm_start"] is None
    out = capsys.readouterr().out
    assert "warm start: version 1 was trained on other table columns" in out and "'plan'" in out


USER_MODEL = """\
import tensorflow as tf


def build(input_spec, num_classes, stats):
    seen.append(input_spec)
    numbers = tf.keras.Input(shape=input_spec["shape"], name="features")
    texts = tf.keras.Input(shape=input_spec["inputs"]["categories"]["shape"], dtype="string", name="categories")
    filled = tf.where(tf.math.is_nan(numbers), tf.zeros_like(numbers), numbers) / 100.0
    parts = [filled]
    for i, name in enumerate(input_spec["categorical_names"]):
        column = next(c for c in input_spec["columns"] if c["name"] == name)
        lookup = tf.keras.layers.StringLookup(vocabulary=column["vocabulary"], output_mode="one_hot")
        parts.append(lookup(texts[:, i]))
    x = tf.keras.layers.Concatenate()(parts)
    return tf.keras.Model({"features": numbers, "categories": texts}, tf.keras.layers.Dense(num_classes)(x))


seen = []
"""


def test_a_users_model_builder_receives_types_and_vocabularies(churn, monkeypatch):
    """A custom builder gets, in input_spec, the numeric names, the categorical names and every
    column's schema entry (type, vocabulary); its model trains on the dict of features and
    categories."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    code = os.path.join(churn.data, "code", "mixedmodels")
    os.makedirs(code)
    open(os.path.join(code, "__init__.py"), "w").close()
    with open(os.path.join(code, "lookup.py"), "w") as handle:
        handle.write(USER_MODEL)
    training = {"model": "mixedmodels.lookup:build", "code_path": "code", "epochs": 1}
    prep.run(churn.config("prep", data=CHURN))
    result = train.run(churn.config("train", data=CHURN, training=training))
    assert result["epochs"] == 1
    spec = sys.modules["mixedmodels.lookup"].seen[-1]
    assert spec["feature_names"] == ["tenure", "monthly", "autopay", "zip"]
    assert spec["categorical_names"] == ["plan"]
    assert spec["inputs"] == {"features": {"shape": [4], "dtype": "float32"},
                              "categories": {"shape": [1], "dtype": "string"}}
    plan = next(c for c in spec["columns"] if c["name"] == "plan")
    assert plan["type"] == "categorical" and sorted(plan["vocabulary"]) == ["basic", "premium", "standard"]


def test_a_table_of_text_columns_only_trains_and_serves(tmp_path):
    """Without any numeric column the mlp is built from the text columns alone, and the served
    model takes strings only: a known value is classified, an unseen one and "" still answer."""
    ws = Workspace(tmp_path / "texts")
    with open(os.path.join(ws.data, "t.csv"), "w") as handle:
        handle.write("colour,size,label\n")
        for i in range(240):
            colour = ["red", "blue", "green"][i % 3]
            handle.write("%s,%s,%d\n" % (colour, ["s", "m", "l", ""][i % 4], int(colour == "red")))
    sections = {"data": {"path": "t.csv"}, "training": {"epochs": 4, "learning_rate": 0.05},
                "evaluation": {"threshold": 0.9}}
    prep.run(ws.config("prep", **sections))
    train.run(ws.config("train", **sections))
    evaluate.run(ws.config("evaluate", **sections))
    result = export.run(ws.config("export", **sections))
    serve = tf.saved_model.load(result["model_dir"]).signatures["serving_default"]
    out = serve(colour=tf.constant(["red", "blue", "purple"]), size=tf.constant(["", "m", "xl"]))
    assert np.isfinite(out["probabilities"].numpy()).all()
    assert [n.decode() for n in out["class_name"].numpy()[:2]] == ["1", "0"]


def test_the_mlp_one_hot_encodes_small_vocabularies_and_embeds_large_and_hashed_ones():
    """A vocabulary with at most one_hot_max positions is one-hot encoded; a larger one and a
    hashed column are embedded; unseen values, "" and NaN give finite logits."""
    columns = [{"name": "x", "type": "float", "missing": {"train": 3, "eval": 0}},
               {"name": "small", "type": "categorical", "encoding": "vocabulary", "vocabulary": ["a", "b"]},
               {"name": "large", "type": "categorical", "encoding": "vocabulary",
                "vocabulary": ["v%d" % i for i in range(40)]},
               {"name": "city", "type": "categorical", "encoding": "hash", "hash_bins": 32}]
    spec = {"kind": "tabular", "shape": [1], "dtype": "float32", "feature_names": ["x"], "class_names": ["n", "y"],
            "categorical_names": ["small", "large", "city"], "columns": columns}
    model = models.mlp(spec, 2, {"features": {"x": {"mean": 5.0, "std": 2.0}}}, one_hot_max=16, embedding_dim=4)
    kinds = {layer.name: type(layer).__name__ for layer in model.layers}
    assert (kinds["one_hot_0"], kinds["embed_1"], kinds["hash_2"], kinds["embed_2"]) == (
        "CategoryEncoding", "Embedding", "Hashing", "Embedding")
    assert model.get_layer("embed_1").input_dim == 42 and model.get_layer("embed_2").input_dim == 33
    logits = model({"features": tf.constant([[float("nan")], [7.0]]),
                    "categories": tf.constant([["", "v3", "Paris"], ["zzz", "", ""]])})
    assert logits.shape == (2, 2) and np.isfinite(logits.numpy()).all()
