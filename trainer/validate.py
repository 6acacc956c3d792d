"""The validate stage, the data gate: tonight's data set against the production model's.

Tonight's data set is the one this run's prep chose (``<run_dir>/dataset.json``). The baseline is
the data set of the production model: the newest blessed version under ``<models>/<model_name>/``
that this DAG run did not export, read from ``<work>/datasets/<its fingerprint>/``. With no such
version, or when its data set is gone from the work volume, there is no baseline: the data set is
then checked against the config only (``data.columns`` types). The same fingerprint as the baseline's
is the same data: it passes.

The checks compare the two data sets' ``schema.json`` and ``stats.json``, never their records, so
the gate takes well under a second whatever the data size:

* schema: a baseline feature missing tonight and not ignored (``column_missing``), a new feature
  (``column_new``), a type change (``type_changed``; ``float`` and ``int`` are both numeric);
* ``missing_increase``: the rise of a column's share of missing train cells;
* ``numeric_drift``: the Jensen-Shannon divergence (base 2, 0..1) of a numeric or boolean column's
  histograms (:mod:`trainer.profile`'s fixed bins), after grouping the bins into at most
  :data:`GROUPS` groups of equal baseline mass; tonight's values outside the baseline's range fall
  in the first or last group, so a change of unit moves all of tonight's mass into one group;
* ``categorical_drift``: the L-infinity distance of a text column's value frequencies (the share of
  its non-missing train cells; the values prep did not list count as one more value, "other"), or
  of its hash buckets' shares when it is hashed;
* ``label_drift``: the L-infinity distance of the class frequencies (train and eval) by class name;
* ``row_count``: tonight's rows over the baseline's, within ``[min_row_ratio, max_row_ratio]``.

Image data sets get the last two only. A check that cannot run (a data set made before prep wrote
histograms, an encoding change) is listed in ``skipped`` with the reason. ``validation.columns``
overrides a column's thresholds; ``skip`` leaves out its drift and missing-value checks.

Decision: no anomaly: ``passed``; anomalies and ``accept_data_change``: ``accepted`` (this run's
data becomes the baseline once its model is blessed); anomalies and ``on_anomaly: warn``:
``warned``; else ``rejected``: :class:`~trainer.errors.DataRejected` (exit 14), whose message names
each column, measure, value and threshold, and the fix. ``<run_dir>/validation.json`` records every
case; with anomalies the run report (``report.html``) shows them, with a plot per flagged column.
``<run_dir>/validation/`` holds the same findings in TFDV's formats (:mod:`trainer.tfmd`).

Standard library and NumPy only (and ``tensorflow_metadata``'s protos for the TFDV files): no
TensorFlow.
"""

import difflib
import os
import time

from trainer import atomic, common, contract, profile, report
from trainer.common import LOG
from trainer.errors import DataRejected

#: Most groups the fine histogram bins are gathered into before the divergence is measured: enough
#: to see a shift of a tenth of the mass, few enough that two samples of a few thousand rows from
#: one distribution differ by far less than the default threshold.
GROUPS = 10
#: Values and classes a categorical plot shows (those whose frequency is highest on either night).
PLOT_VALUES = 10
NUMERIC_TYPES = ("float", "int")
#: The measures a per-column override (``validation.columns.<column>``) may set.
COLUMN_MEASURES = tuple(c for c in contract.COLUMN_CHECKS if c != "skip")
#: ``data.columns`` types and the schema types each stands for.
CONFIG_TYPES = {"numeric": NUMERIC_TYPES, "categorical": ("categorical",), "boolean": ("boolean",)}


# --- the baseline -------------------------------------------------------------------------------

