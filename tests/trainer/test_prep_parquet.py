"""Parquet tables in prep (``data.format: parquet``): a file or a folder of ``*.parquet`` files.

Every test writes its Parquet files with pyarrow, prepares them with the prep stage's own
``run()`` and reads what it wrote (``schema.json``, ``stats.json``, the TFRecord shards), or reads
them with the batch reader prep uses.
"""

import json
import math
import os

import pytest

# Inside the image TensorFlow and pyarrow must import: a broken image fails collection, never skips.
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from conftest import Workspace, write_mixed_csv  # noqa: E402
from test_prep_types import read_records  # noqa: E402
from trainer import contract, prep, sources  # noqa: E402
from trainer import config as config_mod  # noqa: E402
from trainer.errors import BadInput  # noqa: E402

#: The churn table keyed by its customer ids, so that a CSV and a Parquet copy split alike.
KEYED = {"label": "churn", "key": "customer_id"}


def arrow_table(rows, zip_type=pa.int64()):
    """:func:`conftest.write_mixed_csv`'s rows as typed columns: empty cells null, ``NA`` a float NaN
    (as pandas writes a missing float), yes/no booleans, ``zip`` as ``zip_type``."""
    def number(text):
        return None if text == "" else float("nan") if text == "NA" else float(text)
    return pa.table({
        "customer_id": pa.array([r["customer_id"] for r in rows], pa.string()),
        "tenure": pa.array([number(r["tenure"]) for r in rows], pa.float64()),
        "monthly": pa.array([number(r["monthly"]) for r in rows], pa.float64()),
        "plan": pa.array([r["plan"] or None for r in rows], pa.string()),
        "autopay": pa.array([r["autopay"] == "yes" for r in rows], pa.bool_()),
        "zip": pa.array([r["zip"] for r in rows], pa.string()).cast(zip_type),
        "churn": pa.array([int(r["churn"]) for r in rows], pa.int64()),
    })


@pytest.fixture
def both(tmp_path):
    """A workspace with the same 400-row churn table twice: ``data/csv/`` (two CSV files) and
    ``data/parquet/`` (two Parquet files, typed, several row groups each)."""
    ws = Workspace(tmp_path / "both")
    rows = write_mixed_csv(os.path.join(ws.data, "all.csv"))
    header = open(os.path.join(ws.data, "all.csv")).readline()
    lines = open(os.path.join(ws.data, "all.csv")).read().splitlines(True)[1:]
    os.remove(os.path.join(ws.data, "all.csv"))
    os.makedirs(os.path.join(ws.data, "csv"))
    os.makedirs(os.path.join(ws.data, "parquet"))
    for part, (start, end) in enumerate(((0, 250), (250, 400))):
        with open(os.path.join(ws.data, "csv", "part-%d.csv" % part), "w") as handle:
            handle.write(header + "".join(lines[start:end]))
        pq.write_table(arrow_table(rows[start:end]), os.path.join(ws.data, "parquet", "part-%d.parquet" % part),
                       row_group_size=64)
    ws.rows = rows
    return ws


def load(result):
    ddir = result["dataset_dir"]
    with open(os.path.join(ddir, "schema.json")) as a, open(os.path.join(ddir, "stats.json")) as b:
        return json.load(a), json.load(b)


def without_nan(records):
    """Records with NaN (a missing number) as None, sorted by key, so that equal data compare equal."""
    return sorted((([None if math.isnan(v) else v for v in numbers], texts, key) for numbers, texts, key in records),
                  key=lambda record: record[2])


