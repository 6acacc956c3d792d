"""The validate stage (the data gate): tonight's data set against the production model's.

The data sets here are what prep writes (``schema.json``, ``stats.json`` with the column profiles of
:mod:`trainer.profile`), made from NumPy samples on the test's own volumes, so that each check can
be driven by a known change of the data.
"""

import json
import os
import re
import time
import zlib
from html.parser import HTMLParser

import numpy as np
import pytest

from conftest import Workspace
from trainer import atomic, contract, profile, validate
from trainer.config import resolve
from trainer.errors import BadInput, DataRejected

PLANS = ("basic", "standard", "premium", "family", "student")
PLAN_SHARES = (0.35, 0.25, 0.2, 0.12, 0.08)


def sample(rows=3000, seed=0, missing=0.05, classes=("no", "yes")):
    """Columns of one night: ``amount`` (normal), ``plan`` (5 values), ``autopay`` (boolean), each
    with ``missing`` of its cells empty, and the labels."""
    rng = np.random.RandomState(seed)
    amount = rng.normal(50.0, 10.0, rows)
    plan = np.array(PLANS, dtype=object)[rng.choice(len(PLANS), rows, p=PLAN_SHARES)]
    autopay = (rng.rand(rows) < 0.6).astype(np.float64)
    amount[rng.rand(rows) < missing] = np.nan
    plan[rng.rand(rows) < missing] = None
    autopay[rng.rand(rows) < missing] = np.nan
    labels = rng.randint(len(classes), size=rows)
    return {"amount": ("float", amount), "plan": ("categorical", plan), "autopay": ("boolean", autopay)}, \
        labels, list(classes)


def write_dataset(ws, fingerprint, columns, labels, class_names, fmt="csv", ignored=(), profiles=True,
                  hashed=()):
    """Write ``<work>/datasets/<fingerprint>/`` as prep does: the first 80% of the rows are the train
    split. ``columns``: ``{name: (type, values)}`` (NaN or None: missing). ``profiles=False``: a data
    set made before prep profiled columns (no histogram, no frequencies)."""
    rows = len(labels)
    train = int(rows * 0.8)
    split = {"train": slice(0, train), "eval": slice(train, rows)}
    features, summaries = [], {}
    for name, (kind, values) in columns.items():
        if kind == "categorical":
            missing = {s: int(sum(v is None for v in values[part])) for s, part in split.items()}
            present = [v for v in values[:train] if v is not None]
            counts = {}
            for value in present:
                counts[value] = counts.get(value, 0) + 1
            summary = {"missing": missing["train"], "count": len(present), "distinct": len(counts)}
            entry = {"encoding": "vocabulary", "vocabulary": sorted(counts), "distinct": len(counts)}
            if name in hashed:
                buckets = [0] * 64
                for value, count in counts.items():
                    buckets[zlib.crc32(value.encode("utf-8")) % 64] += count
                frequencies = {"hashed": True, "buckets": buckets}
                entry = {"encoding": "hash", "hash_bins": 1024, "distinct_above": 10}
            else:
                ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
                frequencies = {"values": [v for v, _ in ranked], "counts": [c for _, c in ranked], "other": 0}
            if profiles:
                summary["frequencies"] = frequencies
        else:
            values = np.asarray(values, np.float64)
            missing = {s: int(np.isnan(values[part]).sum()) for s, part in split.items()}
            present = values[:train][~np.isnan(values[:train])]
            summary = {"count": int(present.size), "mean": float(present.mean()), "std": float(present.std()),
                       "min": float(present.min()), "max": float(present.max()), "missing": missing["train"]}
            if profiles:
                summary["histogram"] = profile.to_json(profile.column_counts(values[:train, None])[0])
            entry = {}
        features.append(dict(entry, name=name, type=kind, source="inferred", missing=missing))
        summaries[name] = summary
    labels = np.asarray(labels)
    schema = {"format": fmt, "counts": {"train": train, "eval": rows - train}, "class_names": class_names,
              "num_classes": len(class_names), "fingerprint": fingerprint, "label": "label",
              "features": features if fmt != "images" else [], "ignored": list(ignored)}
    stats = {"class_histogram": {s: np.bincount(labels[part], minlength=len(class_names)).tolist()
                                 for s, part in split.items()},
             "features": summaries if fmt != "images" else {}}
    directory = os.path.join(ws.work, "datasets", fingerprint)
    atomic.write_json(os.path.join(directory, "schema.json"), schema)
    atomic.write_json(os.path.join(directory, "stats.json"), stats)
    with open(os.path.join(directory, "_SUCCESS"), "w") as handle:
        handle.write("done\n")
    return schema, stats