def find_baseline(config, fingerprint):
    """``(baseline, reason)``: the production data set, or None and why there is none.

    ``baseline`` is ``{"version", "fingerprint", "dataset_dir"}`` of the newest blessed version not
    exported by this DAG run. Only that version counts: an older one's data is not what the
    production model learnt from.
    """
    root = common.model_root(config)
    run = config["run"]
    versions = common.list_versions(root)
    passed_over = []
    for version in reversed(versions):
        meta = common.read_version_metadata(root, version)
        if not meta:
            passed_over.append("version %d has no readable metadata.json" % version)
            continue
        if (meta.get("dag_id"), meta.get("run_id")) == (run["dag_id"], run["run_id"]):
            continue
        blessing = (meta.get("evaluation") or {}).get("blessing") or {}
        if blessing.get("blessed") is not True:
            passed_over.append("version %d is not blessed" % version)
            continue
        base_fp = (meta.get("data") or {}).get("fingerprint")
        if not base_fp:
            return None, ("production version %d of %s records no data set fingerprint"
                          % (version, root))
        dataset_dir = os.path.join(common.datasets_root(config), base_fp)
        if not os.path.exists(os.path.join(dataset_dir, "_SUCCESS")):
            return None, ("the data set of production version %d (%s) is no longer on the work volume"
                          % (version, dataset_dir))
        return {"version": version, "fingerprint": base_fp, "dataset_dir": dataset_dir}, None
    if not versions:
        return None, "no blessed model yet: %s holds no version" % root
    return None, "no blessed model yet: %s" % "; ".join(passed_over or [
        "every version under %s came from this run" % root])


# --- measures -----------------------------------------------------------------------------------

def js_divergence(p, q):
    """Jensen-Shannon divergence, base 2 (0: the same, 1: disjoint), of two count vectors."""
    import numpy as np

    p = np.asarray(p, np.float64)
    q = np.asarray(q, np.float64)
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2

    def kl(a):
        inside = a > 0
        return float(np.sum(a[inside] * np.log2(a[inside] / m[inside])))
    return min(1.0, max(0.0, (kl(p) + kl(q)) / 2))


def numeric_groups(baseline, tonight, groups=GROUPS):
    """Gather two histograms (``{bin id: count}``) into at most ``groups`` groups of about equal
    baseline mass; return ``(base_counts, tonight_counts, labels)``.

    Group boundaries follow the baseline's cumulative counts: a baseline bin joins the group its
    cumulative share before it falls into, so a bin heavier than ``1/groups`` (a column with few
    distinct values) is a group of its own and fewer groups result. Tonight's bins join the group
    of the next baseline boundary at or above them; above the baseline's range, the last one.
    """
    import numpy as np

    ids = np.array(sorted(baseline), np.int64)
    counts = np.array([baseline[i] for i in ids], np.float64)
    before = np.cumsum(counts) - counts
    group = np.minimum((before / counts.sum() * groups).astype(np.int64), groups - 1)
    last = np.r_[group[1:] != group[:-1], True]
    first = np.r_[True, group[1:] != group[:-1]]
    uppers, lowers = ids[last], ids[first]
    base = np.bincount(np.searchsorted(uppers, ids), weights=counts, minlength=len(uppers))
    t_ids = np.fromiter(tonight.keys(), np.int64, len(tonight))
    t_counts = np.fromiter(tonight.values(), np.float64, len(tonight))
    t_group = np.minimum(np.searchsorted(uppers, t_ids), len(uppers) - 1)
    night = np.bincount(t_group, weights=t_counts, minlength=len(uppers))
    labels = []
    for g, (low_id, high_id) in enumerate(zip(lowers, uppers)):
        low, high = profile.bin_edges(int(low_id))[0], profile.bin_edges(int(high_id))[1]
        if len(uppers) == 1:
            labels.append("all")
        elif g == 0:
            labels.append("< %.3g" % high)
        elif g == len(uppers) - 1:
            labels.append(">= %.3g" % low)
        else:
            labels.append("%.3g .. %.3g" % (low, high))
    return base.tolist(), night.tolist(), labels


def linf(base, night):
    """``(distance, key, base share, tonight share)``: the L-infinity distance of two frequency
    maps over the union of their keys, and the key that moved most."""
    worst = (0.0, None, 0.0, 0.0)
    for key in list(base) + [k for k in night if k not in base]:
        b, t = base.get(key, 0.0), night.get(key, 0.0)
        if abs(t - b) > worst[0]:
            worst = (abs(t - b), key, b, t)
    return worst