def test_a_parquet_folder_preps_to_the_schema_stats_and_records_of_the_same_csv(both):
    """Numbers, texts, booleans, nulls and NaNs of a folder of Parquet files give the types, missing
    counts, vocabularies, statistics, split and records of the same table as CSV (nulls and NaNs
    are missing values, like empty and NA cells)."""
    from_csv = prep.run(both.config("prep", data=dict(KEYED, path="csv")))
    from_parquet = prep.run(both.config("prep", data=dict(KEYED, path="parquet", format="parquet")))
    csv_schema, csv_stats = load(from_csv)
    schema, stats = load(from_parquet)
    assert schema["format"] == "parquet" and from_parquet["fingerprint"] != from_csv["fingerprint"]
    for field in ("features", "counts", "class_names", "ignored", "dropped_rows"):
        assert schema[field] == csv_schema[field], field
    assert stats == csv_stats
    by = {f["name"]: f for f in schema["features"]}
    assert {n: f["type"] for n, f in by.items()} == {
        "tenure": "float", "monthly": "float", "plan": "categorical", "autopay": "boolean", "zip": "float"}
    assert by["tenure"]["missing"]["train"] + by["tenure"]["missing"]["eval"] == sum(
        1 for r in both.rows if r["tenure"] == "")
    assert by["monthly"]["missing"]["train"] + by["monthly"]["missing"]["eval"] == sum(
        1 for r in both.rows if r["monthly"] == "NA")
    for split in ("train", "eval"):
        assert without_nan(read_records(from_parquet, schema, split)) == without_nan(
            read_records(from_csv, csv_schema, split))


def test_a_text_column_stays_categorical_whatever_its_texts_look_like(both):
    """A Parquet string column of digits (zip codes stored as texts) is categorical, its type
    "inferred" from the Parquet type, where the same digits in a CSV file read as numbers."""
    pq.write_table(arrow_table(both.rows, zip_type=pa.string()), os.path.join(both.data, "zips.parquet"))
    schema, _ = load(prep.run(both.config("prep", data=dict(KEYED, path="zips.parquet", format="parquet"))))
    zips = {f["name"]: f for f in schema["features"]}["zip"]
    assert zips["type"] == "categorical" and zips["source"] == "inferred"
    assert sorted(zips["vocabulary"]) == sorted({r["zip"] for r in both.rows})


