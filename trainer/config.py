"""Resolution and validation of the stage config sections (``data``, ``training``, ...).

:func:`trainer.contract.validate_stage_config` checks the envelope; :func:`resolve` fills every
section with its defaults and checks each field, raising :class:`~trainer.errors.BadInput` with
the field's full name (``training.epochs``) and what was expected. Unknown keys are rejected so a
typo never silently falls back to a default.
"""

import copy
import re

from trainer import contract
from trainer.errors import BadInput

# kinds: "int", "float" (int or float), "bool", "str", "str?" (str or null), "dict", "any"
_SECTIONS = {
    "data": {
        "format": ("str", "csv"),
        "path": ("str?", None),
        "label": ("str", "label"),
        "features": ("any", None),
        "key": ("str?", None),
        "image_size": ("any", [32, 32]),
        "channels": ("int", 1),
        "eval_fraction": ("float", 0.2),
        "split_seed": ("int", 42),
        "shard_size": ("int", 1000),
    },
    "training": {
        "model": ("str", "mlp"),
        "model_kwargs": ("dict", {}),
        "code_path": ("str?", None),
        "epochs": ("int", 10),
        "batch_size": ("int", 64),
        "learning_rate": ("float", 0.001),
        "optimizer": ("str", "adam"),
        "seed": ("int", 42),
        "checkpoint_every_steps": ("int", 50),
        "keep_checkpoints": ("int", 3),
        "mixed_precision": ("bool", False),
        "cache": ("bool", True),
        "shuffle_buffer": ("int", 10000),
        "warm_start": ("bool", False),
    },
    "evaluation": {
        "metric": ("str", "accuracy"),
        "threshold": ("float", 0.0),
        "tolerance": ("float", 0.0),
    },
    "export": {
        "model_name": ("str", "model"),
        "keep_versions": ("int", 5),
    },
}

FORMATS = ("csv", "images")
OPTIMIZERS = ("adam", "sgd", "rmsprop")
#: Metrics the blessing gate can use; all are "higher is better".
METRICS = ("accuracy", "macro_precision", "macro_recall", "macro_f1")
FEATURE_TYPES = ("float", "int")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _check_kind(field, value, kind):
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "str?": value is None or isinstance(value, str),
        "dict": isinstance(value, dict),
        "any": True,
    }[kind]
    if not ok:
        expected = {"str?": "a string or null", "dict": "an object", "int": "an integer",
                    "float": "a number", "bool": "true or false", "str": "a string"}[kind]
        raise BadInput("config field %s must be %s, got %r" % (field, expected, value))
    if kind == "float":
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
    spec = _SECTIONS[name]
    unknown = sorted(set(raw) - set(spec))
    if unknown:
        raise BadInput("config section %r has unknown key(s) %s; valid keys: %s"
                       % (name, ", ".join(unknown), ", ".join(sorted(spec))))
    out = {}
    for key, (kind, default) in spec.items():
        value = raw.get(key, copy.deepcopy(default))
        out[key] = _check_kind("%s.%s" % (name, key), value, kind)
    return out


def _require(condition, field, expected, value):
    if not condition:
        raise BadInput("config field %s must be %s, got %r" % (field, expected, value))


def _check_data(data):
    _require(data["format"] in FORMATS, "data.format", "one of " + ", ".join(FORMATS),
             data["format"])
    size = data["image_size"]
    _require(isinstance(size, list) and len(size) == 2
             and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size),
             "data.image_size", "[height, width] (two positive integers)", size)
    _require(data["channels"] in (1, 3), "data.channels", "1 or 3", data["channels"])
    _require(0.0 < data["eval_fraction"] < 1.0, "data.eval_fraction", "between 0 and 1",
             data["eval_fraction"])
    _require(data["shard_size"] >= 1, "data.shard_size", "at least 1", data["shard_size"])
    _require(data["label"] != "", "data.label", "a non-empty column name", data["label"])
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
            _require(kind in FEATURE_TYPES, field + ".type", "one of float, int", kind)
            _require(feat["name"] not in seen, field + ".name", "a unique feature name",
                     feat["name"])
            _require(feat["name"] not in (data["label"], data["key"]), field + ".name",
                     "not the label or key column", feat["name"])
            seen.add(feat["name"])
        data["features"] = [{"name": f["name"], "type": f.get("type", "float")}
                            for f in features]


def _check_training(training):
    _require(training["epochs"] >= 1, "training.epochs", "at least 1", training["epochs"])
    _require(training["batch_size"] >= 1, "training.batch_size", "at least 1",
             training["batch_size"])
    _require(training["learning_rate"] > 0, "training.learning_rate", "positive",
             training["learning_rate"])
    _require(training["optimizer"] in OPTIMIZERS, "training.optimizer",
             "one of " + ", ".join(OPTIMIZERS), training["optimizer"])
    _require(training["checkpoint_every_steps"] >= 0, "training.checkpoint_every_steps",
             "0 (epoch ends only) or more", training["checkpoint_every_steps"])
    _require(training["keep_checkpoints"] >= 1, "training.keep_checkpoints", "at least 1",
             training["keep_checkpoints"])
    _require(training["shuffle_buffer"] >= 1, "training.shuffle_buffer", "at least 1",
             training["shuffle_buffer"])
    _require(training["model"] != "", "training.model", "a model name", training["model"])


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
    for name in _SECTIONS:
        out[name] = _section(config, name)
    _check_data(out["data"])
    _check_training(out["training"])
    evaluation = out["evaluation"]
    _require(evaluation["metric"] in METRICS, "evaluation.metric",
             "one of " + ", ".join(METRICS), evaluation["metric"])
    _require(evaluation["tolerance"] >= 0, "evaluation.tolerance", "0 or more",
             evaluation["tolerance"])
    export = out["export"]
    _require(bool(_NAME.match(export["model_name"])), "export.model_name",
             "letters, digits, '.', '_' or '-' (not starting with '.')", export["model_name"])
    _require(export["keep_versions"] >= 1, "export.keep_versions", "at least 1",
             export["keep_versions"])
    try:
        out["run"]["try_number"] = int(out["run"]["try_number"])
    except (TypeError, ValueError):
        raise BadInput("config field run.try_number must be an integer, got %r"
                       % (out["run"]["try_number"],))
    return out