def write_version(ws, version, fingerprint, run_id="scheduled__2026-11-28T18:00:00+00:00", blessed=True,
                  model_name="blobs"):
    """An exported model version's ``metadata.json`` (all the gate reads of it)."""
    atomic.write_json(os.path.join(ws.models, model_name, str(version), "metadata.json"), {
        "dag_id": ws.dag_id, "run_id": run_id, "version": version, "data": {"fingerprint": fingerprint},
        "evaluation": {"blessing": {"blessed": blessed}}})


def tonight(ws, fingerprint):
    """Point this run at data set ``fingerprint``, as its prep does."""
    atomic.write_json(os.path.join(ws.run_dir(), "dataset.json"), {"fingerprint": fingerprint})


def nights(ws, base, night, base_fp="a" * 16, night_fp="b" * 16, **kwargs):
    """Write a baseline night (the data set of blessed version 1) and tonight's, and point the run
    at tonight's. ``base``/``night``: ``(columns, labels, class_names)``."""
    write_dataset(ws, base_fp, *base, **kwargs.get("base_kwargs", {}))
    write_dataset(ws, night_fp, *night, **kwargs.get("night_kwargs", {}))
    write_version(ws, 1, base_fp)
    tonight(ws, night_fp)


def validate_config(ws, validation=None, data=None):
    config = ws.config("validate", data=data)
    config["validation"] = dict(validation or {})
    return config


def compare(base, night, validation=None, base_kwargs=None, night_kwargs=None, tmp=None):
    """The checks of tonight's sample against the baseline's, through the data sets' files."""
    ws = Workspace(tmp)
    nights(ws, base, night, base_kwargs=base_kwargs or {}, night_kwargs=night_kwargs or {})
    settings = resolve(validate_config(ws, validation))["validation"]
    read = [atomic.read_json(os.path.join(ws.work, "datasets", fp, name)) for fp in ("a" * 16, "b" * 16)
            for name in ("schema.json", "stats.json")]
    return validate.compare(read[0], read[1], read[2], read[3], settings)


class Page(HTMLParser):
    """The text, the <img> tags and the source of an HTML page."""

    def __init__(self, path):
        HTMLParser.__init__(self, convert_charrefs=True)
        self.images, self.words = [], []
        with open(path, encoding="utf-8") as handle:
            self.source = handle.read()
        self.feed(self.source)
        self.close()
        self.text = " ".join(" ".join(self.words).split())

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))

    def handle_data(self, data):
        self.words.append(data)


def flagged(checks):
    return sorted((r["column"], r["check"]) for r in checks.records if not r["ok"])


def record(checks, column, check):
    found = [r for r in checks.records if (r["column"], r["check"]) == (column, check)]
    assert len(found) == 1, checks.records
    return found[0]


# --- the measures -------------------------------------------------------------------------------

def test_two_samples_of_one_distribution_pass_every_default_check(tmp_path):
    """Calibration: ordinary sampling noise (3000 rows, a normal column, a 5-value category, 5%
    missing) stays well under every default threshold, across seeds."""
    for seed in range(4):
        checks = compare(sample(seed=2 * seed), sample(seed=2 * seed + 1), tmp=tmp_path / str(seed))
        assert flagged(checks) == [], checks.records
        assert checks.skipped == []
        drift = record(checks, "amount", "numeric_drift")
        assert drift["value"] < 0.02 and drift["threshold"] == 0.1
        assert record(checks, "plan", "categorical_drift")["value"] < 0.04
        assert abs(record(checks, "plan", "missing_increase")["value"]) < 0.03
        assert record(checks, None, "label_drift")["value"] < 0.04
        assert record(checks, None, "row_count")["value"] == 1.0


def test_a_change_of_unit_is_numeric_drift(tmp_path):
    """Calibration: one column times 1000 (grams for kilograms) moves all of tonight's mass above the
    baseline's range: flagged, with the means and the share outside the range in the detail."""
    columns, labels, names = sample(seed=1)
    kind, amount = columns["amount"]
    columns["amount"] = (kind, amount * 1000)
    checks = compare(sample(seed=0), (columns, labels, names), tmp=tmp_path)
    assert flagged(checks) == [("amount", "numeric_drift")]
    drift = record(checks, "amount", "numeric_drift")
    # all of tonight in the last group, which holds a tenth of the baseline: the most grouping can show
    assert drift["value"] == pytest.approx(0.758, abs=0.01)
    assert re.search(r"mean (49|50)\.\d+ -> (4\.99|5\.0\d)\de\+04", drift["detail"]), drift["detail"]
    assert "100.0% of tonight's values outside the baseline's range" in drift["detail"]
    plot = checks.distributions["amount"]
    assert plot["kind"] == "numeric" and len(plot["labels"]) == 10
    assert plot["tonight"][-1] == pytest.approx(1.0) and plot["baseline"][-1] < 0.2


