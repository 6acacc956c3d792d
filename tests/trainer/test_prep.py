"""The prep stage on small real CSV and image data: outputs, validation, caching, splitting."""

import json
import os
import time

import numpy as np
import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow as tf  # noqa: E402

from conftest import write_blobs_csv, write_image_folder  # noqa: E402
import google_crc32c  # noqa: E402

from trainer import common, prep, records, sources  # noqa: E402
from trainer import config as config_mod  # noqa: E402
from trainer.errors import BadInput  # noqa: E402


def read_records(dataset_dir, schema, split):
    """Parse every record of a split back with tf.data: list of (key, values, label)."""
    files = [os.path.join(dataset_dir, n) for n in schema["shards"][split]]
    spec = {"label": tf.io.FixedLenFeature([], tf.int64),
            "key": tf.io.FixedLenFeature([], tf.string)}
    if schema["format"] == "csv":
        spec["features"] = tf.io.FixedLenFeature([len(schema["features"])], tf.float32)
    else:
        spec["image"] = tf.io.FixedLenFeature([], tf.string)
    out = []
    for record in tf.data.TFRecordDataset(files):
        parsed = tf.io.parse_single_example(record, spec)
        value = parsed["features"].numpy() if "features" in parsed else np.frombuffer(
            parsed["image"].numpy(), np.uint8)
        out.append((parsed["key"].numpy().decode(), value, int(parsed["label"])))
    return out