def _shares(counts):
    total = float(sum(counts.values()))
    return {k: v / total for k, v in counts.items()} if total else {}


#: The key of the values prep did not list ("other") in a frequency map: no cell text is None.
OTHER = None


def value_counts(summary):
    """``{value: count}`` of a text column's ``frequencies`` (``stats.json``), the unlisted values
    under :data:`OTHER`, hash buckets as ``"bucket N"``; None when there are none."""
    freq = (summary or {}).get("frequencies")
    if not freq:
        return None
    if freq.get("hashed"):
        return {"bucket %d" % i: c for i, c in enumerate(freq.get("buckets") or [])}
    counts = dict(zip(freq.get("values") or [], freq.get("counts") or []))
    if freq.get("other"):
        counts[OTHER] = freq["other"]
    return counts


def _show(value):
    return "(other values)" if value is OTHER else repr(value)


# --- the comparison -----------------------------------------------------------------------------

class Checks(object):
    """The records of one comparison: checks that ran, checks that could not, warnings, and the
    distributions of the columns worth a plot."""

    def __init__(self, settings):
        self.settings = settings
        self.records, self.skipped, self.warnings, self.distributions = [], [], [], {}

    def threshold(self, column, measure):
        override = (self.settings.get("columns") or {}).get(column) or {}
        return float(override.get(measure, self.settings[measure]))

    def skips(self, column):
        return bool(((self.settings.get("columns") or {}).get(column) or {}).get("skip"))

    def add(self, column, check, value, threshold, ok, detail):
        self.records.append({"column": column, "check": check, "value": value, "threshold": threshold,
                             "ok": bool(ok), "detail": detail})

    def measure(self, column, check, value, detail):
        """Record a measure held against its (per-column) threshold; return whether it passed."""
        threshold = self.threshold(column, check) if column is not None else float(self.settings[check])
        ok = value <= threshold
        self.add(column, check, round(value, 6), threshold, ok, detail)
        return ok

    def skip(self, column, check, why):
        self.skipped.append({"column": column, "check": check, "why": why})


def _features(schema):
    return {f["name"]: f for f in (schema or {}).get("features") or [] if isinstance(f, dict)}


def _kind(feature_type):
    return "numeric" if feature_type in NUMERIC_TYPES else feature_type


def _rows(schema):
    counts = (schema or {}).get("counts") or {}
    return int(counts.get("train", 0)) + int(counts.get("eval", 0))


def compare(base_schema, base_stats, schema, stats, settings):
    """Compare tonight's ``schema``/``stats`` with the baseline's; return a :class:`Checks`."""
    checks = Checks(settings)
    _label_drift(checks, base_stats, stats, base_schema, schema)
    _row_count(checks, base_schema, schema)
    tabular = [s.get("format") in contract.TABULAR_FORMATS for s in (base_schema, schema)]
    if tabular == [True, True]:
        _columns(checks, base_schema, base_stats, schema, stats)
    elif any(tabular):
        checks.add(None, "format_changed", "%s -> %s" % (base_schema.get("format"), schema.get("format")),
                   None, False, "the baseline data set is %s, tonight's is %s: no column compares"
                   % (base_schema.get("format"), schema.get("format")))
    return checks


def _label_drift(checks, base_stats, stats, base_schema, schema):
    def frequencies(stats_, schema_):
        histogram = (stats_ or {}).get("class_histogram") or {}
        names = schema_.get("class_names") or []
        counts = {}
        for split in ("train", "eval"):
            for c, n in enumerate(histogram.get(split) or []):
                name = names[c] if c < len(names) else str(c)
                counts[name] = counts.get(name, 0) + n
        return counts
    base, night = frequencies(base_stats, base_schema), frequencies(stats, schema)
    if not sum(base.values()) or not sum(night.values()):
        checks.skip(None, "label_drift", "a data set has no class histogram")
        return
    distance, name, b, t = linf(_shares(base), _shares(night))
    detail = "class %r moved most: %.3f -> %.3f" % (name, b, t) if name is not None else "no class moved"
    if not checks.measure(None, "label_drift", distance, detail):
        checks.distributions["(label)"] = _categorical_plot(_shares(base), _shares(night), "class frequency")


