"""Sharded prep (``data.shards``): slices of the input files, parts, and the merge.

The merged data set must be the one a single prep task writes for the same input: the same
fingerprint, TFRecord files (byte for byte), ``schema.json`` and ``stats.json``.
"""

import json
import os

import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow  # noqa: E402,F401

from conftest import Workspace, write_blobs_csv, write_mixed_csv  # noqa: E402
from trainer import contract, prep, prep_merge, prep_shard, shards  # noqa: E402
from trainer.errors import BadInput  # noqa: E402

SHARDS = 4


def split_csv(source, folder, pieces):
    """Write ``source``'s rows as ``pieces`` CSV files (uneven sizes) in ``folder``, header in each."""
    with open(source) as handle:
        header, *rows = handle.read().splitlines()
    os.makedirs(folder, exist_ok=True)
    cuts = [0] + sorted({len(rows) * (i * i + i) // (pieces * pieces + pieces) for i in range(1, pieces)}) \
        + [len(rows)]
    for i, (start, end) in enumerate(zip(cuts, cuts[1:])):
        with open(os.path.join(folder, "part-%02d.csv" % i), "w") as out:
            out.write("\n".join([header] + rows[start:end]) + "\n")
    return sorted(os.listdir(folder))


@pytest.fixture
def small_batches(monkeypatch):
    """Several batches per file on two forked workers: the moments are merged across batches."""
    monkeypatch.setattr(prep, "READ_BYTES", 1024)
    monkeypatch.setattr(prep, "BATCH_BYTES", 2048)
    monkeypatch.setattr(prep, "usable_cpus", lambda: 2)


@pytest.fixture
def parted(tmp_path):
    """A workspace whose data/parts/ holds a 600-row blobs CSV cut into 5 files."""
    ws = Workspace(tmp_path / "sharded")
    source = str(tmp_path / "all.csv")
    write_blobs_csv(source, rows=600, classes=3, features=5)
    split_csv(source, os.path.join(ws.data, "parts"), 5)
    return ws


def shard_config(ws, stage, index=None, run_id=None, count=SHARDS, try_number=1):
    config = ws.config(stage, run_id=run_id, try_number=try_number,
                       data={"path": "parts", "shards": count, "shard_size": 64})
    if index is not None:
        config[contract.SHARD_INDEX_KEY] = index
    return config


def run_sharded(ws, run_id=None, count=SHARDS):
    results = [prep_shard.run(shard_config(ws, "prep_shard", k, run_id, count)) for k in range(count)]
    return results, prep_merge.run(shard_config(ws, "prep_merge", run_id=run_id, count=count))


def dataset_files(dataset_dir):
    """Every file of a data set but fingerprint.json (it names the run) and _SUCCESS (a time): bytes."""
    return {name: open(os.path.join(dataset_dir, name), "rb").read() for name in sorted(os.listdir(dataset_dir))
            if name not in ("fingerprint.json", "_SUCCESS")}


@pytest.mark.parametrize("sizes", [[10] * 7, [1, 500, 3, 3, 90, 0, 41], [0, 0, 0], [7], [2 ** 40, 1, 1]])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 9])
def test_slices_are_a_partition_into_contiguous_runs(sizes, count):
    slices = [shards.slice_positions(sizes, k, count) for k in range(count)]
    assert sorted(p for s in slices for p in s) == list(range(len(sizes))), "every file exactly once"
    assert [p for s in slices for p in s] == list(range(len(sizes))), "in shard order = in file order"
    for owned in slices:
        assert owned == list(range(owned[0], owned[-1] + 1)) if owned else True
    assert slices == [shards.slice_positions(sizes, k, count) for k in range(count)], "deterministic"


