"""The data profile in ``stats.json``: histograms of the numeric and boolean features, value
frequencies (or crc32 buckets) of the categorical ones, all of the train split, made in prep's one
pass. The data gate (``trainer.validate``) compares two nights' profiles, so they must be exact.
"""

import json
import os
import zlib

import numpy as np
import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow  # noqa: E402,F401

from conftest import Workspace, write_mixed_csv  # noqa: E402
from trainer import prep, profile  # noqa: E402

CHURN = {"path": "churn.csv", "label": "churn"}


def load_stats(result):
    with open(os.path.join(result["dataset_dir"], "stats.json")) as handle:
        return json.load(handle)


def frexp_bin(value):
    """The bin id of one float32 value by its binary exponent and mantissa (``numpy.frexp``), an
    independent reading of the bin layout of :mod:`trainer.profile`."""
    value = np.float32(value)
    if value == 0:
        return 0
    mantissa, exponent = np.frexp(abs(value))  # abs = 2 ** exponent * mantissa, mantissa in [0.5, 1)
    octave = int(exponent) - 1
    part = int((float(mantissa) * 2 - 1) * profile.SUB_BINS)  # exact: a float32 mantissa times 32
    if octave < profile.LOWEST:
        return 0
    found = min((octave - profile.LOWEST) * profile.SUB_BINS + part + 1, profile.SPAN)
    return found if value > 0 else -found


def train_rows(rows, fraction=0.2, seed=42, path="churn.csv"):
    """The rows of :func:`conftest.write_mixed_csv` in the train split (the key is the file and row text)."""
    header = ["customer_id", "tenure", "monthly", "plan", "autopay", "zip", "churn"]
    return [r for r in rows if not prep.is_eval("%s:%s" % (path, ",".join(r[c] for c in header)), seed, fraction)]


@pytest.fixture
def churn(tmp_path):
    ws = Workspace(tmp_path / "churn")
    ws.rows = write_mixed_csv(os.path.join(ws.data, "churn.csv"), rows=600)
    return ws


def test_bin_ids_read_the_exponent_and_mantissa_of_each_value():
    """The bit-reading bin of a value is its binary octave and mantissa bin; bin_edges bound it."""
    rng = np.random.RandomState(3)
    values = np.concatenate([rng.normal(0, 100, 500), rng.lognormal(0, 8, 200), -rng.lognormal(0, 8, 200),
                             [0.0, -0.0, 1.0, 2.0, -1.5, 1e-20, 2.0 ** 70, -(2.0 ** 70)]])
    ids = profile.bin_ids(values)
    assert ids.tolist() == [frexp_bin(v) for v in values]
    for value, bin_id in zip(values.astype(np.float32), ids):
        if bin_id and abs(bin_id) < profile.SPAN:
            edges = profile.bin_edges(int(bin_id))
            low, high = sorted(abs(e) for e in edges)
            assert low <= abs(value) < high and (value > 0) == (edges[0] > 0)
            assert min(edges) <= profile.bin_middle(int(bin_id)) <= max(edges)


def test_histograms_count_the_train_split_of_each_numeric_and_boolean_feature(churn):
    """stats.json's histogram of every numeric and boolean feature is the count of its non-missing
    train values per bin, as a direct count over the train rows of the CSV gives it; missing cells
    (empty, NA) are left out, so the counts add up to the feature's count."""
    stats = load_stats(prep.run(churn.config("prep", data=CHURN)))
    train = train_rows(churn.rows)
    for name in ("tenure", "monthly", "zip", "autopay"):
        cells = [r[name] for r in train if r[name] not in ("", "NA")]
        values = [{"yes": 1.0, "no": 0.0}[c] if name == "autopay" else float(c) for c in cells]
        ids, counts = np.unique([frexp_bin(v) for v in values], return_counts=True)
        histogram = stats["features"][name]["histogram"]
        assert histogram == {"scale": profile.SCALE, "bins": ids.tolist(), "counts": counts.tolist()}, name
        assert sum(histogram["counts"]) == stats["features"][name]["count"] == len(values)
        assert profile.from_json(histogram) == dict(zip(ids.tolist(), counts.tolist()))
    autopay = profile.from_json(stats["features"]["autopay"]["histogram"])
    assert autopay == {0: sum(r["autopay"] == "no" for r in train), frexp_bin(1.0): sum(r["autopay"] == "yes" for r in train)}
    assert "frequencies" not in stats["features"]["tenure"]