def test_a_removed_column_is_flagged_unless_prep_ignores_it(tmp_path):
    """Calibration: a column gone upstream is ``column_missing``; typed ``ignore`` tonight it is not."""
    columns, labels, names = sample(seed=1)
    del columns["autopay"]
    checks = compare(sample(seed=0), (columns, labels, names), tmp=tmp_path / "gone")
    assert flagged(checks) == [("autopay", "column_missing")]
    checks = compare(sample(seed=0), (columns, labels, names), night_kwargs={"ignored": ["autopay"]},
                     tmp=tmp_path / "ignored")
    assert flagged(checks) == []


def test_a_new_category_taking_a_third_of_the_rows_is_categorical_drift(tmp_path):
    """Calibration: a new value in a third of the rows is flagged; the detail names it and its two
    frequencies, and the plot shows it next to the old values."""
    columns, labels, names = sample(seed=1)
    plan = columns["plan"][1]
    plan[::3] = "corporate"
    checks = compare(sample(seed=0), (columns, labels, names), tmp=tmp_path)
    assert flagged(checks) == [("plan", "categorical_drift")]
    drift = record(checks, "plan", "categorical_drift")
    assert drift["value"] == pytest.approx(0.35, abs=0.03)
    assert drift["detail"].startswith("'corporate' moved most: 0.000 -> 0.3")
    plot = checks.distributions["plan"]
    assert set(plot["labels"]) == set(PLANS) | {"corporate"}
    corporate = plot["labels"].index("corporate")
    assert plot["baseline"][corporate] == 0 and plot["tonight"][corporate] == pytest.approx(0.35, abs=0.03)


def test_a_type_change_is_flagged_but_float_to_int_is_not(tmp_path):
    """A numeric column that turns to text is ``type_changed`` (and not measured); float and int are
    both numeric."""
    columns, labels, names = sample(seed=1)
    columns["amount"] = ("categorical", np.array(["x%d" % (i % 4) for i in range(len(labels))], dtype=object))
    columns["autopay"] = ("int", columns["autopay"][1])
    base_columns, base_labels, _ = sample(seed=0)
    base_columns["autopay"] = ("float", base_columns["autopay"][1])
    checks = compare((base_columns, base_labels, names), (columns, labels, names), tmp=tmp_path)
    assert flagged(checks) == [("amount", "type_changed")]
    assert record(checks, "amount", "type_changed")["value"] == "float -> categorical"
    assert not [r for r in checks.records if r["column"] == "amount" and r["check"] != "type_changed"]


def test_a_new_column_is_flagged(tmp_path):
    columns, labels, names = sample(seed=1)
    columns["region"] = ("categorical", np.array(["north"] * len(labels), dtype=object))
    checks = compare(sample(seed=0), (columns, labels, names), tmp=tmp_path)
    assert flagged(checks) == [("region", "column_new")]


def test_missing_increase_and_its_per_column_override(tmp_path):
    """A column whose missing share rises from 5% to 25% is flagged; ``validation.columns`` can
    raise that column's threshold, or skip its drift and missing checks."""
    columns, labels, names = sample(seed=1)
    amount = columns["amount"][1]
    amount[np.random.RandomState(3).rand(len(amount)) < 0.2] = np.nan
    night = (columns, labels, names)
    checks = compare(sample(seed=0), night, tmp=tmp_path / "default")
    assert flagged(checks) == [("amount", "missing_increase")]
    assert record(checks, "amount", "missing_increase")["value"] == pytest.approx(0.19, abs=0.03)
    raised = compare(sample(seed=0), night, {"columns": {"amount": {"missing_increase": 0.3}}},
                     tmp=tmp_path / "raised")
    assert flagged(raised) == [] and record(raised, "amount", "missing_increase")["threshold"] == 0.3
    assert record(raised, "plan", "missing_increase")["threshold"] == 0.1
    skipped = compare(sample(seed=0), night, {"columns": {"amount": {"skip": True}}}, tmp=tmp_path / "skip")
    assert flagged(skipped) == []
    assert not [r for r in skipped.records if r["column"] == "amount"]
    assert skipped.skipped == [{"column": "amount", "check": "drift and missing_increase",
                                "why": "validation.columns['amount'].skip is true"}]