def _row_count(checks, base_schema, schema):
    base, night = _rows(base_schema), _rows(schema)
    low, high = float(checks.settings["min_row_ratio"]), float(checks.settings["max_row_ratio"])
    if not base:
        checks.skip(None, "row_count", "the baseline data set counts no rows")
        return
    ratio = night / float(base)
    checks.add(None, "row_count", round(ratio, 6), [low, high], low <= ratio <= high,
               "%d rows tonight, %d in the baseline (x%.3f; allowed x%s .. x%s)" % (night, base, ratio, low, high))


def _columns(checks, base_schema, base_stats, schema, stats):
    base_features, features = _features(base_schema), _features(schema)
    ignored = set(schema.get("ignored") or [])
    base_summaries = (base_stats or {}).get("features") or {}
    summaries = (stats or {}).get("features") or {}
    for name, base_feature in base_features.items():
        if name not in features:
            if name not in ignored:
                checks.add(name, "column_missing", None, None, False,
                           "the baseline has column %r (%s), tonight's data set does not"
                           % (name, base_feature.get("type")))
            continue
        feature = features[name]
        old, new = _kind(base_feature.get("type", "float")), _kind(feature.get("type", "float"))
        if old != new:
            checks.add(name, "type_changed", "%s -> %s" % (base_feature.get("type"), feature.get("type")),
                       None, False, "column %r was %s in the baseline, is %s tonight"
                       % (name, base_feature.get("type"), feature.get("type")))
            continue
        if checks.skips(name):
            checks.skip(name, "drift and missing_increase", "validation.columns[%r].skip is true" % name)
            continue
        _missing_increase(checks, name, base_feature, feature, base_schema, schema)
        if new == "categorical":
            _categorical_drift(checks, name, base_summaries.get(name), summaries.get(name))
        else:
            _numeric_drift(checks, name, base_summaries.get(name), summaries.get(name))
    for name, feature in features.items():
        if name not in base_features:
            checks.add(name, "column_new", feature.get("type"), None, False,
                       "column %r (%s) is new: the baseline data set has no such column"
                       % (name, feature.get("type")))


def _missing_increase(checks, name, base_feature, feature, base_schema, schema):
    shares = []
    for feat, schema_ in ((base_feature, base_schema), (feature, schema)):
        missing = (feat.get("missing") or {}).get("train")
        rows = ((schema_.get("counts") or {}).get("train")) or 0
        shares.append(None if missing is None or not rows else missing / float(rows))
    if None in shares:
        checks.skip(name, "missing_increase", "a schema.json records no missing count of the column "
                                              "(made before prep counted them)")
        return
    checks.measure(name, "missing_increase", shares[1] - shares[0],
                   "missing train cells: %.1f%% in the baseline, %.1f%% tonight"
                   % (100 * shares[0], 100 * shares[1]))


