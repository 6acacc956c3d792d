"""Slices of the eval split: metrics per value of the columns ``evaluation.slices`` names.

A slice spec is a column name (a text column: one slice per value, ``""`` being missing; a yes/no
column: true, false and missing) or ``{"column", "buckets": [e1, ..., en]}`` for a numeric column
(``< e1``, ``[e1, e2)``, ..., ``>= en``, and missing). The values come from the eval records, in
prep's layout: numeric and yes/no columns as floats in ``features`` (NaN: missing), text columns as
strings in ``categories`` (``""``: missing).

A slice value is ``None`` when missing, else its text (the category, ``true``/``false``, or the
bucket's range). Only values that occur in the eval split are listed. With
``evaluation.slice_floor`` above 0, each value with at least ``evaluation.slice_min_rows`` rows
must reach the floor on the gate's metric (:func:`below_floor`).

No TensorFlow here: the evaluate stage passes the metrics function in.
"""

import difflib

import numpy as np

from trainer import contract
from trainer.errors import BadInput

#: How a missing slice value reads in reasons and the report.
MISSING_TEXT = "(missing)"


def _fail(field, problem, fix):
    raise BadInput("%s: %s. Fix: %s." % (field, problem, fix))


def resolve(slices, schema):
    """The specs of ``evaluation.slices`` against this run's schema: ``[{"column", "kind" (text,
    boolean or numeric), "buckets" (or None), "source" (features or categories), "index"}]``.

    Raises :class:`~trainer.errors.BadInput` naming the field and the fix for an unknown column,
    buckets on a text or yes/no column, a numeric column without buckets, or slices of images.
    """
    if not slices:
        return []
    if schema["format"] not in contract.TABULAR_FORMATS:
        _fail("evaluation.slices", "this run's data is images, which have no columns to slice by",
              "remove evaluation.slices")
    numeric = [f for f in schema["features"] if f.get("type") != "categorical"]
    texts = [f for f in schema["features"] if f.get("type") == "categorical"]
    where = {f["name"]: ("features", i, f.get("type", "float")) for i, f in enumerate(numeric)}
    where.update({f["name"]: ("categories", i, "categorical") for i, f in enumerate(texts)})
    specs = []
    for i, item in enumerate(slices):
        field = "evaluation.slices[%d]" % i
        column, buckets = (item, None) if isinstance(item, str) else (item.get("column"), item.get("buckets"))
        if column not in where:
            close = difflib.get_close_matches(str(column), list(where), n=1)
            _fail(field, "no feature column %r in this run's data%s" % (
                column, " (did you mean %r?)" % close[0] if close else ""),
                "name one of %s" % ", ".join(map(repr, sorted(where))))
        source, index, kind = where[column]
        kind = {"categorical": "text", "boolean": "boolean"}.get(kind, "numeric")
        if kind != "numeric" and buckets is not None:
            _fail(field + ".buckets", "%r is a %s column; buckets cut numeric columns" % (
                column, "text" if kind == "text" else "yes/no"), "name the column alone: %r" % column)
        if kind == "numeric" and buckets is None:
            _fail(field, "%r is a numeric column: its slices need bucket edges" % column,
                  "write {\"column\": %r, \"buckets\": [ascending edges]}" % column)
        specs.append({"column": column, "kind": kind, "buckets": None if buckets is None else
                      [float(e) for e in buckets], "source": source, "index": index})
    return specs


def column_values(spec, x):
    """The raw values of ``spec``'s column in a batch of eval inputs ``x`` (as :mod:`trainer.data`
    parses them: a dict of ``features``/``categories``, or the ``features`` array alone)."""
    array = x[spec["source"]] if isinstance(x, dict) else x
    values = np.asarray(array)[:, spec["index"]]
    if spec["source"] == "categories":
        return np.array([v.decode("utf-8") if isinstance(v, bytes) else v for v in values], dtype=object)
    return values.astype(np.float64)


def _edge(value):
    return "%g" % value


def bucket_names(buckets):
    """The names of the ranges ``buckets`` cut: ``< e1``, ``[e1, e2)``, ..., ``>= en``."""
    names = ["< %s" % _edge(buckets[0])]
    names += ["[%s, %s)" % (_edge(a), _edge(b)) for a, b in zip(buckets, buckets[1:])]
    return names + [">= %s" % _edge(buckets[-1])]


def slice_values(spec, values):
    """``(names, codes)``: the slice value names in display order (missing, ``None``, last) and,
    per row of ``values``, the index of its name."""
    if spec["kind"] == "text":
        present = sorted(set(values) - {""})
        names = present + ([None] if "" in set(values) else [])
        lookup = {name: i for i, name in enumerate(names)}
        return names, np.array([lookup[v if v != "" else None] for v in values], dtype=np.int64)
    missing = np.isnan(values)
    if spec["kind"] == "boolean":
        names, codes = ["false", "true", None], np.where(values > 0.5, 1, 0)
    else:
        names = bucket_names(spec["buckets"])
        codes = np.searchsorted(np.asarray(spec["buckets"]), np.where(missing, 0.0, values), side="right")
        names = names + [None]
    codes = np.where(missing, len(names) - 1, codes)
    return names, codes.astype(np.int64)


def table(specs, columns, labels, candidate, production, measure):
    """One entry per slice value that occurs: ``{"column", "value", "rows", "candidate",
    "production"}``, the last two ``measure(logits, labels)`` of the rows (production None when
    ``production`` logits are None). ``columns`` holds each spec's raw values, in ``specs`` order."""
    entries = []
    for spec, values in zip(specs, columns):
        names, codes = slice_values(spec, values)
        for code, name in enumerate(names):
            rows = codes == code
            count = int(rows.sum())
            if not count:
                continue
            entries.append({"column": spec["column"], "value": name, "rows": count,
                            "candidate": measure(candidate[rows], labels[rows]),
                            "production": None if production is None else measure(production[rows], labels[rows])})
    return entries


def slice_name(entry):
    """``column=value`` (the missing value as ``(missing)``)."""
    value = entry["value"]
    return "%s=%s" % (entry["column"], MISSING_TEXT if value is None else value)


def below_floor(entries, metric, floor, min_rows):
    """The entries with at least ``min_rows`` rows whose candidate ``metric`` is below ``floor``
    (none when ``floor`` is 0; a metric undefined on a slice, such as the AUC of a one-class slice,
    never counts)."""
    if not floor:
        return []
    return [e for e in entries if e["rows"] >= min_rows and e["candidate"].get(metric) is not None
            and e["candidate"][metric] < floor]


def floor_reason(failures, metric, floor):
    """The reason a blessing is refused for slices below the floor, naming each."""
    return "; ".join("slice %s: %s %.4f on %d eval rows is below the slice floor %.4f"
                     % (slice_name(e), metric, e["candidate"][metric], e["rows"], floor) for e in failures)