def test_thresholds_come_from_the_section_and_the_column(tmp_path):
    """A lower section threshold flags ordinary noise; a column override wins over the section."""
    checks = compare(sample(seed=0), sample(seed=1), {"numeric_drift": 0.0001, "categorical_drift": 0.0001,
                                                      "columns": {"autopay": {"numeric_drift": 0.5}}},
                     tmp=tmp_path)
    assert ("amount", "numeric_drift") in flagged(checks) and ("plan", "categorical_drift") in flagged(checks)
    assert record(checks, "autopay", "numeric_drift")["ok"]
    assert record(checks, "autopay", "numeric_drift")["threshold"] == 0.5


def test_label_drift_compares_class_frequencies_by_name(tmp_path):
    """Classes are matched by name, not id: the same labels under a reordered class list do not
    drift; a class that grows from a half to all but a tenth does."""
    columns, labels, _ = sample(seed=1)
    checks = compare(sample(seed=0), (columns, 1 - labels, ["yes", "no"]), tmp=tmp_path / "renamed")
    assert record(checks, None, "label_drift")["ok"]
    skewed = np.where(np.random.RandomState(5).rand(len(labels)) < 0.9, 1, labels)
    checks = compare(sample(seed=0), (columns, skewed, ["no", "yes"]), tmp=tmp_path / "skewed")
    assert flagged(checks) == [(None, "label_drift")]
    # two classes: each moves as much as the other
    assert re.match(r"class '(no|yes)' moved most: 0\.\d+ -> 0\.\d+$", record(checks, None, "label_drift")["detail"])
    assert record(checks, None, "label_drift")["value"] == pytest.approx(0.45, abs=0.03)
    assert checks.distributions["(label)"]["labels"] == ["yes", "no"]


@pytest.mark.parametrize("rows, ok", [(1499, False), (1500, True), (6000, True), (6001, False)])
def test_row_count_ratio_bounds(tmp_path, rows, ok):
    """Tonight's rows over the baseline's 3000 must lie in [0.5, 2.0] (both ends allowed)."""
    checks = compare(sample(seed=0), sample(rows=rows, seed=1), tmp=tmp_path)
    assert record(checks, None, "row_count")["ok"] is ok
    assert record(checks, None, "row_count")["threshold"] == [0.5, 2.0]


def test_hashed_columns_compare_their_buckets(tmp_path):
    """A hashed column compares its 64 crc32 buckets; a column hashed on one night only is not
    compared, and says why."""
    def ids(seed, prefix="u"):
        columns, labels, names = sample(seed=seed)
        rng = np.random.RandomState(seed)
        columns["user"] = ("categorical", np.array(["%s%d" % (prefix, i) for i in rng.randint(5000, size=3000)],
                                                   dtype=object))
        return columns, labels, names
    same = compare(ids(0), ids(1), base_kwargs={"hashed": ["user"]}, night_kwargs={"hashed": ["user"]},
                   tmp=tmp_path / "same")
    assert record(same, "user", "categorical_drift")["ok"]
    moved = ids(1)
    moved[0]["user"][1][:1500] = "u42"
    drift = compare(ids(0), moved, base_kwargs={"hashed": ["user"]}, night_kwargs={"hashed": ["user"]},
                    tmp=tmp_path / "moved")
    assert flagged(drift) == [("user", "categorical_drift")]
    assert record(drift, "user", "categorical_drift")["detail"].startswith(
        "bucket %d moved most" % (zlib.crc32(b"u42") % 64))
    mixed = compare(ids(0), ids(1), night_kwargs={"hashed": ["user"]}, tmp=tmp_path / "mixed")
    assert {"column": "user", "check": "categorical_drift",
            "why": "the column is a vocabulary in the baseline and hashed tonight: its frequencies do not "
                   "compare"} in mixed.skipped


def test_data_sets_made_before_the_profile_skip_drift_and_say_so(tmp_path):
    """A baseline without histograms or frequencies still gets the schema, missing, label and row
    checks; the drift checks are listed as not run, with the reason."""
    checks = compare(sample(seed=0), sample(seed=1), base_kwargs={"profiles": False}, tmp=tmp_path)
    assert flagged(checks) == []
    assert {(s["column"], s["check"]) for s in checks.skipped} == {
        ("amount", "numeric_drift"), ("autopay", "numeric_drift"), ("plan", "categorical_drift")}
    assert all("the baseline's stats.json has no" in s["why"] for s in checks.skipped)
    assert {r["check"] for r in checks.records} == {"missing_increase", "label_drift", "row_count"}


