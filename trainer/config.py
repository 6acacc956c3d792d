"""Resolution and validation of the stage config sections (``data``, ``training``, ...).

:func:`trainer.contract.validate_stage_config` checks the envelope; :func:`resolve` fills every
section with the defaults of the contract's schema (:data:`trainer.contract.SECTIONS`, which the
provider reads too; no default, bound or choice is defined here) and checks each field, raising
:class:`~trainer.errors.BadInput` with the field's full name (``training.epochs``) and what was
expected. Unknown keys are rejected so a
typo never silently falls back to a default.
"""

import copy
import difflib
import re

from trainer import contract
from trainer.errors import BadInput

def _check_kind(field, value, kind):
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "str?": value is None or isinstance(value, str),
        "dict": isinstance(value, dict),
        # lists are checked item by item below (data.features, data.image_size)
        "list?": True,
        "pair": True,
    }[kind]
    if not ok:
        expected = {"str?": "a string or null", "dict": "an object", "int": "an integer",
                    "number": "a number", "bool": "true or false", "str": "a string"}[kind]
        raise BadInput("config field %s must be %s, got %r" % (field, expected, value))
    if kind == "number":
        value = float(value)
        if value != value or value in (float("inf"), float("-inf")):
            raise BadInput("config field %s must be a finite number, got %r" % (field, value))
    return value


def _section(config, name):
    raw = config.get(name)
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadInput("config section %r must be an object, got %r" % (name, raw))
    fields = contract.SECTIONS[name]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise BadInput("config section %r has unknown key(s) %s; valid keys: %s"
                       % (name, ", ".join(unknown), ", ".join(sorted(fields))))
    defaults = contract.section_defaults(name)
    out = {}
    for key, spec in fields.items():
        field = "%s.%s" % (name, key)
        value = _check_kind(field, raw[key] if key in raw else defaults[key], spec["kind"])
        if spec["kind"] != "pair":
            _check_rules(field, value, spec)
        out[key] = value
    return out


def _bounds_text(spec):
    parts = []
    if "minimum" in spec:
        parts.append("at least %s" % spec["minimum"])
    if "exclusive_minimum" in spec:
        parts.append("above %s" % spec["exclusive_minimum"])
    if "maximum" in spec:
        parts.append("at most %s" % spec["maximum"])
    if "exclusive_maximum" in spec:
        parts.append("below %s" % spec["exclusive_maximum"])
    return " and ".join(parts)


def in_bounds(value, spec):
    """Whether ``value`` keeps the contract bounds of ``spec`` (not ``parse_maximum``: the trainer
    runs with implausible values a DAG file would be refused for)."""
    return not (("minimum" in spec and value < spec["minimum"])
                or ("maximum" in spec and value > spec["maximum"])
                or ("exclusive_minimum" in spec and value <= spec["exclusive_minimum"])
                or ("exclusive_maximum" in spec and value >= spec["exclusive_maximum"]))


def _check_rules(field, value, spec):
    """The contract's choices, pattern and bounds of one field."""
    if value is None:
        return
    if "choices" in spec:
        _require(value in spec["choices"], field,
                 "one of " + ", ".join(str(c) for c in spec["choices"]), value)
    if "pattern" in spec:
        _require(bool(re.match(spec["pattern"], value)), field,
                 "letters, digits, '.', '_' or '-' (not starting with '.')", value)
    if spec["kind"] in ("int", "number"):
        _require(in_bounds(value, spec), field, _bounds_text(spec), value)


def _require(condition, field, expected, value):
    if not condition:
        raise BadInput("config field %s must be %s, got %r" % (field, expected, value))