def _numeric_drift(checks, name, base_summary, summary):
    base, night = (profile.from_json((s or {}).get("histogram")) for s in (base_summary, summary))
    if base is None or night is None:
        which = "the baseline's" if base is None else "tonight's"
        checks.skip(name, "numeric_drift", "%s stats.json has no histogram of the column on the scale "
                                           "%s (made before prep profiled columns)" % (which, profile.SCALE))
        return
    if not sum(base.values()) or not sum(night.values()):
        checks.skip(name, "numeric_drift", "no value of the column in %s train split"
                    % ("the baseline's" if not sum(base.values()) else "tonight's"))
        return
    base_counts, night_counts, labels = numeric_groups(base, night)
    value = js_divergence(base_counts, night_counts)
    low, high = min(base), max(base)
    outside = sum(c for b, c in night.items() if b < low or b > high) / float(sum(night.values()))
    detail = "Jensen-Shannon divergence over %d groups of equal baseline mass" % len(labels)
    means = [(s or {}).get("mean") for s in (base_summary, summary)]
    if None not in means:
        detail += "; mean %.4g -> %.4g" % tuple(means)
    if outside:
        detail += "; %.1f%% of tonight's values outside the baseline's range" % (100 * outside)
    if not checks.measure(name, "numeric_drift", value, detail):
        total_b, total_t = float(sum(base_counts)), float(sum(night_counts))
        checks.distributions[name] = {"kind": "numeric", "labels": labels,
                                      "baseline": [c / total_b for c in base_counts],
                                      "tonight": [c / total_t for c in night_counts],
                                      "ylabel": "share of the column's values"}


def _categorical_drift(checks, name, base_summary, summary):
    base, night = value_counts(base_summary), value_counts(summary)
    if base is None or night is None:
        which = "the baseline's" if base is None else "tonight's"
        checks.skip(name, "categorical_drift", "%s stats.json has no value frequencies of the column "
                                               "(made before prep profiled columns)" % which)
        return
    hashed = [bool(((s or {}).get("frequencies") or {}).get("hashed")) for s in (base_summary, summary)]
    if hashed[0] != hashed[1]:
        checks.skip(name, "categorical_drift", "the column is %s in the baseline and %s tonight: its "
                    "frequencies do not compare" % tuple("hashed" if h else "a vocabulary" for h in hashed))
        return
    if not sum(base.values()) or not sum(night.values()):
        checks.skip(name, "categorical_drift", "no value of the column in %s train split"
                    % ("the baseline's" if not sum(base.values()) else "tonight's"))
        return
    base, night = _shares(base), _shares(night)
    distance, value, b, t = linf(base, night)
    detail = ("%s moved most: %.3f -> %.3f" % (_show(value) if not hashed[0] else value, b, t)
              if value is not None or distance else "no value moved")
    if not checks.measure(name, "categorical_drift", distance, detail):
        checks.distributions[name] = _categorical_plot(base, night, "share of the column's values")


def _categorical_plot(base, night, ylabel):
    top = sorted(set(base) | set(night), key=lambda k: -max(base.get(k, 0.0), night.get(k, 0.0)))[:PLOT_VALUES]
    return {"kind": "categorical", "labels": ["(other values)" if k is OTHER else str(k) for k in top],
            "baseline": [base.get(k, 0.0) for k in top], "tonight": [night.get(k, 0.0) for k in top],
            "ylabel": ylabel}


# --- without a baseline: the config -------------------------------------------------------------

def check_config(config, schema, checks):
    """Hold the data set against ``data.columns``: each named column that is not ``ignore`` exists
    with that type."""
    features = _features(schema)
    for name, kind in sorted((config["data"].get("columns") or {}).items()):
        if kind == "ignore" or schema.get("format") not in contract.TABULAR_FORMATS:
            continue
        if name not in features:
            checks.add(name, "column_missing", None, None, False,
                       "data.columns types column %r %s, the data set has no such feature" % (name, kind))
        elif features[name].get("type") not in CONFIG_TYPES.get(kind, (kind,)):
            checks.add(name, "type_changed", "%s -> %s" % (kind, features[name].get("type")), None, False,
                       "data.columns types column %r %s, the data set has it %s"
                       % (name, kind, features[name].get("type")))


def check_override_names(settings, schema, checks):
    """A warning for each ``validation.columns`` key that names no feature, with a did-you-mean."""
    names = sorted(_features(schema))
    for key in sorted(settings.get("columns") or {}):
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            checks.warnings.append(
                "validation.columns[%r]: no feature of the data set has that name%s. Fix: use one of %s"
                % (key, " (did you mean %r?)" % close[0] if close else "", ", ".join(names) or "(none)"))


# --- decision, summary, message -----------------------------------------------------------------