def test_numeric_groups_hold_equal_baseline_mass_and_fewer_for_few_values():
    """Ten groups of a tenth of the baseline each; a boolean column gives two; tonight's values
    below or above the baseline's range land in the first or last group."""
    values = np.random.RandomState(0).normal(0, 1, 20000)
    base = profile.from_json(profile.to_json(profile.column_counts(values[:, None])[0]))
    base_counts, night_counts, labels = validate.numeric_groups(base, {-profile.SPAN: 5, profile.SPAN: 7})
    assert len(labels) == 10 and all(abs(c / 20000.0 - 0.1) < 0.02 for c in base_counts)
    assert night_counts[0] == 5 and night_counts[-1] == 7 and sum(night_counts) == 12
    assert labels[0].startswith("< ") and labels[-1].startswith(">= ")
    booleans = {profile.bin_ids(np.array([0.0]))[0]: 700, profile.bin_ids(np.array([1.0]))[0]: 300}
    assert validate.numeric_groups(booleans, booleans)[0] == [700, 300]


def test_js_divergence_runs_from_zero_to_one():
    assert validate.js_divergence([1, 2, 3], [2, 4, 6]) == 0.0
    assert validate.js_divergence([1, 0], [0, 1]) == 1.0
    assert validate.js_divergence([1, 1], [1, 3]) == pytest.approx(0.0488, abs=1e-4)


def test_images_get_label_drift_and_row_count_only(tmp_path):
    _, labels, names = sample(seed=0)
    checks = compare(({}, labels, names), ({}, labels[:1000], names), base_kwargs={"fmt": "images"},
                     night_kwargs={"fmt": "images"}, tmp=tmp_path)
    assert sorted(r["check"] for r in checks.records) == ["label_drift", "row_count"]
    assert flagged(checks) == [(None, "row_count")]


def test_thirty_columns_compare_in_well_under_a_second(tmp_path):
    """The comparison reads two small files per night and never the records: 30 columns of 100000
    rows (10 numeric with wide histograms, 10 boolean, 10 text) compare in far less than a second."""
    def night(seed):
        rng = np.random.RandomState(seed)
        columns = {}
        for i in range(10):
            columns["n%d" % i] = ("float", rng.lognormal(i, 2.0, 100000))
            columns["b%d" % i] = ("boolean", (rng.rand(100000) < 0.3).astype(np.float64))
            columns["c%d" % i] = ("categorical", np.array(["v%d" % v for v in rng.randint(500, size=100000)],
                                                          dtype=object))
        return columns, rng.randint(2, size=100000), ["no", "yes"]
    ws = Workspace(tmp_path)
    nights(ws, night(0), night(1))
    read = [atomic.read_json(os.path.join(ws.work, "datasets", fp, name)) for fp in ("a" * 16, "b" * 16)
            for name in ("schema.json", "stats.json")]
    settings = resolve(validate_config(ws))["validation"]
    started = time.perf_counter()
    checks = validate.compare(read[0], read[1], read[2], read[3], settings)
    seconds = time.perf_counter() - started
    assert len(checks.records) == 2 + 2 * 30 and flagged(checks) == []
    assert seconds < 1.0, seconds


# --- the stage ----------------------------------------------------------------------------------

def unit_change(ws):
    """Tonight's ``amount`` times 1000 against blessed version 1's data set."""
    columns, labels, names = sample(seed=1)
    columns["amount"] = ("float", columns["amount"][1] * 1000)
    plan = columns["plan"][1]
    plan[::3] = "corporate"
    nights(ws, sample(seed=0), (columns, labels, names))


def test_no_blessed_model_checks_the_config_and_passes(tmp_path, capsys):
    """Without a production model there is nothing to compare: the data set is held against
    ``data.columns`` and the validation.columns names, and the decision says why."""
    ws = Workspace(tmp_path)
    write_dataset(ws, "b" * 16, *sample(seed=1))
    tonight(ws, "b" * 16)
    result = validate.run(validate_config(ws, {"columns": {"amont": {"skip": True}}},
                                          data={"columns": {"plan": "categorical", "amount": "numeric"}}))
    assert result["decision"] == "passed" and result["baseline"] is None and result["anomalies"] == []
    saved = ws.read(contract.VALIDATION_FILE)
    assert saved["no_baseline_reason"].startswith("no blessed model yet: ")
    assert saved["warnings"] == ["validation.columns['amont']: no feature of the data set has that name "
                                 "(did you mean 'amount'?). Fix: use one of amount, autopay, plan"]
    out = capsys.readouterr().out
    assert "no blessed model yet" in out and "did you mean 'amount'?" in out
    assert not os.path.exists(os.path.join(ws.run_dir(), contract.REPORT_FILE))