def test_slices_balance_bytes():
    assert [shards.slice_positions([10] * 8, k, 4) for k in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [shards.slice_positions([90, 5, 5], k, 2) for k in range(2)] == [[0], [1, 2]]


def test_merged_shards_equal_an_unsharded_prep(parted, tmp_path, small_batches):
    single = Workspace(tmp_path / "single")
    os.rmdir(single.data)
    os.symlink(parted.data, single.data)
    expected = prep.run(single.config("prep", data={"path": "parts", "shard_size": 64}))

    results, merged = run_sharded(parted)
    assert merged["fingerprint"] == expected["fingerprint"]
    assert merged["cache_hit"] is False and merged["examples"] == expected["examples"]
    assert merged["shards"] == SHARDS
    files = sorted(os.listdir(os.path.join(parted.data, "parts")))
    assert [f for r in results for f in r["files"]] == files, "the slices, in shard order, are the sorted files"
    assert len([r for r in results if r["files"]]) >= 3
    got, want = dataset_files(merged["dataset_dir"]), dataset_files(expected["dataset_dir"])
    assert sorted(got) == sorted(want) and len([n for n in got if n.endswith(".tfrecord")]) > 4
    for name in want:
        assert got[name] == want[name], "%s differs from the single prep's" % name
    provenance = json.load(open(os.path.join(merged["dataset_dir"], "fingerprint.json")))
    assert provenance["inputs"] == json.load(open(os.path.join(expected["dataset_dir"], "fingerprint.json")))["inputs"]
    assert [p["index"] for p in provenance["parts"]] == list(range(SHARDS))
    assert parted.read("dataset.json")["fingerprint"] == merged["fingerprint"]
    assert not os.path.exists(shards.parts_root(shard_config(parted, "prep_merge"))), "parts removed after the merge"


def test_shards_and_merge_run_without_importing_tensorflow(parted, cli, without_tensorflow):
    for index in range(SHARDS):
        proc = cli("prep_shard", shard_config(parted, "prep_shard", index), env=without_tensorflow)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = cli("prep_merge", shard_config(parted, "prep_merge"), env=without_tensorflow)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(contract.RESULT_PREFIX), proc.stdout[-2000:]
    merged = json.loads(last[len(contract.RESULT_PREFIX):])
    assert merged["cache_hit"] is False and sum(merged["examples"].values()) == 600
    assert os.path.exists(os.path.join(merged["dataset_dir"], "_SUCCESS"))


def test_a_second_run_is_a_cache_hit_and_no_shard_parses(parted):
    _, first = run_sharded(parted)
    results, again = run_sharded(parted, run_id="manual__again")
    assert [r["cache_hit"] for r in results] == [True] * SHARDS
    assert again["cache_hit"] is True and again["fingerprint"] == first["fingerprint"]
    config = shard_config(parted, "prep_merge", run_id="manual__again")
    assert not os.path.exists(shards.parts_root(config)), "a cache hit writes no part"
    assert parted.read("dataset.json", run_id="manual__again")["fingerprint"] == first["fingerprint"]
    # and an unsharded prep of the same input hits the sharded run's data set
    hit = prep.run(parted.config("prep", run_id="manual__third", data={"path": "parts", "shard_size": 64}))
    assert hit["cache_hit"] is True and hit["fingerprint"] == first["fingerprint"]


def owner_of(ws, name, count=SHARDS):
    """The shard whose slice holds ``name`` of ``data/parts``."""
    names = sorted(os.listdir(os.path.join(ws.data, "parts")))
    sizes = [os.path.getsize(os.path.join(ws.data, "parts", n)) for n in names]
    return next(k for k in range(count) if names.index(name) in shards.slice_positions(sizes, k, count))


def test_a_retried_shard_redoes_only_its_own_slice(parted):
    fp = [prep_shard.run(shard_config(parted, "prep_shard", k)) for k in range(SHARDS)][0]["fingerprint"]
    root = shards.parts_dir(shard_config(parted, "prep_merge"), fp)
    retried = owner_of(parted, "part-03.csv")
    committed = {name: (os.stat(os.path.join(root, name)).st_ino, open(os.path.join(root, name, "part.json")).read())
                 for name in os.listdir(root)}
    assert len(committed) == SHARDS
    # the retried shard's first try was killed before its commit: its part is a leftover temp dir;
    # another shard's temp dir (a shard still running, say) must survive the retry
    killed = shards.temp_prefix(retried) + "killed"
    other = shards.temp_prefix((retried + 1) % SHARDS) + "running"
    os.rename(os.path.join(root, shards.part_name(retried, SHARDS)), os.path.join(root, killed))
    os.mkdir(os.path.join(root, other))
    result = prep_shard.run(shard_config(parted, "prep_shard", retried, try_number=2))
    assert result["reused_part"] is False and result["files"] == ["part-03.csv"], "only its own slice"
    names = sorted(os.listdir(root))
    assert killed not in names and other in names
    for name, (inode, text) in committed.items():
        if name != shards.part_name(retried, SHARDS):
            assert (os.stat(os.path.join(root, name)).st_ino, open(os.path.join(root, name, "part.json")).read()) \
                == (inode, text), "%s was touched by another shard's retry" % name
    again = prep_shard.run(shard_config(parted, "prep_shard", 0, try_number=2))
    assert again["reused_part"] is True, "a committed part is not redone"
    merged = prep_merge.run(shard_config(parted, "prep_merge"))
    parts = json.load(open(os.path.join(merged["dataset_dir"], "fingerprint.json")))["parts"]
    assert [p["try_number"] for p in parts] == [2 if k == retried else 1 for k in range(SHARDS)]


def test_the_merge_waits_for_every_part(parted):
    for k in (0, 1, 3):
        prep_shard.run(shard_config(parted, "prep_shard", k))
    with pytest.raises(BadInput, match="shard 2 of 4 has no committed output.*does not mount this work volume.*Fix:"):
        prep_merge.run(shard_config(parted, "prep_merge"))
    assert parted.visible("work", "datasets") == []


def test_bad_rows_are_named_by_file_and_line_in_a_shard(parted):
    with open(os.path.join(parted.data, "parts", "part-04.csv"), "a") as handle:
        handle.write("1,2,oops,4,5,1\n")
    with pytest.raises(BadInput, match=r"part-04.csv line 202 column 'f2'"):
        prep_shard.run(shard_config(parted, "prep_shard", owner_of(parted, "part-04.csv")))


def test_declared_classes_let_shards_take_label_names(tmp_path, small_batches):
    """With ``data.classes`` every shard numbers names alike: the merged data set is the one a single
    prep task writes with the same classes, byte for byte; a name outside them fails its shard."""
    declared = ["gnu", "eel", "dog", "cat"]
    named = Workspace(tmp_path / "named")
    source = str(tmp_path / "named.csv")
    write_blobs_csv(source, rows=600, classes=3, features=5, string_labels=True)
    split_csv(source, os.path.join(named.data, "parts"), 5)
    single = Workspace(tmp_path / "single")
    os.rmdir(single.data)
    os.symlink(named.data, single.data)
    expected = prep.run(single.config("prep", data={"path": "parts", "shard_size": 64, "classes": declared}))

    def config(stage, index=None):
        out = shard_config(named, stage, index)
        out["data"]["classes"] = declared
        return out
    for index in range(SHARDS):
        prep_shard.run(config("prep_shard", index))
    merged = prep_merge.run(config("prep_merge"))
    assert merged["fingerprint"] == expected["fingerprint"] and merged["num_classes"] == 4
    got, want = dataset_files(merged["dataset_dir"]), dataset_files(expected["dataset_dir"])
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], "%s differs from the single prep's" % name
    assert json.loads(got["schema.json"])["class_names"] == declared

    with open(os.path.join(named.data, "parts", "part-04.csv"), "a") as handle:
        handle.write("1,2,3,4,5,yak\n")
    with pytest.raises(BadInput, match=r"part-04.csv line \d+ column 'label': label 'yak' is not one of the 4 classes"):
        prep_shard.run(config("prep_shard", owner_of(named, "part-04.csv")))