def decide(anomalies, settings):
    """``passed``, ``accepted``, ``warned`` or ``rejected``."""
    if not anomalies:
        return "passed"
    if settings["accept_data_change"]:
        return "accepted"
    return "warned" if settings["on_anomaly"] == "warn" else "rejected"


def _format(value):
    if isinstance(value, float):
        return "%.4g" % value
    if isinstance(value, list):
        return "[%s]" % ", ".join(_format(v) for v in value)
    return str(value)


def anomaly_text(record):
    """One anomaly in words: column, measure, value, threshold and what moved."""
    where = "column %r" % record["column"] if record["column"] is not None else "data set"
    if record["threshold"] is None:
        return "%s: %s (%s)" % (where, record["check"], record["detail"])
    if isinstance(record["threshold"], list):
        limit = "outside %s" % _format(record["threshold"])
    else:
        limit = "above %s" % _format(record["threshold"])
    return "%s: %s %s %s (%s)" % (where, record["check"], _format(record["value"]), limit, record["detail"])


def rejection_message(anomalies, baseline, path):
    """The message of :class:`DataRejected`: every anomaly, then how to go on."""
    measures = []
    for record in anomalies:
        if record["check"] in COLUMN_MEASURES or record["check"] == "label_drift":
            if record["check"] not in measures:
                measures.append(record["check"])
    raise_text = ""
    if measures:
        per_column = [m for m in measures if m in COLUMN_MEASURES]
        raise_text = ", or raise %s%s" % (
            " / ".join("validation." + m for m in measures),
            " (validation.columns.<column> for one column)" if per_column else "")
    if any(r["check"] == "row_count" for r in anomalies):
        raise_text += ", or widen validation.min_row_ratio / validation.max_row_ratio"
    against = "the production data set (version %s, %s)" % (baseline["version"], baseline["fingerprint"]) \
        if baseline else "the config (no blessed model yet)"
    return ("data rejected: %d anomal%s against %s: %s. Fix: if the upstream data is wrong, correct it and "
            "clear the run; if the change is real, trigger the run with accept_data_change: true (its data "
            "becomes the baseline once its model is blessed)%s. Details: %s"
            % (len(anomalies), "y" if len(anomalies) == 1 else "ies", against,
               "; ".join(anomaly_text(r) for r in anomalies), raise_text, path))


def dataset_summary(schema, stats):
    """``{"fingerprint", "rows", "columns": {name: {missing, distinct, min, max, mean}}}``: the
    figures a data-quality record of the data set needs (min, max and mean of the train split)."""
    summaries = (stats or {}).get("features") or {}
    columns = {}
    for name, feature in _features(schema).items():
        summary = summaries.get(name) or {}
        missing = feature.get("missing") or {}
        columns[name] = {"missing": int(sum(missing.values())) if missing else summary.get("missing"),
                         "distinct": summary.get("distinct"), "min": summary.get("min"),
                         "max": summary.get("max"),
                         "mean": summary.get("mean") if feature.get("type") != "categorical" else None}
    return {"fingerprint": schema.get("fingerprint"), "rows": _rows(schema), "columns": columns}


def _write_tfdv(run_dir, schema, validation):
    """TFDV's ``schema.pbtxt`` and ``anomalies.pbtxt`` (:mod:`trainer.tfmd`); their folder, or None
    with a warning: an output for other tools never decides the gate."""
    try:
        from trainer import tfmd
        return tfmd.write(run_dir, schema, validation, anomaly_text)
    except Exception as error:  # noqa: BLE001 -- by design: like the report, best effort
        LOG.warning("TFDV-compatible output not written (%s: %s); the decision is not affected",
                    type(error).__name__, (str(error).strip().splitlines() or [""])[0][:300])
        return None


def _write_report(run_dir, config, validation, schema, stats):
    """The run report of a data check with anomalies; a failure is a warning, never the stage's."""
    try:
        written = report.write_data_check_report(run_dir, validation, config=config, schema=schema, stats=stats)
    except Exception as error:  # noqa: BLE001 -- by design: the report is best effort
        LOG.warning("data check report not written (%s: %s); the decision is not affected",
                    type(error).__name__, (str(error).strip().splitlines() or [""])[0][:300])
        return None
    LOG.info("data check report: %s (%d plots)", written["report"], written["plot_count"])
    return written["report"]