def test_no_blessed_model_flags_columns_that_do_not_match_the_config(tmp_path):
    ws = Workspace(tmp_path)
    write_dataset(ws, "b" * 16, *sample(seed=1))
    tonight(ws, "b" * 16)
    config = validate_config(ws, data={"columns": {"plan": "numeric", "region": "categorical",
                                                   "autopay": "boolean", "notes": "ignore"}})
    with pytest.raises(DataRejected) as caught:
        validate.run(config)
    assert [(r["column"], r["check"]) for r in caught.value.result["anomalies"]] == [
        ("plan", "type_changed"), ("region", "column_missing")]
    assert "against the config (no blessed model yet)" in str(caught.value)


def test_the_same_data_set_as_production_passes_and_says_so(tmp_path, capsys):
    ws = Workspace(tmp_path)
    write_dataset(ws, "a" * 16, *sample(seed=0))
    write_version(ws, 1, "a" * 16)
    tonight(ws, "a" * 16)
    result = validate.run(validate_config(ws))
    assert result["decision"] == "passed" and result["checks"] == []
    assert result["baseline"]["fingerprint"] == "a" * 16
    assert ws.read(contract.VALIDATION_FILE)["same_data"] is True
    assert "same data, passed" in capsys.readouterr().out


def test_the_baseline_is_the_newest_blessed_version_of_another_run(tmp_path):
    """Versions not blessed, or exported by this DAG run, are passed over; when the production
    version's data set is gone from the work volume there is no baseline, and the reason says so."""
    ws = Workspace(tmp_path)
    write_dataset(ws, "a" * 16, *sample(seed=0))
    write_dataset(ws, "c" * 16, *sample(seed=2))
    write_dataset(ws, "b" * 16, *sample(seed=1))
    write_version(ws, 1, "c" * 16)
    write_version(ws, 2, "a" * 16, run_id="scheduled__2026-11-29T18:00:00+00:00")
    write_version(ws, 3, "c" * 16, blessed=False, run_id="scheduled__2026-11-30T18:00:00+00:00")
    write_version(ws, 4, "c" * 16, run_id=ws.run_id)
    tonight(ws, "b" * 16)
    config = resolve(validate_config(ws))
    baseline, reason = validate.find_baseline(config, "b" * 16)
    assert reason is None and baseline == {"version": 2, "fingerprint": "a" * 16,
                                           "dataset_dir": os.path.join(ws.work, "datasets", "a" * 16)}
    os.remove(os.path.join(ws.work, "datasets", "a" * 16, "_SUCCESS"))
    result = validate.run(validate_config(ws))
    assert result["baseline"] is None and result["decision"] == "passed"
    assert result["no_baseline_reason"] == ("the data set of production version 2 (%s) is no longer on the "
                                            "work volume" % os.path.join(ws.work, "datasets", "a" * 16))


def test_accept_data_change_lets_anomalies_through_and_records_it(tmp_path, capsys):
    ws = Workspace(tmp_path)
    unit_change(ws)
    result = validate.run(validate_config(ws, {"accept_data_change": True}))
    assert result["decision"] == "accepted" and result["accepted"] is True
    assert {(r["column"], r["check"]) for r in result["anomalies"]} == {
        ("amount", "numeric_drift"), ("plan", "categorical_drift")}
    saved = ws.read(contract.VALIDATION_FILE)
    assert saved["accepted"] is True and saved["decision"] == "accepted"
    assert "WARNING validate: ACCEPTED 2 anomalies" in capsys.readouterr().out


def test_warn_goes_on_and_reports_each_flagged_column_with_a_plot(tmp_path):
    """``on_anomaly: warn``: the stage returns; report.html shows the checks, flagged first, and one
    plot per flagged column."""
    ws = Workspace(tmp_path)
    unit_change(ws)
    result = validate.run(validate_config(ws, {"on_anomaly": "warn"}))
    assert result["decision"] == "warned" and result["report"] == os.path.join(ws.run_dir(), "report.html")
    page = Page(result["report"])
    assert page.source.count("data:image/png;base64,") == 2 == len(page.images)
    assert {image["alt"] for image in page.images} == {"amount: baseline and tonight's distribution",
                                                       "plan: baseline and tonight's distribution"}
    assert "Data check" in page.text and "WARNED" in page.text
    first_rows = page.source.split("<tbody>")[2].split("</tr>")[:3]
    assert ["FLAGGED" in row for row in first_rows] == [True, True, False]


