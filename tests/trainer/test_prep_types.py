"""Real tables in prep: column types, text categories, missing values and their schema.

Every test prepares a small CSV with the prep stage's own ``run()`` and reads what it wrote:
``schema.json`` (types, vocabularies, missing counts), ``stats.json`` and the TFRecord shards.
"""

import json
import math
import os

import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow as tf  # noqa: E402

from conftest import Workspace, write_mixed_csv  # noqa: E402
from trainer import prep  # noqa: E402
from trainer import config as config_mod  # noqa: E402
from trainer.errors import BadInput  # noqa: E402

CHURN = {"path": "churn.csv", "label": "churn"}


@pytest.fixture
def churn(tmp_path):
    """A workspace whose data/churn.csv is :func:`conftest.write_mixed_csv`'s 400-row table."""
    ws = Workspace(tmp_path / "churn")
    ws.rows = write_mixed_csv(os.path.join(ws.data, "churn.csv"))
    return ws


def write_table(ws, header, rows, name="t.csv"):
    with open(os.path.join(ws.data, name), "w") as handle:
        handle.write(",".join(header) + "\n")
        for row in rows:
            handle.write(",".join(row) + "\n")


def load(result):
    ddir = result["dataset_dir"]
    with open(os.path.join(ddir, "schema.json")) as a, open(os.path.join(ddir, "stats.json")) as b:
        return json.load(a), json.load(b)


def features_by_name(schema):
    return {f["name"]: f for f in schema["features"]}


def read_records(result, schema, split="train"):
    """``(numbers, texts, keys)`` of a split's records, parsed with TensorFlow itself."""
    numeric = [f for f in schema["features"] if f["type"] != "categorical"]
    texts = [f for f in schema["features"] if f["type"] == "categorical"]
    spec = {"features": tf.io.FixedLenFeature([len(numeric)], tf.float32),
            "key": tf.io.FixedLenFeature([], tf.string)}
    if texts:
        spec["categories"] = tf.io.FixedLenFeature([len(texts)], tf.string)
    out = []
    for name in schema["shards"][split]:
        for record in tf.data.TFRecordDataset(os.path.join(result["dataset_dir"], name)):
            parsed = tf.io.parse_single_example(record, spec)
            out.append((parsed["features"].numpy().tolist(),
                        [t.decode() for t in parsed["categories"].numpy()] if texts else [],
                        parsed["key"].numpy().decode()))
    return out


def test_types_are_inferred_text_boolean_and_numeric(churn):
    """Without data.columns, a text column is categorical, a yes/no column boolean, the rest
    numeric (zip codes too: they are numbers); the source of each type is "inferred"."""
    schema, stats = load(prep.run(churn.config("prep", data=CHURN)))
    by = features_by_name(schema)
    assert {n: f["type"] for n, f in by.items()} == {
        "customer_id": "categorical", "tenure": "float", "monthly": "float", "plan": "categorical",
        "autopay": "boolean", "zip": "float"}
    assert {f["source"] for f in schema["features"]} == {"inferred"}
    assert stats["features"]["autopay"]["min"] == 0.0 and stats["features"]["autopay"]["max"] == 1.0


def test_data_columns_override_inference_and_ignore_drops_a_column(churn):
    """data.columns types zip categorical (its five digits become texts), autopay numeric is
    refused at its first 'yes' naming the cell, and customer_id "ignore" leaves the records and
    the schema's features, listed under ignored."""
    data = dict(CHURN, columns={"zip": "categorical", "customer_id": "ignore", "tenure": "numeric"})
    result = prep.run(churn.config("prep", data=data))
    schema, _ = load(result)
    by = features_by_name(schema)
    assert "customer_id" not in by and schema["ignored"] == ["customer_id"]
    assert (by["zip"]["type"], by["zip"]["source"]) == ("categorical", "data.columns")
    assert (by["tenure"]["type"], by["tenure"]["source"]) == ("float", "data.columns")
    assert sorted(by["zip"]["vocabulary"]) == sorted({r["zip"] for r in churn.rows})
    records = read_records(result, schema)
    assert {(len(numbers), len(texts)) for numbers, texts, _ in records} == {(3, 2)}  # tenure, monthly, autopay | plan, zip
    assert {texts[1] for _, texts, _ in records} <= {r["zip"] for r in churn.rows}

    with pytest.raises(BadInput) as info:
        prep.run(churn.config("prep", data=dict(CHURN, columns={"autopay": "numeric"})))
    message = str(info.value)
    for words in ("churn.csv line 2 column 'autopay'", "is not a number", "Fix:", "data.columns"):
        assert words in message, message