def test_the_reader_holds_a_row_group_and_a_batch_never_the_file(tmp_path):
    """A 1,000,000-row file of 100 row groups (32 MB of numbers, decoded) is read in batches of at
    most ``batch_rows`` rows, in order, numbered from row 1; while the batches pass, Arrow's memory
    never holds more than a few row groups' worth (a twentieth of the file)."""
    import numpy as np

    path = str(tmp_path / "big.parquet")
    rows = 1000000
    rng = np.random.RandomState(0)
    table = pa.table({"f%d" % i: pa.array(rng.rand(rows)) for i in range(3)})
    table = table.append_column("label", pa.array(np.arange(rows) % 2))
    pq.write_table(table, path, row_group_size=rows // 100)
    del table
    assert pq.ParquetFile(path).metadata.num_row_groups == 100
    layout = {"read": ["label", "f0", "f1", "f2"], "rows": {"big.parquet": rows}}
    decoded = rows * 4 * 8
    before = pa.total_allocated_bytes()
    peak, seen, first_rows = 0, 0, []
    for kind, rel, first, batch in sources.parquet_batches([("big.parquet", path)], layout, batch_rows=5000):
        assert (kind, rel) == ("arrow", "big.parquet") and batch.num_rows <= 5000
        assert batch.schema.names == layout["read"]
        first_rows.append(first)
        seen += batch.num_rows
        peak = max(peak, pa.total_allocated_bytes() - before)
        del batch
    assert seen == rows and first_rows == list(range(1, rows + 1, 5000))
    assert sources.parquet_batch_count(layout, batch_rows=5000) == len(first_rows)
    assert 0 < peak < decoded / 20, (peak, decoded)


def test_batches_become_cell_texts_with_file_row_numbers(tmp_path):
    """The cells a worker parses: numbers in their exact shortest form, booleans true/false, nulls
    and NaN empty, texts as they are; rows numbered from 1 within each file."""
    batch = pa.RecordBatch.from_arrays(
        [pa.array([1, None, 3]), pa.array([0.1, float("nan"), None]), pa.array([True, False, None]),
         pa.array(["a b", None, ""]), pa.array(["x", "y", "x"]).dictionary_encode()],
        ["i", "f", "b", "s", "d"])
    assert sources.arrow_rows(batch, 41) == [
        (41, ["1", "0.1", "true", "a b", "x"]), (42, ["", "", "false", "", "y"]), (43, ["3", "", "", "", "x"])]


@pytest.mark.parametrize("na_values", [["NA", "NaN"], ["NA", "-1"]], ids=["texts", "a-number"])
def test_a_batch_parses_to_the_rows_of_its_cell_texts_for_every_column_type(tmp_path, na_values):
    """The batch parser reads number and boolean columns straight into floats; whatever their Parquet
    types (integers, large ones too, float32 and float64 with nulls and NaNs, booleans with nulls,
    an all-null column, padded texts, dictionary texts) and data.na_values (texts, or the text of a
    number, which makes that number missing), the parsed rows (values, categories, labels, the keys
    made of the row's texts, row numbers) are those of the batch's cell texts read row by row."""
    import numpy as np

    rows = 300
    rng = np.random.RandomState(3)

    def nulls(values):
        return pa.array(values, mask=rng.rand(rows) < 0.1)
    halves = rng.normal(0, 1e3, rows)
    halves[::7] = np.nan
    table = pa.table({
        "label": pa.array(rng.randint(0, 3, rows)),
        "small": nulls(rng.randint(-3, 3, rows)),
        "large": nulls(rng.randint(-2 ** 62, 2 ** 62, rows, dtype=np.int64)),
        "single": nulls(rng.normal(0, 1, rows).astype(np.float32)),
        "double": nulls(halves),
        "flag": nulls(rng.rand(rows) < 0.5),
        "nothing": pa.nulls(rows),
        "padded": nulls(np.array([" a ", "b", "NA", "", "c\t"])[rng.randint(0, 5, rows)]),
        "coded": pa.array(["x", "y", None, "z"] * (rows // 4)).dictionary_encode(),
    })
    ws = Workspace(tmp_path)
    pq.write_table(table, os.path.join(ws.data, "types.parquet"))
    data = config_mod.resolve(ws.config("prep", data={"path": "types.parquet", "format": "parquet",
                                                      "na_values": na_values}))["data"]
    files = [("types.parquet", os.path.join(ws.data, "types.parquet"))]
    layout = sources.parquet_layout({"data": data}, files)
    small = layout["numeric"].index(layout["feature_names"].index("small"))
    minus_ones = 0
    for batch in sources.parquet_batches(files, layout, batch_rows=128):
        parsed = sources.parse_batch(batch, layout)
        # the row-by-row reader takes the batch only when a number's text is a missing value
        assert (sources._arrow_fast(batch[1], batch[2], batch[3], layout) is None) == ("-1" in na_values)
        by_row = sources._exact(batch[1], sources.arrow_rows(batch[3], batch[2]), layout, batch[3].num_rows)
        assert np.array_equal(parsed.values, by_row.values, equal_nan=True)
        assert (parsed.texts, parsed.labels, parsed.keys, parsed.lines, parsed.physical_lines, parsed.dropped) == (
            by_row.texts, by_row.labels, by_row.keys, by_row.lines, by_row.physical_lines, by_row.dropped)
        minus_ones += int((parsed.values[:, small] == -1).sum())
    assert (minus_ones > 0) == ("-1" not in na_values)


def churn_parquet(ws, name="churn.parquet", rows=None, **columns):
    """Write the churn table (or ``rows`` of it) as ``data/<name>``, with ``columns`` added or replaced."""
    table = arrow_table(rows if rows is not None else write_mixed_csv(os.path.join(ws.base, "churn.csv")))
    for column, values in columns.items():
        if column in table.column_names:
            table = table.set_column(table.column_names.index(column), column, values)
        else:
            table = table.append_column(column, values)
    os.makedirs(os.path.dirname(os.path.join(ws.data, name)), exist_ok=True)
    pq.write_table(table, os.path.join(ws.data, name))
    return table


def prep_parquet(ws, **data):
    return prep.run(ws.config("prep", data=dict(KEYED, format="parquet", **data)))


def test_a_list_column_is_refused_naming_the_file_column_and_the_fix_and_ignore_reads_without_it(tmp_path):
    """A list column cannot be a feature: the error names the file, the column, its type and the
    fix (data.columns: ignore); ignored, the column is never read and prep succeeds."""
    ws = Workspace(tmp_path)
    churn_parquet(ws, tags=pa.array([["a", "b"]] * 400))
    with pytest.raises(BadInput) as info:
        prep_parquet(ws, path="churn.parquet")
    assert str(info.value).startswith("churn.parquet column 'tags': its Parquet type list<element: string> cannot "
                                      "be a feature")
    assert "Fix: set data.columns to {'tags': \"ignore\"}" in str(info.value)
    schema, _ = load(prep_parquet(ws, path="churn.parquet", columns={"tags": "ignore"}))
    assert schema["ignored"] == ["tags"] and "tags" not in {f["name"] for f in schema["features"]}


def test_a_missing_label_column_is_refused_with_the_columns_and_a_did_you_mean(tmp_path):
    ws = Workspace(tmp_path)
    churn_parquet(ws)
    with pytest.raises(BadInput) as info:
        prep_parquet(ws, path="churn.parquet", label="churned")
    assert str(info.value).startswith("churn.parquet: column 'churned' (data.label) is not in the header")
    assert "Fix: set data.label to a column of the header (close: 'churn')" in str(info.value)


def test_files_of_a_folder_with_other_columns_are_refused_naming_both_files_and_the_column(tmp_path):
    ws = Workspace(tmp_path)
    rows = write_mixed_csv(os.path.join(ws.base, "churn.csv"))
    churn_parquet(ws, "days/a.parquet", rows=rows[:200])
    churn_parquet(ws, "days/b.parquet", rows=rows[200:], tenure=pa.array([r["tenure"] for r in rows[200:]]))
    with pytest.raises(BadInput) as info:
        prep_parquet(ws, path="days")
    assert str(info.value).startswith("b.parquet: its columns differ from those of a.parquet (column 'tenure' is "
                                      "string here and double there)")
    assert "Fix: write the files with one schema" in str(info.value)


def test_a_null_label_names_file_row_and_column_unless_rows_without_labels_are_dropped(tmp_path):
    """Row numbers count from 1 in each file; data.drop_missing_labels drops and counts the row."""
    ws = Workspace(tmp_path)
    rows = write_mixed_csv(os.path.join(ws.base, "churn.csv"))
    churn_parquet(ws, "days/a.parquet", rows=rows[:200])
    labels = [int(r["churn"]) for r in rows[200:]]
    labels[6] = None
    churn_parquet(ws, "days/b.parquet", rows=rows[200:], churn=pa.array(labels, pa.int64()))
    with pytest.raises(BadInput) as info:
        prep_parquet(ws, path="days")
    assert str(info.value) == ("b.parquet row 7 column 'churn': empty label. Fix: correct the row, or set "
                               "data.drop_missing_labels to drop (and count) the rows without a label")
    schema, _ = load(prep_parquet(ws, path="days", drop_missing_labels=True))
    assert schema["dropped_rows"] == {"count": 1, "first_lines": [7]}
    assert schema["counts"]["train"] + schema["counts"]["eval"] == 399


def test_a_bad_cell_names_file_row_and_column_with_the_fix(tmp_path):
    """An infinite number, and a text where data.columns declares booleans, stop prep at their row."""
    ws = Workspace(tmp_path)
    rows = write_mixed_csv(os.path.join(ws.base, "churn.csv"))
    monthly = [float(r["monthly"]) if r["monthly"] != "NA" else None for r in rows]
    monthly[2] = float("inf")
    churn_parquet(ws, rows=rows, monthly=pa.array(monthly))
    with pytest.raises(BadInput, match=r"^churn\.parquet row 3 column 'monthly': 'inf' is not a finite number\. "
                                       r"Fix: correct the cell"):
        prep_parquet(ws, path="churn.parquet")
    churn_parquet(ws, rows=rows)
    first = next(i for i, r in enumerate(rows) if r["plan"]) + 1
    with pytest.raises(BadInput) as info:
        prep_parquet(ws, path="churn.parquet", columns={"plan": "boolean"})
    expected = "churn.parquet row %d column 'plan': %r is not a boolean" % (first, rows[first - 1]["plan"])
    assert str(info.value).startswith(expected)
    assert "set data.columns to {'plan': \"categorical\"}" in str(info.value)


def test_a_file_that_is_not_parquet_is_refused_naming_it(tmp_path):
    ws = Workspace(tmp_path)
    os.makedirs(os.path.join(ws.data, "days"))
    with open(os.path.join(ws.data, "days", "a.parquet"), "w") as handle:
        handle.write("churn,plan\n1,basic\n")
    with pytest.raises(BadInput, match=r"^a\.parquet is not a readable Parquet file \(.*\)\. Fix: write it with a "
                                       r"Parquet writer"):
        prep_parquet(ws, path="days")


def test_a_folder_without_parquet_files_is_refused(tmp_path):
    ws = Workspace(tmp_path)
    write_mixed_csv(os.path.join(ws.data, "days", "a.csv"))
    with pytest.raises(BadInput, match=r"is a folder without any \*\.parquet file"):
        prep_parquet(ws, path="days")


def test_the_fingerprint_is_stable_across_runs_and_changes_with_a_file(both):
    """A second prep of the same files is a cache hit with the same fingerprint; rewriting one file
    with one cell changed gives another fingerprint and a fresh data set."""
    data = dict(KEYED, path="parquet", format="parquet")
    first = prep.run(both.config("prep", data=data))
    again = prep.run(both.config("prep", data=data, run_id="manual__2026-11-30T18:00:00+00:00"))
    assert again["cache_hit"] and again["fingerprint"] == first["fingerprint"]
    rows = [dict(r) for r in both.rows[250:]]
    rows[0]["plan"] = "premium" if rows[0]["plan"] != "premium" else "basic"
    pq.write_table(arrow_table(rows), os.path.join(both.data, "parquet", "part-1.parquet"))
    changed = prep.run(both.config("prep", data=data, run_id="manual__2026-12-01T18:00:00+00:00"))
    assert not changed["cache_hit"] and changed["fingerprint"] != first["fingerprint"]


def test_the_settings_of_a_parquet_table_enter_its_fingerprint_as_csv_ones_do(both):
    """data.columns and the other table settings change a Parquet data set's fingerprint."""
    plain = config_mod.resolve(both.config("prep", data=dict(KEYED, path="parquet", format="parquet")))["data"]
    typed = dict(plain, columns={"zip": "categorical"})
    assert prep.prep_settings(typed)["columns"] == {"zip": "categorical"}
    assert "columns" not in prep.prep_settings(plain)


def test_a_date_window_reads_the_parquet_files_of_its_partitions(tmp_path):
    """data.window_days over ``dt=YYYY-MM-DD/`` folders reads the window's ``*.parquet`` files only
    (a CSV file beside them is not an input)."""
    ws = Workspace(tmp_path)
    rows = write_mixed_csv(os.path.join(ws.base, "churn.csv"))
    for day, (start, end) in zip((28, 29, 30), ((0, 100), (100, 250), (250, 400))):
        churn_parquet(ws, "events/dt=2026-11-%02d/part-0.parquet" % day, rows=rows[start:end])
        write_mixed_csv(os.path.join(ws.data, "events", "dt=2026-11-%02d" % day, "other.csv"), rows=20)
    config = ws.config("prep", data=dict(KEYED, path="events", format="parquet", window_days=2))
    config["run"][contract.WINDOW_END_KEY] = "2026-12-01T00:00:00+00:00"
    assert [rel for rel, _ in sources.input_files(config)] == ["dt=2026-11-29/part-0.parquet",
                                                                "dt=2026-11-30/part-0.parquet"]
    result = prep.run(config)
    assert result["window"]["partitions"] == ["dt=2026-11-29", "dt=2026-11-30"]
    assert sum(result["examples"].values()) == 300
    config["run"][contract.WINDOW_END_KEY] = "2026-11-29T00:00:00+00:00"
    with pytest.raises(BadInput, match=r"lacks the partition\(s\) 2026-11-27 \(no dt=<date>/ folder with a "
                                       r"\*\.parquet file\)"):
        prep.run(config)


def test_text_labels_name_the_classes_and_an_all_null_column_is_a_numeric_one_with_every_cell_missing(tmp_path):
    """Labels stored as texts are class names (sorted); a column Parquet stores as nulls only is a
    numeric feature whose every cell is missing."""
    ws = Workspace(tmp_path)
    rows = write_mixed_csv(os.path.join(ws.base, "churn.csv"))
    churn_parquet(ws, rows=rows, churn=pa.array(["stays" if r["churn"] == "0" else "leaves" for r in rows]),
                  empty=pa.nulls(len(rows)))
    schema, stats = load(prep_parquet(ws, path="churn.parquet"))
    assert schema["class_names"] == ["leaves", "stays"]
    empty = {f["name"]: f for f in schema["features"]}["empty"]
    assert (empty["type"], empty["missing"]) == ("float", {"train": schema["counts"]["train"],
                                                           "eval": schema["counts"]["eval"]})
    assert stats["features"]["empty"]["count"] == 0