def test_label_names_and_bad_shard_indexes_are_refused(parted):
    write_blobs_csv(os.path.join(parted.data, "named", "a.csv"), rows=60, string_labels=True)
    config = shard_config(parted, "prep_shard", 0)
    config["data"]["path"] = "named"
    with pytest.raises(BadInput, match="data.shards.*not class ids.*Fix: list the class names in data.classes"):
        prep_shard.run(config)
    for index in (None, 4, -1):
        with pytest.raises(BadInput, match="shard_index must be a shard index in 0..3"):
            prep_shard.run(shard_config(parted, "prep_shard", index))


def mixed_parts(ws, tmp_path, unlabelled=(77, 433)):
    """data/mixed/: :func:`conftest.write_mixed_csv`'s 600 rows (a text id, a text plan with empty
    cells, NA and empty numbers, a yes/no column) with the rows at ``unlabelled`` made label-less,
    cut into 5 CSV files of uneven sizes."""
    source = str(tmp_path / "mixed.csv")
    write_mixed_csv(source, rows=600)
    with open(source) as handle:
        lines = handle.read().splitlines()
    for at in unlabelled:
        lines[at] = lines[at].rsplit(",", 1)[0] + ","
    with open(source, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return split_csv(source, os.path.join(ws.data, "mixed"), 5)


def single_and_sharded(tmp_path, ws, data):
    """``(one prep task's result, the merged result)`` for the same input files and ``data``."""
    single = Workspace(tmp_path / "single")
    os.rmdir(single.data)
    os.symlink(ws.data, single.data)
    expected = prep.run(single.config("prep", data=dict(data, shard_size=64)))
    for index in range(SHARDS):
        config = ws.config("prep_shard", data=dict(data, shards=SHARDS, shard_size=64))
        config[contract.SHARD_INDEX_KEY] = index
        prep_shard.run(config)
    merged = prep_merge.run(ws.config("prep_merge", data=dict(data, shards=SHARDS, shard_size=64)))
    return expected, merged


def assert_same_dataset(expected, merged):
    assert merged["fingerprint"] == expected["fingerprint"] and merged["examples"] == expected["examples"]
    got, want = dataset_files(merged["dataset_dir"]), dataset_files(expected["dataset_dir"])
    assert sorted(got) == sorted(want)
    for name in want:
        assert got[name] == want[name], "%s differs from the single prep's" % name
    return json.loads(want["schema.json"]), json.loads(want["stats.json"])


def test_sharded_prep_of_a_mixed_table_equals_one_prep_task(tmp_path, small_batches):
    """Text, boolean and numeric columns with empty and NA cells, rows dropped for a missing label, a
    text column past data.hash_threshold in some parts (which drop its counts) but not in another, and a
    shard without files: the merged data set is the one a single prep task writes, byte for byte
    (records, schema.json with its types, vocabularies, missing counts and dropped rows, stats.json with
    its histograms and frequencies)."""
    ws = Workspace(tmp_path / "sharded")
    mixed_parts(ws, tmp_path)
    data = {"path": "mixed", "label": "churn", "drop_missing_labels": True, "hash_threshold": 150}
    schema, stats = assert_same_dataset(*single_and_sharded(tmp_path, ws, data))
    by = {f["name"]: f for f in schema["features"]}
    assert {n: f["type"] for n, f in by.items()} == {
        "customer_id": "categorical", "tenure": "float", "monthly": "float", "plan": "categorical",
        "autopay": "boolean", "zip": "float"}
    assert schema["dropped_rows"]["count"] == 2
    assert by["customer_id"]["encoding"] == "hash" and by["plan"]["encoding"] == "vocabulary"
    assert all(by[n]["missing"]["train"] > 0 for n in ("tenure", "monthly", "plan"))
    assert stats["features"]["customer_id"]["frequencies"]["hashed"] is True
    assert stats["features"]["plan"]["frequencies"]["values"] == by["plan"]["vocabulary"]
    assert stats["features"]["tenure"]["histogram"]["counts"]
    parts = json.load(open(os.path.join(ws.work, "datasets", schema["fingerprint"], "fingerprint.json")))["parts"]
    assert sorted(len(p["files"]) for p in parts) == [0, 1, 1, 3], "one shard has no file to read"


def test_sharded_prep_of_a_parquet_folder_equals_one_prep_task(tmp_path, monkeypatch):
    """Slices of a folder of Parquet files (typed columns, nulls, a null label dropped) merge into the
    data set one prep task writes from the folder, byte for byte."""
    from pyarrow import csv as arrow_csv
    from pyarrow import parquet

    monkeypatch.setattr(prep, "usable_cpus", lambda: 2)
    ws = Workspace(tmp_path / "sharded")
    names = mixed_parts(ws, tmp_path)
    os.makedirs(os.path.join(ws.data, "pq"))
    for name in names:
        table = arrow_csv.read_csv(os.path.join(ws.data, "mixed", name),
                                   convert_options=arrow_csv.ConvertOptions(strings_can_be_null=True))
        parquet.write_table(table, os.path.join(ws.data, "pq", name.replace(".csv", ".parquet")), row_group_size=30)
    data = {"path": "pq", "format": "parquet", "label": "churn", "drop_missing_labels": True, "hash_threshold": 150}
    schema, stats = assert_same_dataset(*single_and_sharded(tmp_path, ws, data))
    assert schema["format"] == "parquet" and schema["dropped_rows"]["count"] == 2
    assert {f["name"]: f["type"] for f in schema["features"]}["plan"] == "categorical"
    assert stats["features"]["plan"]["frequencies"]["other"] == 0


def test_shards_that_infer_different_types_are_refused_naming_the_column_and_the_fix(tmp_path):
    """Each shard infers a column's type from its own slice: when one reads numbers and another texts,
    the merge names the column, which shards and files read it as which type, and the fix; declared in
    data.columns, the column is read alike everywhere."""
    ws = Workspace(tmp_path / "sharded")
    os.makedirs(os.path.join(ws.data, "parts"))
    for name, code in (("a.csv", lambda i: str(i + 900)), ("b.csv", lambda i: "c%d" % i)):  # equal sizes
        with open(os.path.join(ws.data, "parts", name), "w") as handle:
            handle.write("x,code,label\n" + "".join("%d,%s,%d\n" % (i, code(i), i % 2) for i in range(100, 200)))
    data = {"path": "parts", "shards": 2}
    for index in range(2):
        config = ws.config("prep_shard", data=data)
        config[contract.SHARD_INDEX_KEY] = index
        prep_shard.run(config)
    with pytest.raises(BadInput) as info:
        prep_merge.run(ws.config("prep_merge", data=data))
    message = str(info.value)
    assert "column 'code'" in message
    assert "categorical by shard(s) 1 (b.csv); float by shard(s) 0 (a.csv)" in message
    assert "Fix: declare its type in data.columns" in message and "{'code': \"categorical\"}" in message
    declared = dict(data, columns={"code": "categorical"})
    for index in range(2):
        config = ws.config("prep_shard", data=declared)
        config[contract.SHARD_INDEX_KEY] = index
        prep_shard.run(config)
    merged = prep_merge.run(ws.config("prep_merge", data=declared))
    schema = json.load(open(os.path.join(merged["dataset_dir"], "schema.json")))
    assert [f["type"] for f in schema["features"]] == ["float", "categorical"]