def test_vocabulary_is_top_k_of_the_train_split_with_a_minimum_count(tmp_path):
    """The vocabulary keeps the most frequent train values (ties by value), at least
    data.min_frequency each and data.max_vocabulary at most; the rest are out-of-vocabulary
    (counted), and a value seen only in eval rows never enters it."""
    ws = Workspace(tmp_path / "vocab")
    counts = {"a": 40, "b": 30, "c": 20, "d": 3, "e": 3}
    rows, i = [], 0
    for value, count in counts.items():
        for _ in range(count):
            rows.append(["k%d" % i, "%d" % (i % 5), value, str(i % 2)])
            i += 1
    data = {"path": "t.csv", "key": "id", "eval_fraction": 0.25}
    held_out = next("e%d" % n for n in range(100) if prep.is_eval("e%d" % n, 42, 0.25))
    rows.append([held_out, "1", "only_in_eval", "1"])
    write_table(ws, ["id", "x", "colour", "label"], rows)
    result = prep.run(ws.config("prep", data=dict(data, max_vocabulary=3, min_frequency=4)))
    schema, stats = load(result)
    colour = features_by_name(schema)["colour"]
    train = [r for r in rows if not prep.is_eval(r[0], 42, 0.25)]
    train_counts = {v: sum(1 for r in train if r[2] == v) for v in counts}
    assert colour["vocabulary"] == ["a", "b", "c"]
    assert colour["encoding"] == "vocabulary"
    assert colour["distinct"] == len(set(r[2] for r in train))
    assert "only_in_eval" not in colour["vocabulary"] and "only_in_eval" not in {r[2] for r in train}
    assert colour["oov_train"] == train_counts["d"] + train_counts["e"]
    assert stats["features"]["colour"]["distinct"] == colour["distinct"]
    # a lower minimum count lets the rare values in, most frequent first, ties by value
    schema, _ = load(prep.run(ws.config("prep", data=dict(data, max_vocabulary=10, min_frequency=2))))
    expected = sorted((v for v in counts if train_counts[v] >= 2), key=lambda v: (-train_counts[v], v))
    assert features_by_name(schema)["colour"]["vocabulary"] == expected
    assert {"d", "e"} & set(expected)


def test_a_column_above_the_hash_threshold_is_hashed(tmp_path):
    """A text column with more distinct train values than data.hash_threshold is hashed into
    data.hash_bins buckets, with no vocabulary kept; one below it keeps its vocabulary."""
    ws = Workspace(tmp_path / "hash")
    write_table(ws, ["city", "size", "x", "label"],
                [["city%d" % i, "s%d" % (i % 3), str(i), str(i % 2)] for i in range(200)])
    schema, _ = load(prep.run(ws.config("prep", data={"path": "t.csv", "hash_threshold": 50, "hash_bins": 64})))
    city, size = features_by_name(schema)["city"], features_by_name(schema)["size"]
    assert city == {"name": "city", "type": "categorical", "source": "inferred", "encoding": "hash",
                    "hash_bins": 64, "distinct_above": 50, "missing": {"train": 0, "eval": 0}}
    assert size["encoding"] == "vocabulary" and sorted(size["vocabulary"]) == ["s0", "s1", "s2"]


def test_na_tokens_are_missing_values_and_numbers_get_the_mean_of_the_rest(churn):
    """Empty cells and the default NA tokens are missing, not errors: numbers are NaN in the
    records, the train mean and std leave them out, missing counts per split are in schema.json
    and stats.json; an empty text is "" in the records."""
    result = prep.run(churn.config("prep", data=CHURN))
    schema, stats = load(result)
    by = features_by_name(schema)
    train = read_records(result, schema)
    numeric = [f["name"] for f in schema["features"] if f["type"] != "categorical"]
    texts = [f["name"] for f in schema["features"] if f["type"] == "categorical"]
    tenure = [numbers[numeric.index("tenure")] for numbers, _, _ in train]
    present = [v for v in tenure if not math.isnan(v)]
    assert by["tenure"]["missing"]["train"] == len(tenure) - len(present) > 0
    assert stats["features"]["tenure"]["missing"] == by["tenure"]["missing"]["train"]
    assert stats["features"]["tenure"]["count"] == len(present)
    assert stats["features"]["tenure"]["mean"] == pytest.approx(sum(present) / len(present), rel=1e-5)
    assert by["monthly"]["missing"]["train"] + by["monthly"]["missing"]["eval"] == \
        sum(1 for r in churn.rows if r["monthly"] == "NA")
    plans = [t[texts.index("plan")] for _, t, _ in train]
    assert plans.count("") == by["plan"]["missing"]["train"] > 0
    assert "" not in by["plan"]["vocabulary"]
    assert schema["na_values"] == ["", "NA", "NaN", "None", "null"]