def _check_data(data):
    size, spec = data["image_size"], contract.SECTIONS["data"]["image_size"]
    _require(isinstance(size, list) and len(size) == 2
             and all(isinstance(v, int) and not isinstance(v, bool) and in_bounds(v, spec) for v in size),
             "data.image_size", "[height, width] (two integers, each %s)" % _bounds_text(spec), size)
    _require(data["label"] != "", "data.label", "a non-empty column name", data["label"])
    classes = data["classes"]
    if classes is not None:
        _require(isinstance(classes, list) and len(classes) >= 2, "data.classes",
                 "null or a list of at least two class names", classes)
        for i, name in enumerate(classes):
            # labels are compared after stripping, as prep reads them
            _require(isinstance(name, str) and name and name == name.strip(), "data.classes[%d]" % i,
                     "a non-empty class name without leading or trailing spaces", name)
        seen = set()
        twice = sorted({name for name in classes if name in seen or seen.add(name)})
        _require(not twice, "data.classes", "a list of distinct names (%s repeated)" % ", ".join(map(repr, twice)),
                 classes)
    for name, kind in sorted(data["columns"].items()):
        _require(kind in contract.COLUMN_TYPES, "data.columns[%r]" % name,
                 "one of " + ", ".join(contract.COLUMN_TYPES), kind)
    na_values = data["na_values"]
    if na_values is not None:
        for i, text in enumerate(na_values):
            _require(isinstance(text, str), "data.na_values[%d]" % i, "a string (a cell text)", text)
    features = data["features"]
    if features is not None:
        _require(isinstance(features, list) and features, "data.features",
                 "null or a non-empty list of {\"name\", \"type\"} objects", features)
        seen = set()
        for i, feat in enumerate(features):
            field = "data.features[%d]" % i
            _require(isinstance(feat, dict) and isinstance(feat.get("name"), str)
                     and feat.get("name"), field, "an object with a non-empty \"name\"", feat)
            unknown = sorted(set(feat) - {"name", "type"})
            _require(not unknown, field, "only the keys name and type", feat)
            kind = feat.get("type", "float")
            _require(kind in contract.FEATURE_TYPES, field + ".type", "one of " + ", ".join(contract.FEATURE_TYPES),
                     kind)
            _require(feat["name"] not in seen, field + ".name", "a unique feature name",
                     feat["name"])
            _require(feat["name"] not in (data["label"], data["key"]), field + ".name",
                     "not the label or key column", feat["name"])
            seen.add(feat["name"])
        data["features"] = [{"name": f["name"], "type": f.get("type", "float")}
                            for f in features]


def _check_training(training):
    _require(training["model"] != "", "training.model", "a model name", training["model"])
    # a run's conf may lower epochs below the DAG file's warm-up: the stage must say so too
    warmup, epochs = training["learning_rate_warmup_epochs"], training["epochs"]
    _require(warmup < epochs or not warmup, "training.learning_rate_warmup_epochs",
             "fewer than training.epochs (%d): lower the warm-up or train more epochs" % epochs, warmup)


def _check_evaluation(evaluation):
    """``evaluation.slices``: null or a list of column names and ``{column, buckets}`` objects with
    ascending numeric edges (whether the columns exist is checked against the data set's schema)."""
    slices = evaluation["slices"]
    if slices is None:
        return

    def fail(field, problem, fix):
        raise BadInput("%s: %s. Fix: %s." % (field, problem, fix))
    if not isinstance(slices, list):
        fail("evaluation.slices", "must be a list of columns, got %r" % (slices,),
             "e.g. [\"plan\", {\"column\": \"tenure\", \"buckets\": [12, 24]}]")
    for i, item in enumerate(slices):
        field = "evaluation.slices[%d]" % i
        if isinstance(item, str) and item:
            continue
        if not isinstance(item, dict):
            fail(field, "must be a column name or {column, buckets}, got %r" % (item,),
                 "name a text or yes/no column, or give a numeric column with its bucket edges")
        unknown = sorted(set(item) - {"column", "buckets"})
        if unknown:
            close = difflib.get_close_matches(unknown[0], ["column", "buckets"], n=1)
            fail("%s.%s" % (field, unknown[0]), "unknown key%s" % (" (did you mean %r?)" % close[0] if close else ""),
                 "use column and buckets")
        if not isinstance(item.get("column"), str) or not item.get("column"):
            fail(field + ".column", "must be a column name, got %r" % (item.get("column"),),
                 "name the numeric column the buckets cut")
        edges = item.get("buckets")
        if (not isinstance(edges, list) or not edges
                or any(isinstance(e, bool) or not isinstance(e, (int, float)) or e != e for e in edges)
                or any(b <= a for a, b in zip(edges, edges[1:]))):
            fail(field + ".buckets", "must be ascending numbers, got %r" % (edges,),
                 "give the bucket edges in ascending order, e.g. [12, 24, 48]")