def test_rejection_exits_14_with_the_findings_and_the_fix(tmp_path, cli, without_tensorflow):
    """Through ``python -m trainer validate`` (without TensorFlow): exit 14, the result line with the
    findings, then an error naming each column, measure, value, threshold and the fix."""
    ws = Workspace(tmp_path)
    unit_change(ws)
    proc = cli("validate", validate_config(ws), env=without_tensorflow)
    assert proc.returncode == contract.ExitCode.DATA_REJECTED, proc.stderr
    result = contract.parse_result_line(proc.stdout.splitlines())
    assert result["decision"] == "rejected" and result["accepted"] is False and len(result["checks"]) == 8
    assert result["baseline"] == {"version": 1, "fingerprint": "a" * 16,
                                  "dataset_dir": os.path.join(ws.work, "datasets", "a" * 16)}
    assert [(r["column"], r["check"]) for r in result["anomalies"]] == [
        ("amount", "numeric_drift"), ("plan", "categorical_drift")]
    dataset = result["dataset"]
    assert dataset["fingerprint"] == "b" * 16 and dataset["rows"] == 3000
    assert dataset["columns"]["plan"]["distinct"] == 6 and dataset["columns"]["plan"]["mean"] is None
    assert dataset["columns"]["amount"]["min"] > 1000 and dataset["columns"]["amount"]["missing"] > 100
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("ERROR (DataRejected, exit 14): data rejected: 2 anomalies against the production "
                            "data set (version 1, %s): column 'amount': numeric_drift 0." % ("a" * 16))
    assert "above 0.1 (Jensen-Shannon divergence" in error
    assert "column 'plan': categorical_drift 0.3" in error and "'corporate' moved most: 0.000 -> 0.3" in error
    assert ("Fix: if the upstream data is wrong, correct it and clear the run; if the change is real, trigger "
            "the run with accept_data_change: true (its data becomes the baseline once its model is blessed), "
            "or raise validation.numeric_drift / validation.categorical_drift (validation.columns.<column> "
            "for one column)") in error
    saved = ws.read(contract.VALIDATION_FILE)
    assert error.endswith("Details: %s" % os.path.join(ws.run_dir(), contract.VALIDATION_FILE))
    assert saved["decision"] == "rejected" and saved["anomalies"] == result["anomalies"]
    assert saved["fingerprint"] == "b" * 16 and saved["baseline"] == result["baseline"]
    assert len(saved["checks"]) == 8 and saved["no_baseline_reason"] is None
    assert sorted(saved["distributions"]) == ["amount", "plan"]
    assert os.path.exists(os.path.join(ws.run_dir(), contract.REPORT_FILE))
    assert json.load(open(os.path.join(ws.run_dir(), "config", "validate.json")))["stage"] == "validate"


def test_a_passing_retry_removes_the_earlier_data_check_report(tmp_path):
    ws = Workspace(tmp_path)
    unit_change(ws)
    with pytest.raises(DataRejected):
        validate.run(validate_config(ws))
    assert os.path.exists(os.path.join(ws.run_dir(), contract.REPORT_FILE))
    result = validate.run(validate_config(ws, {"numeric_drift": 1, "categorical_drift": 1}))
    assert result["decision"] == "passed" and result["report"] is None
    assert not os.path.exists(os.path.join(ws.run_dir(), contract.REPORT_FILE))


@pytest.mark.parametrize("columns, words", [
    ({"amount": {"numeric_drfit": 0.2}}, "validation.columns['amount'].numeric_drfit: not a per-column check "
                                         "(did you mean 'numeric_drift'?)"),
    ({"amount": {"numeric_drift": -0.1}}, "validation.columns['amount'].numeric_drift must be at least 0"),
    ({"amount": {"skip": "yes"}}, "validation.columns['amount'].skip must be true or false"),
    ({"amount": 0.2}, "validation.columns['amount'] must be an object"),
])
def test_bad_column_overrides_are_bad_input(tmp_path, columns, words):
    ws = Workspace(tmp_path)
    with pytest.raises(BadInput) as caught:
        resolve(validate_config(ws, {"columns": columns}))
    assert words in str(caught.value)