def test_data_na_values_replaces_the_tokens(tmp_path):
    """With data.na_values ["?"], "?" is missing and "NA" is an ordinary text value; an empty
    cell stays missing whatever the list."""
    ws = Workspace(tmp_path / "na")
    cells = [["?", "NA", "0"], ["", "?", "1"], ["3", "", "0"], ["4", "b", "1"]] * 10
    write_table(ws, ["id", "x", "c", "label"], [[str(i)] + row for i, row in enumerate(cells)])
    result = prep.run(ws.config("prep", data={"path": "t.csv", "key": "id", "na_values": ["?"], "eval_fraction": 0.2}))
    schema, _ = load(result)
    by = features_by_name(schema)
    assert by["x"]["type"] == "float"
    assert sum(by["x"]["missing"].values()) == 20
    assert sum(by["c"]["missing"].values()) == 20
    assert "NA" in by["c"]["vocabulary"] and "?" not in by["c"]["vocabulary"]


def test_a_missing_label_is_an_error_naming_the_row(churn):
    """A row without a label stops prep with the file, line and column, and the two fixes."""
    path = os.path.join(churn.data, "churn.csv")
    lines = open(path).read().splitlines()
    lines[9] = lines[9].rsplit(",", 1)[0] + ",NA"
    open(path, "w").write("\n".join(lines) + "\n")
    with pytest.raises(BadInput) as info:
        prep.run(churn.config("prep", data=CHURN))
    message = str(info.value)
    assert "churn.csv line 10 column 'churn': missing label ('NA' is in data.na_values)" in message
    assert "Fix:" in message and "data.drop_missing_labels" in message


def test_drop_missing_labels_drops_and_counts_the_rows(churn, capsys):
    """With data.drop_missing_labels, rows without a label are left out, counted in schema.json
    (with their first lines) and logged."""
    path = os.path.join(churn.data, "churn.csv")
    lines = open(path).read().splitlines()
    for at in (4, 20, 21):
        lines[at] = lines[at].rsplit(",", 1)[0] + ","
    open(path, "w").write("\n".join(lines) + "\n")
    result = prep.run(churn.config("prep", data=dict(CHURN, drop_missing_labels=True)))
    schema, _ = load(result)
    assert sum(result["examples"].values()) == 400 - 3
    assert schema["dropped_rows"] == {"count": 3, "first_lines": [5, 21, 22]}
    assert "dropped 3 row(s) without a label" in capsys.readouterr().out


def test_the_schema_is_written_beside_stats_json(churn):
    """schema.json, beside stats.json in the data set, holds per column its type, source, missing
    counts per split and, for text, the encoding and vocabulary; and the NA tokens."""
    result = prep.run(churn.config("prep", data=CHURN))
    assert {"schema.json", "stats.json"} <= set(os.listdir(result["dataset_dir"]))
    schema, _ = load(result)
    plan = features_by_name(schema)["plan"]
    assert set(plan) == {"name", "type", "source", "missing", "encoding", "vocabulary", "distinct", "oov_train"}
    assert sorted(plan["vocabulary"]) == ["basic", "premium", "standard"]
    assert set(plan["missing"]) == {"train", "eval"}
    assert schema["ignored"] == [] and schema["dropped_rows"]["count"] == 0


def test_a_bad_cell_in_a_numeric_override_names_file_row_column_and_fix(churn):
    """A column typed numeric by data.columns that holds a text: the error names the file, the
    line, the column and the fixes (na_values, or type the column categorical)."""
    data = dict(CHURN, columns={"plan": "numeric"})
    with pytest.raises(BadInput) as info:
        prep.run(churn.config("prep", data=data))
    message = str(info.value)
    first = next(i for i, r in enumerate(churn.rows) if r["plan"])
    assert "churn.csv line %d column 'plan': %r is not a number" % (first + 2, churn.rows[first]["plan"]) in message
    assert "data.na_values" in message and "{'plan': \"categorical\"}" in message