def _check_validation(validation):
    """``validation.columns``: per column, only the keys of :data:`contract.COLUMN_CHECKS`, each a
    threshold within its section field's bounds (``skip``: true or false)."""
    fields = contract.SECTIONS["validation"]
    for column, override in sorted(validation["columns"].items()):
        field = "validation.columns[%r]" % column
        _require(isinstance(override, dict), field,
                 "an object of %s" % ", ".join(contract.COLUMN_CHECKS), override)
        for key, value in sorted(override.items()):
            if key not in contract.COLUMN_CHECKS:
                close = difflib.get_close_matches(key, contract.COLUMN_CHECKS, n=1)
                raise BadInput("%s.%s: not a per-column check%s. Fix: use %s"
                               % (field, key, " (did you mean %r?)" % close[0] if close else "",
                                  ", ".join(contract.COLUMN_CHECKS)))
            if key == "skip":
                _check_kind("%s.%s" % (field, key), value, "bool")
            else:
                _check_rules("%s.%s" % (field, key), _check_kind("%s.%s" % (field, key), value, "number"),
                             fields[key])


#: How a malformed sweep key is put right: the provider writes them, so a mismatch means two versions.
_SWEEP_FIX = ("tfpipe's sweep writes it as {\"index\": k, \"params\": {setting: value}}; build the trainer "
              "image from the same tfpipe version as the provider")


def _check_trial(trial, field):
    """One sweep trial, ``{"index": k, "params": {setting: value}}`` (``k`` a whole number >= 0)."""
    def fail(where, problem):
        raise BadInput("%s: %s. Fix: %s." % (where, problem, _SWEEP_FIX))
    if not isinstance(trial, dict):
        fail(field, "must be an object {index, params}, got %r" % (trial,))
    unknown = sorted(set(trial) - {"index", "params"})
    if unknown:
        close = difflib.get_close_matches(unknown[0], ["index", "params"], n=1)
        fail("%s.%s" % (field, unknown[0]), "unknown key%s" % (" (did you mean %r?)" % close[0] if close else ""))
    index = trial.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or index < 0:
        fail(field + ".index", "must be a whole number, at least 0, got %r" % (index,))
    if not isinstance(trial.get("params"), dict):
        fail(field + ".params", "must be an object of setting -> value, got %r" % (trial.get("params"),))


def _check_trials(trials):
    """The select stage's list of every trial: each as :func:`_check_trial`, indexes distinct."""
    key = contract.TRIALS_KEY
    if not isinstance(trials, list) or not trials:
        raise BadInput("%s: must be a non-empty list of {index, params}, got %r. Fix: %s."
                       % (key, trials, _SWEEP_FIX))
    seen = set()
    for i, trial in enumerate(trials):
        _check_trial(trial, "%s[%d]" % (key, i))
        if trial["index"] in seen:
            raise BadInput("%s[%d].index: trial %d is listed twice. Fix: %s."
                           % (key, i, trial["index"], _SWEEP_FIX))
        seen.add(trial["index"])


def trial_index(config):
    """The sweep trial a train config runs (the index in its :data:`~trainer.contract.TRIAL_KEY`),
    or None for a plain train."""
    trial = config.get(contract.TRIAL_KEY)
    return None if trial is None else trial["index"]


def resolve(config):
    """Return a copy of ``config`` with every section filled with defaults and validated.

    The envelope (``run``, ``paths``, ``stage``) must already have passed
    :func:`trainer.contract.validate_stage_config`. Raises ``BadInput`` naming the field.
    """
    try:
        contract.validate_stage_config(config)
    except contract.ContractError as error:
        raise BadInput(str(error))
    out = copy.deepcopy(config)
    for name in contract.SECTIONS:
        out[name] = _section(config, name)
    _check_data(out["data"])
    _check_training(out["training"])
    _check_evaluation(out["evaluation"])
    _check_validation(out["validation"])
    if contract.TRIAL_KEY in config:
        _check_trial(config[contract.TRIAL_KEY], contract.TRIAL_KEY)
    if contract.TRIALS_KEY in config:
        _check_trials(config[contract.TRIALS_KEY])
    try:
        out["run"]["try_number"] = int(out["run"]["try_number"])
    except (TypeError, ValueError):
        raise BadInput("config field run.try_number must be an integer, got %r"
                       % (out["run"]["try_number"],))
    return out