def test_the_findings_in_tfdv_formats(tmp_path):
    """``validation/schema.pbtxt`` and ``anomalies.pbtxt`` parse as tensorflow_metadata's Schema and
    Anomalies: the thresholds as drift comparators (none for a skipped column), each anomaly typed
    as TFDV types it, the row count among the data set's anomalies."""
    from google.protobuf import text_format
    from tensorflow_metadata.proto.v0 import anomalies_pb2, schema_pb2

    ws = Workspace(tmp_path)
    columns, labels, names = sample(rows=1000, seed=1)
    columns["amount"] = ("float", columns["amount"][1] * 1000)
    columns["plan"][1][::3] = "corporate"
    del columns["autopay"]
    nights(ws, sample(seed=0), (columns, labels, names))
    result = validate.run(validate_config(ws, {"on_anomaly": "warn", "columns": {"plan": {"categorical_drift": 0.2}}}))
    assert {(a["column"], a["check"]) for a in result["anomalies"]} == {
        ("amount", "numeric_drift"), ("plan", "categorical_drift"), ("autopay", "column_missing"),
        (None, "row_count")}
    folder = os.path.join(ws.run_dir(), "validation")
    assert ws.read(contract.VALIDATION_FILE)["tfdv"] == folder
    schema = text_format.Parse(open(os.path.join(folder, "schema.pbtxt")).read(), schema_pb2.Schema())
    features = {f.name: f for f in schema.feature}
    assert sorted(features) == ["amount", "label", "plan"]
    assert features["amount"].type == schema_pb2.FLOAT
    assert features["amount"].drift_comparator.jensen_shannon_divergence.threshold == pytest.approx(0.1)
    assert features["plan"].type == schema_pb2.BYTES
    assert features["plan"].drift_comparator.infinity_norm.threshold == pytest.approx(0.2)
    domains = {d.name: list(d.value) for d in schema.string_domain}
    assert sorted(domains["plan"]) == sorted(PLANS + ("corporate",)) and domains["(label)"] == names
    assert schema.dataset_constraints.num_examples_drift_comparator.min_fraction_threshold == 0.5
    anomalies = text_format.Parse(open(os.path.join(folder, "anomalies.pbtxt")).read(), anomalies_pb2.Anomalies())
    info = anomalies_pb2.AnomalyInfo
    assert {name: [r.type for r in a.reason] for name, a in anomalies.anomaly_info.items()} == {
        "amount": [info.COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH], "plan": [info.COMPARATOR_L_INFTY_HIGH],
        "autopay": [info.SCHEMA_MISSING_COLUMN]}
    assert anomalies.anomaly_info["amount"].description.startswith("column 'amount': numeric_drift 0.7")
    assert [r.type for r in anomalies.dataset_anomaly_info.reason] == [info.COMPARATOR_LOW_NUM_EXAMPLES]
    assert anomalies.baseline == schema


def test_the_gate_reads_what_prep_writes(tmp_path):
    """Two nights of the same churn-like table through the real prep: every check runs on prep's
    profiles (none is skipped) and passes; a night whose plans all turn "premium" is rejected."""
    from conftest import write_mixed_csv
    from trainer import prep

    ws = Workspace(tmp_path)
    data = {"path": "night.csv", "label": "churn", "columns": {"customer_id": "ignore", "zip": "categorical"}}
    write_mixed_csv(os.path.join(ws.data, "night.csv"), rows=1500, seed=0)
    first = prep.run(ws.config("prep", run_id="night-1", data=data))
    write_version(ws, 1, first["fingerprint"], run_id="night-1")
    write_mixed_csv(os.path.join(ws.data, "night.csv"), rows=1500, seed=1)
    prep.run(ws.config("prep", data=data))
    result = validate.run(validate_config(ws, data=data))
    saved = ws.read(contract.VALIDATION_FILE)
    assert result["decision"] == "passed" and saved["skipped"] == [], saved["skipped"]
    assert {(r["column"], r["check"]) for r in saved["checks"]} == {
        (None, "label_drift"), (None, "row_count")} | {(c, check) for c in ("tenure", "monthly", "autopay")
                                                       for check in ("numeric_drift", "missing_increase")} | {
        (c, check) for c in ("plan", "zip") for check in ("categorical_drift", "missing_increase")}
    write_mixed_csv(os.path.join(ws.data, "night.csv"), rows=1500, seed=1, plans={"premium": -2.0})
    prep.run(ws.config("prep", try_number=2, data=data))
    with pytest.raises(DataRejected) as caught:
        validate.run(validate_config(ws, data=data))
    assert ("plan", "categorical_drift") in [(a["column"], a["check"]) for a in caught.value.result["anomalies"]]