def test_a_few_texts_in_a_numeric_column_are_errors_not_categories(churn):
    """A column that is numbers but for one typo stays numeric: the typo is an error naming it,
    not a reason to read the whole column as text."""
    path = os.path.join(churn.data, "churn.csv")
    lines = open(path).read().splitlines()
    cells = lines[50].split(",")
    cells[2] = "5x"
    lines[50] = ",".join(cells)
    open(path, "w").write("\n".join(lines) + "\n")
    with pytest.raises(BadInput) as info:
        prep.run(churn.config("prep", data=CHURN))
    assert "churn.csv line 51 column 'monthly': '5x' is not a number" in str(info.value)


def test_a_bad_boolean_and_an_unknown_column_are_named(churn):
    """A boolean column's other text names the cell; a data.columns name not in the header
    names the header's closest columns."""
    with pytest.raises(BadInput) as info:
        prep.run(churn.config("prep", data=dict(CHURN, columns={"plan": "boolean"})))
    assert "column 'plan'" in str(info.value) and "is not a boolean" in str(info.value)
    with pytest.raises(BadInput) as info:
        prep.run(churn.config("prep", data=dict(CHURN, columns={"plann": "categorical"})))
    assert "(data.columns) is not in the header" in str(info.value) and "(close: 'plan')" in str(info.value)
    with pytest.raises(BadInput) as info:
        config_mod.resolve(churn.config("prep", data=dict(CHURN, columns={"plan": "text"})))
    assert "data.columns['plan']" in str(info.value) and "categorical" in str(info.value)


def test_batched_prep_of_a_mixed_table_equals_one_batch(churn, tmp_path, monkeypatch):
    """Cut into many batches on two workers, a mixed table gives the same records, vocabularies
    and statistics as one batch: counts are merged before the top-k, and the profiles (histograms,
    value frequencies) are exactly equal."""
    one = prep.run(churn.config("prep", data=CHURN))
    monkeypatch.setattr(prep, "READ_BYTES", 1024)
    monkeypatch.setattr(prep, "BATCH_BYTES", 2048)
    monkeypatch.setattr(prep, "usable_cpus", lambda: 2)
    other = Workspace(tmp_path / "batched")
    write_mixed_csv(os.path.join(other.data, "churn.csv"))
    many = prep.run(other.config("prep", data=CHURN))
    assert many["fingerprint"] == one["fingerprint"]
    for name in sorted(os.listdir(one["dataset_dir"])):
        if name.endswith(".tfrecord") or name == "schema.json":
            with open(os.path.join(one["dataset_dir"], name), "rb") as a, \
                    open(os.path.join(many["dataset_dir"], name), "rb") as b:
                assert a.read() == b.read(), name
    stats = [load(result)[1] for result in (one, many)]
    assert stats[0]["class_histogram"] == stats[1]["class_histogram"]
    for name, summary in stats[0]["features"].items():
        profile = {key: summary.pop(key) for key in ("histogram", "frequencies") if key in summary}
        assert profile and {key: stats[1]["features"][name].pop(key) for key in profile} == profile, name
        assert stats[1]["features"][name] == pytest.approx(summary, rel=1e-12), name


def test_the_fingerprint_changes_with_the_new_settings(churn):
    """Each new data setting that changes the data set changes the fingerprint; a config that
    leaves them at their defaults hashes what it hashed before they existed."""
    base = prep.run(churn.config("prep", data=CHURN))["fingerprint"]
    seen = {base}
    for patch in ({"columns": {"zip": "categorical"}}, {"na_values": ["?"]}, {"drop_missing_labels": True},
                  {"max_vocabulary": 2}, {"min_frequency": 3}, {"hash_threshold": 2}, {"hash_bins": 8}):
        fp = prep.run(churn.config("prep", data=dict(CHURN, **patch)))["fingerprint"]
        assert fp not in seen, patch
        seen.add(fp)
    settings = prep.prep_settings(config_mod.resolve(churn.config("prep", data=CHURN))["data"])
    assert not {"columns", "na_values", "drop_missing_labels", "max_vocabulary"} & set(settings)


def test_a_numeric_table_without_gaps_keeps_its_records(ws):
    """A plain numeric CSV is written as before: a float vector per record and no categories."""
    result = prep.run(ws.config("prep"))
    schema, stats = load(result)
    assert [(f["name"], f["type"]) for f in schema["features"]] == [("f%d" % i, "float") for i in range(4)]
    record = next(iter(tf.data.TFRecordDataset(os.path.join(result["dataset_dir"], schema["shards"]["train"][0]))))
    assert set(tf.train.Example.FromString(record.numpy()).features.feature) == {"features", "label", "key"}
    assert all(stats["features"]["f%d" % i]["missing"] == 0 for i in range(4))