def run(config):
    """Run the validate stage; return its result (raise DataRejected when the data is refused)."""
    config = common.begin(config, "validate")
    run_dir = config["paths"]["run_dir"]
    settings = config["validation"]
    dataset_dir, schema, stats = common.load_dataset(config)
    fingerprint = schema.get("fingerprint") or os.path.basename(dataset_dir)
    baseline, reason = find_baseline(config, fingerprint)
    started = time.monotonic()
    checks = Checks(settings)
    same = baseline is not None and baseline["fingerprint"] == fingerprint
    if same:
        LOG.info("validate: tonight's data set is the production model's (version %d, %s): same data, passed",
                 baseline["version"], fingerprint)
    elif baseline is not None:
        base_schema = atomic.read_json(os.path.join(baseline["dataset_dir"], "schema.json")) or {}
        base_stats = atomic.read_json(os.path.join(baseline["dataset_dir"], "stats.json")) or {}
        checks = compare(base_schema, base_stats, schema, stats, settings)
        check_override_names(settings, schema, checks)
        LOG.info("validate: tonight's data set %s against production version %d's %s",
                 fingerprint, baseline["version"], baseline["fingerprint"])
    else:
        LOG.info("validate: %s; checking the data set against the config only", reason)
        check_config(config, schema, checks)
        check_override_names(settings, schema, checks)
    seconds = time.monotonic() - started
    anomalies = [r for r in checks.records if not r["ok"]]
    decision = decide(anomalies, settings)
    path = os.path.join(run_dir, contract.VALIDATION_FILE)
    for warning in checks.warnings:
        LOG.warning("validate: %s", warning)
    for item in checks.skipped:
        LOG.info("validate: not checked: %s of %s: %s", item["check"],
                 "column %r" % item["column"] if item["column"] is not None else "the data set", item["why"])
    for record in anomalies:
        LOG.warning("validate: anomaly: %s", anomaly_text(record))
    validation = {
        "decision": decision, "accepted": decision == "accepted", "same_data": same,
        "baseline": baseline, "no_baseline_reason": reason, "fingerprint": fingerprint,
        "checks": checks.records, "anomalies": anomalies, "skipped": checks.skipped,
        "warnings": checks.warnings, "distributions": checks.distributions,
        "settings": settings, "seconds": round(seconds, 4), "time": common.now_iso(),
        "run": {k: config["run"].get(k) for k in ("dag_id", "run_id", "task_id", "try_number")},
    }
    validation["tfdv"] = _write_tfdv(run_dir, schema, validation)
    atomic.write_json(path, validation)
    report_path = _write_report(run_dir, config, validation, schema, stats) if anomalies else None
    if not anomalies:
        report.remove_data_check_report(run_dir)
    LOG.info("validate: %s: %d check(s), %d anomal%s, %d not run, in %.3f s; %s", decision.upper(),
             len(checks.records), len(anomalies), "y" if len(anomalies) == 1 else "ies",
             len(checks.skipped), seconds, path)
    result = {"decision": decision, "accepted": decision == "accepted", "baseline": baseline,
              "no_baseline_reason": reason, "anomalies": anomalies,
              # every check, passed or not: the provider makes OpenLineage's data-quality assertions of them
              "checks": checks.records, "dataset": dataset_summary(schema, stats), "validation_path": path, "report": report_path}
    if decision == "accepted":
        LOG.warning("validate: ACCEPTED %d anomal%s (validation.accept_data_change): this run goes on, and its "
                    "data set becomes the baseline once its model is blessed",
                    len(anomalies), "y" if len(anomalies) == 1 else "ies")
    if decision == "rejected":
        raise DataRejected(rejection_message(anomalies, baseline, path), result)
    return result