def test_frequencies_of_a_text_column_rank_its_train_values_without_the_minimum_count(tmp_path):
    """A vocabulary column's frequencies are its train values by count (ties by value), at most
    data.max_vocabulary of them, with no data.min_frequency cut, and ``other`` the remaining
    non-missing train cells; eval cells and missing cells are not counted."""
    ws = Workspace(tmp_path / "freq")
    plan = {"a": 40, "b": 30, "c": 30, "d": 3, "e": 2, "f": 1}
    rows, i = [], 0
    for value, count in plan.items():
        for _ in range(count):
            rows.append(["k%d" % i, str(i % 7), value if i % 9 else "", str(i % 2)])
            i += 1
    with open(os.path.join(ws.data, "t.csv"), "w") as handle:
        handle.write("id,x,colour,label\n" + "".join(",".join(r) + "\n" for r in rows))
    data = {"path": "t.csv", "key": "id", "max_vocabulary": 4, "min_frequency": 5}
    stats = load_stats(prep.run(ws.config("prep", data=data)))
    train = [r[2] for r in rows if not prep.is_eval(r[0], 42, 0.2) and r[2]]
    ranked = sorted(set(train), key=lambda v: (-train.count(v), v))
    assert len(ranked) > 4 and train.count(ranked[3]) < 5, "the fourth value is below the minimum count"
    assert stats["features"]["colour"]["frequencies"] == {
        "values": ranked[:4], "counts": [train.count(v) for v in ranked[:4]],
        "other": len(train) - sum(train.count(v) for v in ranked[:4])}
    assert stats["features"]["colour"]["count"] == len(train)
    assert "histogram" not in stats["features"]["colour"]


def test_a_hashed_column_has_crc32_buckets_of_all_its_train_cells(churn):
    """A column above data.hash_threshold keeps no counts but 64 buckets: the train cells counted by
    crc32 of their UTF-8 text modulo 64, whichever batch saw them before the threshold was passed."""
    stats = load_stats(prep.run(churn.config("prep", data=dict(CHURN, hash_threshold=50))))
    train = train_rows(churn.rows)
    for name in ("customer_id", "plan"):
        expected = [0] * 64
        for row in train:
            if row[name]:
                expected[zlib.crc32(row[name].encode("utf-8")) % 64] += 1
        found = stats["features"][name]["frequencies"]
        if name == "customer_id":
            assert found == {"hashed": True, "buckets": expected}
        else:
            assert "hashed" not in found and found["other"] == 0 and sum(found["counts"]) == sum(expected)


def test_the_profile_is_the_same_whatever_the_batches(churn, tmp_path, monkeypatch):
    """Cut into many batches on two workers, with a column hashed part-way, the histograms and
    frequencies are exactly those of one batch."""
    data = dict(CHURN, hash_threshold=200)
    one = load_stats(prep.run(churn.config("prep", data=data)))
    monkeypatch.setattr(prep, "READ_BYTES", 1024)
    monkeypatch.setattr(prep, "BATCH_BYTES", 2048)
    monkeypatch.setattr(prep, "usable_cpus", lambda: 2)
    other = Workspace(tmp_path / "batched")
    write_mixed_csv(os.path.join(other.data, "churn.csv"), rows=600)
    many = load_stats(prep.run(other.config("prep", data=data)))
    assert many["features"]["customer_id"]["frequencies"]["hashed"] is True
    for name, summary in one["features"].items():
        found = {key: summary[key] for key in ("histogram", "frequencies") if key in summary}
        assert found and found == {key: many["features"][name][key] for key in found}, name