def test_csv_prep_writes_a_complete_dataset(ws):
    result = prep.run(ws.config("prep", data={"shard_size": 64}))
    assert result["cache_hit"] is False and result["num_classes"] == 3
    assert result["examples"]["train"] + result["examples"]["eval"] == 300
    assert 30 <= result["examples"]["eval"] <= 90
    ddir = result["dataset_dir"]
    assert ddir == os.path.join(ws.work, "datasets", result["fingerprint"])
    assert ws.visible("work", "datasets") == [result["fingerprint"]]
    assert [n for n in os.listdir(os.path.join(ws.work, "datasets")) if n.startswith(".")] == []
    schema = json.load(open(os.path.join(ddir, "schema.json")))
    stats = json.load(open(os.path.join(ddir, "stats.json")))
    assert schema["class_names"] == ["0", "1", "2"]
    assert [f["name"] for f in schema["features"]] == ["f0", "f1", "f2", "f3"]
    n_train = result["examples"]["train"]
    assert len(schema["shards"]["train"]) == -(-n_train // 64)
    assert schema["shards"]["train"][0].startswith("train-00000-of-")
    for name in ("fingerprint.json", "_SUCCESS"):
        assert os.path.exists(os.path.join(ddir, name))
    train = read_records(ddir, schema, "train")
    evals = read_records(ddir, schema, "eval")
    assert len(train) == n_train and len(evals) == result["examples"]["eval"]
    matrix = np.array([v for _, v, _ in train])
    assert stats["features"]["f2"]["mean"] == pytest.approx(matrix[:, 2].mean(), rel=1e-5)
    assert stats["features"]["f2"]["std"] == pytest.approx(matrix[:, 2].std(), rel=1e-4)
    assert stats["features"]["f0"]["count"] == n_train
    assert sum(stats["class_histogram"]["eval"]) == len(evals)
    assert ws.read("dataset.json")["fingerprint"] == result["fingerprint"]
    assert ws.read("config", "prep.json")["data"]["path"] == "blobs.csv"


def test_tfrecord_files_are_what_tensorflow_writes_and_its_reader_checks_them(tmp_path):
    assert google_crc32c.implementation == "c", "the image must carry google-crc32c's compiled extension"
    batch = [b"", b"x", bytes(range(256)) * 300, records.ExampleEncoder("floats").encode(b"\1" * 16, 3, "k")]
    ours, theirs = str(tmp_path / "ours"), str(tmp_path / "theirs")
    written = records.TFRecordFile(ours)
    written.write(batch[:2])
    written.write(batch[2:])
    written.close()
    with tf.io.TFRecordWriter(theirs) as writer:
        for record in batch:
            writer.write(record)
    with open(ours, "rb") as handle:
        data = bytearray(handle.read())
    with open(theirs, "rb") as handle:
        assert bytes(data) == handle.read()
    assert [record.numpy() for record in tf.data.TFRecordDataset(ours)] == batch
    assert [list(read) for read in records.read_tfrecords(ours, batch=3)] == [batch[:3], batch[3:]]
    # one bit flipped inside the large record's data: TensorFlow's reader refuses the checksum
    data[(16 + 0) + (16 + 1) + 12 + 100] ^= 1
    with open(ours, "wb") as handle:
        handle.write(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        list(tf.data.TFRecordDataset(ours))


def test_reading_back_a_cut_tfrecord_file_names_the_file_and_what_is_cut(tmp_path):
    path = str(tmp_path / "part.tfrecord")
    written = records.TFRecordFile(path)
    written.write([b"first", b"second record"])
    written.close()
    with open(path, "rb") as handle:
        whole = handle.read()
    for cut, what in ((len(whole) - 2, "truncated TFRecord"),  # the last checksum
                      (len(whole) - 10, "truncated TFRecord"),  # inside the last record's data
                      (16 + 5 + 4, "truncated TFRecord header")):  # 4 bytes into the second header
        with open(path, "wb") as handle:
            handle.write(whole[:cut])
        with pytest.raises(BadInput) as caught:
            list(records.read_tfrecords(path))
        assert str(caught.value) == "%s: %s" % (path, what)


def test_string_labels_declared_features_and_key_column(ws):
    path = os.path.join(ws.data, "named", "part.csv")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write("id,count,size,label\n")
        for i in range(60):
            handle.write("%d,%d,%.2f,%s\n" % (i, i % 7, i / 3.0, "yes" if i % 2 else "no"))
    config = ws.config("prep", data={"path": "named", "key": "id",
                                     "features": [{"name": "size"},
                                                  {"name": "count", "type": "int"}]})
    result = prep.run(config)
    schema = json.load(open(os.path.join(result["dataset_dir"], "schema.json")))
    assert schema["class_names"] == ["no", "yes"]
    assert [(f["name"], f["type"], f["source"]) for f in schema["features"]] == [
        ("size", "float", "data.features"), ("count", "int", "data.features")]
    for key, values, label in read_records(result["dataset_dir"], schema, "train"):
        i = int(key)
        assert label == i % 2 and values[1] == i % 7
        assert values[0] == pytest.approx(i / 3.0, abs=1e-2)


def test_declared_classes_number_the_labels_in_their_order_in_one_pass(ws, capsys, monkeypatch):
    """``data.classes``: ids are positions in the list, a listed class the data lacks is kept (with
    no examples), and the labels are never read in a pass of their own, as names otherwise are."""
    write_blobs_csv(os.path.join(ws.data, "named", "a.csv"), rows=90, classes=3, string_labels=True)
    monkeypatch.setattr(prep, "scan_batch", None)  # a label pass would call it
    declared = ["eel", "fox", "cat", "dog"]  # the data has cat, dog and eel
    result = prep.run(ws.config("prep", data={"path": "named", "classes": declared}))
    assert "reading every label first" not in capsys.readouterr().out
    schema = json.load(open(os.path.join(result["dataset_dir"], "schema.json")))
    stats = json.load(open(os.path.join(result["dataset_dir"], "stats.json")))
    assert schema["class_names"] == declared and result["num_classes"] == 4
    assert [a + b for a, b in zip(*stats["class_histogram"].values())] == [30, 0, 30, 30]
    rows = read_records(result["dataset_dir"], schema, "train") + read_records(result["dataset_dir"], schema, "eval")
    assert len(rows) == 90
    for key, _, label in rows:  # the key is the row's text: its last cell is the label as written
        assert declared[label] == key.rsplit(",", 1)[1], key


def test_declared_classes_in_the_data_s_own_order_write_the_same_records(ws):
    """Integer labels declared as their own order (``["0", "1", "2"]``) give the records, split and
    statistics of the undeclared data set, under a fingerprint of their own."""
    plain = prep.run(ws.config("prep"))
    declared = prep.run(ws.config("prep", data={"classes": ["0", "1", "2"]}))
    assert declared["fingerprint"] != plain["fingerprint"] and declared["cache_hit"] is False
    for name in sorted(os.listdir(plain["dataset_dir"])):
        if name.endswith(".tfrecord") or name == "stats.json":
            with open(os.path.join(plain["dataset_dir"], name), "rb") as a, \
                    open(os.path.join(declared["dataset_dir"], name), "rb") as b:
                assert a.read() == b.read(), name


def test_image_folders_follow_declared_classes(ws):
    write_image_folder(os.path.join(ws.data, "imgs"), classes=("bright_left", "bright_top"), per_class=6)
    declared = ["dark", "bright_top", "bright_left"]  # no dark/ folder tonight
    result = prep.run(ws.config("prep", data={"format": "images", "path": "imgs", "image_size": [8, 8],
                                              "classes": declared}))
    schema = json.load(open(os.path.join(result["dataset_dir"], "schema.json")))
    stats = json.load(open(os.path.join(result["dataset_dir"], "stats.json")))
    assert schema["class_names"] == declared
    assert [a + b for a, b in zip(*stats["class_histogram"].values())] == [0, 6, 6]
    for key, _, label in read_records(result["dataset_dir"], schema, "train"):
        assert key.split("/")[0] == declared[label], key
    write_image_folder(os.path.join(ws.data, "imgs"), classes=("dark",), per_class=2)
    with pytest.raises(BadInput) as info:
        prep.run(ws.config("prep", data={"format": "images", "path": "imgs", "classes": ["bright_top", "bright_left"]}))
    assert "sub-folder(s) 'dark' that data.classes does not list" in str(info.value)
    assert "Fix: add them to data.classes" in str(info.value)


def test_image_prep_resizes_and_converts(ws):
    write_image_folder(os.path.join(ws.data, "imgs"), per_class=10)
    config = ws.config("prep", data={"format": "images", "path": "imgs", "image_size": [8, 12],
                                     "channels": 3, "eval_fraction": 0.3})
    result = prep.run(config)
    schema = json.load(open(os.path.join(result["dataset_dir"], "schema.json")))
    stats = json.load(open(os.path.join(result["dataset_dir"], "stats.json")))
    assert schema["class_names"] == ["bright_left", "bright_top"]
    assert schema["image"] == {"height": 8, "width": 12, "channels": 3}
    assert len(stats["channels"]) == 3
    records = read_records(result["dataset_dir"], schema, "train")
    key, pixels, label = records[0]
    assert pixels.size == 8 * 12 * 3 and key.split("/")[0] == schema["class_names"][label]
    image = pixels.reshape(8, 12, 3).astype(float)
    left, right = image[:, :6].mean(), image[:, 6:].mean()
    assert (left > right + 50) == (label == 0)


def write_broken(ws, case):
    """Create one broken input; return the data config patch."""
    csv_path = os.path.join(ws.data, "blobs.csv")
    lines = open(csv_path).read().splitlines()
    patch = {}
    if case == "malformed row":
        lines[4] = '"1.0"x,2,3,4,0'
    elif case == "wrong column count":
        lines[4] = "1.0,2.0,0"
    elif case == "non-numeric":
        lines[4] = "1.0,abc,3.0,4.0,0"
    elif case == "empty":
        lines = lines[:1]
    elif case == "single class":
        lines = [lines[0]] + [",".join(l.split(",")[:-1] + ["1"]) for l in lines[1:]]
    elif case == "corrupt image":
        write_image_folder(os.path.join(ws.data, "imgs"), per_class=4)
        with open(os.path.join(ws.data, "imgs", "bright_top", "broken.png"), "wb") as handle:
            handle.write(b"\x89PNG\r\n\x1a\nnot really a png")
        return {"format": "images", "path": "imgs"}
    elif case == "missing path":
        return {"path": "nowhere/data.csv"}
    elif case == "escaping path":
        return {"path": "../outside.csv"}
    elif case == "missing label column":
        return {"label": "target"}
    elif case == "misspelt label column":
        return {"label": "lable"}
    elif case == "missing feature column":
        return {"features": [{"name": "f9", "type": "float"}]}
    elif case == "duplicate column":
        lines[0] = lines[0].replace("f2", "f1", 1)
    elif case == "undeclared label":
        return {"classes": ["0", "1"]}
    elif case == "misspelt declared label":
        lines[7] = ",".join(lines[7].split(",")[:-1] + ["11"])
        patch = {"classes": ["0", "1", "2"]}
    elif case == "two headers":
        parts = os.path.join(ws.data, "parts")
        os.makedirs(parts)
        other = lines[0].replace("f2", "f2_cm", 1)
        with open(os.path.join(parts, "a.csv"), "w") as handle:
            handle.write("\n".join(lines[:100]) + "\n")
        with open(os.path.join(parts, "b.csv"), "w") as handle:
            handle.write("\n".join([other] + lines[100:]) + "\n")
        return {"path": "parts"}
    with open(csv_path, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return patch


@pytest.mark.parametrize("case, words", [
    ("malformed row", ["blobs.csv line 5", "malformed"]),
    ("wrong column count", ["blobs.csv line 5", "expected 5 columns", "got 3"]),
    ("non-numeric", ["blobs.csv line 5", "'f1'", "'abc' is not a number"]),
    ("corrupt image", ["bright_top/broken.png", "cannot be read", "PNG or JPEG"]),
    ("empty", ["empty", "blobs.csv"]),
    ("single class", ["single class", "'1'"]),
    ("missing path", ["nowhere/data.csv", "does not exist"]),
    ("escaping path", ["'../outside.csv'", "relative to paths.data"]),
    ("missing label column", ["'target'", "(data.label) is not in the header", "'label'",
                              "Fix: set data.label to a column of the header"]),
    ("misspelt label column", ["'lable'", "(close: 'label')"]),
    ("missing feature column", ["'f9'", "(data.features)", "Fix: name only columns of the header"]),
    ("duplicate column", ["blobs.csv line 1", "names 'f1' more than once", "Fix: give each column"]),
    ("undeclared label", ["blobs.csv line 4 column 'label'", "label '2' is not one of the 2 classes of data.classes: "
                          "'0', '1'", "Fix: add it to data.classes (at the end keeps the other classes' ids)"]),
    ("misspelt declared label", ["blobs.csv line 8", "label '11' is not one of the 3 classes", "(close: '1')"]),
    ("two headers", ["b.csv line 1", "differs from the header of a.csv", "column 3 is 'f2_cm' here and 'f2'",
                     "Fix: give the files one header row"]),
])
def test_bad_input_is_rejected_naming_the_place_and_leaves_nothing(ws, case, words):
    patch = write_broken(ws, case)
    with pytest.raises(BadInput) as info:
        prep.run(ws.config("prep", data=patch))
    for word in words:
        assert word in str(info.value), str(info.value)
    datasets = os.path.join(ws.work, "datasets")
    assert not os.path.exists(datasets) or os.listdir(datasets) == []
    assert not os.path.exists(os.path.join(ws.run_dir(), "dataset.json"))


def test_second_prep_is_a_cache_hit(ws, capsys):
    first = prep.run(ws.config("prep"))
    marker = os.path.join(first["dataset_dir"], "_SUCCESS")
    before = os.stat(marker).st_mtime_ns
    second = prep.run(ws.config("prep", run_id="another_run"))
    assert "cache hit" in capsys.readouterr().out
    assert second["cache_hit"] is True
    assert second["fingerprint"] == first["fingerprint"]
    assert second["examples"] == first["examples"]
    assert os.stat(marker).st_mtime_ns == before
    assert ws.visible("work", "datasets") == [first["fingerprint"]]
    assert ws.read("dataset.json", run_id="another_run")["fingerprint"] == first["fingerprint"]


def test_a_cache_hit_marks_the_data_set_as_just_used(ws):
    """A reused data set's mtime moves to now (retention spares what prep reused recently); its
    content, ``_SUCCESS`` included, is left as it was."""
    first = prep.run(ws.config("prep"))
    dataset_dir = first["dataset_dir"]
    marker = os.path.join(dataset_dir, "_SUCCESS")
    with open(marker, "rb") as handle:
        success = handle.read()
    marker_mtime = os.stat(marker).st_mtime_ns
    long_ago = time.time() - 3 * 86400  # far beyond any retention.min_idle_minutes
    os.utime(dataset_dir, (long_ago, long_ago))
    started = time.time()
    second = prep.run(ws.config("prep", run_id="another_run"))
    assert second["cache_hit"] is True and second["dataset_dir"] == dataset_dir
    # 2 s of slack for file systems with coarse timestamps
    assert started - 2 <= os.stat(dataset_dir).st_mtime <= time.time() + 2
    with open(marker, "rb") as handle:
        assert handle.read() == success
    assert os.stat(marker).st_mtime_ns == marker_mtime


def test_fingerprint_covers_content_and_prep_settings(ws):
    base = prep.run(ws.config("prep"))["fingerprint"]
    assert prep.run(ws.config("prep", data={"split_seed": 1}))["fingerprint"] != base
    assert prep.run(ws.config("prep", data={"shard_size": 7}))["fingerprint"] != base
    assert prep.run(ws.config("prep", data={"classes": ["0", "1", "2"]}))["fingerprint"] != base
    # a config without data.classes hashes the settings it hashed before the field existed
    assert "classes" not in prep.prep_settings(config_mod.resolve(ws.config("prep"))["data"])
    with open(os.path.join(ws.data, "blobs.csv"), "a") as handle:
        handle.write("1,2,3,4,0\n")
    assert prep.run(ws.config("prep"))["fingerprint"] != base
    assert len(ws.visible("work", "datasets")) == 5


def test_split_is_deterministic_and_stable_when_data_grows(ws, tmp_path):
    write_blobs_csv(os.path.join(ws.data, "small", "a.csv"), rows=200, seed=1)
    first = prep.run(ws.config("prep", data={"path": "small"}))
    write_blobs_csv(os.path.join(ws.data, "small", "b.csv"), rows=100, seed=2)
    grown = prep.run(ws.config("prep", data={"path": "small"}))
    assert first["fingerprint"] != grown["fingerprint"]

    def keys(result, split):
        schema = json.load(open(os.path.join(result["dataset_dir"], "schema.json")))
        return {k for k, _, _ in read_records(result["dataset_dir"], schema, split)}
    assert keys(first, "eval") <= keys(grown, "eval")
    assert keys(first, "train") <= keys(grown, "train")
    assert all(k.startswith("a.csv:") for k in keys(first, "train"))
    # the split is a pure function of (split_seed, key)
    assert prep.is_eval("a.csv:1,2", 42, 0.2) == prep.is_eval("a.csv:1,2", 42, 0.2)
    share = np.mean([prep.is_eval("k%d" % i, 42, 0.2) for i in range(5000)])
    assert 0.17 < share < 0.23


def test_prep_logs_progress_in_plain_lines(ws, capsys, monkeypatch):
    monkeypatch.setattr(common.Progress, "every_s", 0.0)  # a line per step instead of per 5 s
    prep.run(ws.config("prep"))
    out = capsys.readouterr().out
    assert "\r" not in out
    assert "prep: fingerprint " in out and " MiB (100%)" in out
    assert "prep: read 1/301 lines (0%)" in out  # the header, then the rows batch by batch
    assert "prep: read 301/301 lines (100%)" in out
    assert "prep: wrote 300/300 examples (100%)" in out
    write_image_folder(os.path.join(ws.data, "imgs"), per_class=5)
    prep.run(ws.config("prep", data={"format": "images", "path": "imgs",
                                     "image_size": [8, 8], "eval_fraction": 0.3}))
    out = capsys.readouterr().out
    assert "prep: read 10/10 images (100%)" in out and "prep: wrote 10/10 examples" in out


def test_progress_is_throttled_and_quiet_for_short_phases(capsys):
    common.setup_logging()
    times = iter([0.0, 1.0, 5.5, 7.0, 11.0, 12.0])
    progress = common.Progress("prep: read", 50, "lines", clock=lambda: next(times))
    for _ in range(5):  # at 1.0, 5.5 (logged), 7.0, 11.0 (logged), 12.0
        progress.add(10)
    progress.finish()
    lines = [l for l in capsys.readouterr().out.splitlines() if "prep: read" in l]
    assert [l.split("INFO ")[1] for l in lines] == [
        "prep: read 20/50 lines (40%)", "prep: read 40/50 lines (80%)",
        "prep: read 50/50 lines (100%)"]
    quiet = common.Progress("prep: read", 3, "lines")
    quiet.add(3)
    quiet.finish()
    assert "prep: read" not in capsys.readouterr().out


def test_prep_removes_temp_dirs_older_than_an_hour_in_datasets(ws):
    """Every prep, cache hit or not, deletes the ``.tmp-*`` dirs under ``datasets/`` that a killed
    prep or an interrupted data set removal (``.tmp-deleted-*``) left more than an hour ago; younger
    ones (perhaps another prep still writing) stay."""
    root = os.path.join(ws.work, "datasets")
    now = time.time()

    def plant():
        planted = {}
        for name, age in ((".tmp-killedprep", 2 * 3600), (".tmp-deleted-old", 2 * 3600),
                          (".tmp-writing", 60)):
            path = os.path.join(root, name)
            os.makedirs(os.path.join(path, "part"))
            for inner in (os.path.join(path, "part"), path):
                os.utime(inner, (now - age, now - age))
            planted[name] = path
        return planted

    for run_id, cache_hit in (("first_run", False), ("second_run", True)):
        planted = plant()
        result = prep.run(ws.config("prep", run_id=run_id))
        assert result["cache_hit"] is cache_hit
        assert not os.path.exists(planted[".tmp-killedprep"])
        assert not os.path.exists(planted[".tmp-deleted-old"])
        assert os.path.isdir(planted[".tmp-writing"])
        os.rmdir(os.path.join(planted[".tmp-writing"], "part"))
        os.rmdir(planted[".tmp-writing"])


def test_a_column_missing_from_a_wide_header_gets_a_short_error(tmp_path):
    """The error goes to the task log, the task's error and any alert mailed with it: a header of
    thousands of columns is shown by its ends and its count, not in full."""
    header = ["pixel_%d" % i for i in range(5000)] + ["label"]
    path = tmp_path / "wide.csv"
    path.write_text(",".join(header) + "\n" + ",".join(["0"] * len(header)) + "\n")
    config = {"data": {"label": "digit", "key": None, "features": None}}
    with pytest.raises(BadInput) as info:
        sources.csv_layout(config, [("wide.csv", str(path))])
    message = str(info.value)
    assert "column 'digit' (data.label)" in message and "5001 columns" in message, message
    assert "'pixel_0'" in message and "(4989 more)" in message and "'label'" in message, message
    assert "'pixel_2500'" not in message and len(message) < 400, message
