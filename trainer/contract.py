"""The contract between the Airflow side and the trainer container.

This one file is the single source of truth for both sides: the trainer imports it as
``trainer.contract`` inside the image, and the provider imports the very same file as
``tfpipe.contract`` (``provider/tfpipe/contract.py`` is a symbolic link to it). It must therefore
stay standard-library only and Python 3.8 compatible (the official TF 2.9 image runs 3.8).

Contract 1, the stage config: one JSON document per stage run, passed to the container in the
environment variable :data:`CONFIG_ENV` (never as a file on the worker: the Docker engine may be
on another host). :func:`validate_stage_config` checks its shape on both sides.

Contract 2, the exit code (:class:`ExitCode`) and the result line: a stage prints
``RESULT_PREFIX + json`` as its last result line; the operator returns that JSON through XCom.
"""

import json
import re

SCHEMA_VERSION = 1

#: Environment variable that carries the stage config JSON into the container.
CONFIG_ENV = "TFPIPE_CONFIG"

#: Prefix of the one stdout line that carries a stage's JSON result back to the operator.
RESULT_PREFIX = "TFPIPE_RESULT "

#: The pipeline's stages, in order; ``python -m trainer <stage>`` runs one. ``validate`` is the data
#: gate: it compares the data set prep wrote with the one the production model trained on.
STAGES = ("prep", "validate", "train", "evaluate", "export")
#: With ``data.shards`` above 1, prep is these two stages instead: one ``prep_shard`` task per
#: slice of the input files (its index in the config's :data:`SHARD_INDEX_KEY`), then
#: ``prep_merge``, which makes the one data set the later stages read.
SHARDED_PREP_STAGES = ("prep_shard", "prep_merge")
#: With a search space in ``tuning.space``, ``train`` is one mapped task per trial (the trial in the
#: config's :data:`TRIAL_KEY`), and ``select`` runs between train and evaluate: it picks the trial
#: with the best ``tuning.metric`` and makes its training output the run's.
SELECT_STAGE = "select"
#: Every stage the trainer runs.
RUNNABLE_STAGES = STAGES + SHARDED_PREP_STAGES + (SELECT_STAGE,)
#: Top-level key of a ``prep_shard`` config: which slice of the input files (0 .. shards - 1).
SHARD_INDEX_KEY = "shard_index"
#: Top-level key of a sweep trial's ``train`` config: ``{"index": k, "params": {setting: value}}``.
#: The config's ``training`` section already holds the trial's settings; ``params`` names them.
TRIAL_KEY = "trial"
#: Top-level key of the ``select`` config: every trial of the sweep, a list of ``{"index", "params"}``.
TRIALS_KEY = "trials"

#: Where the three volumes are mounted inside every stage container.
CONTAINER_DATA = "/data"
CONTAINER_WORK = "/work"
CONTAINER_MODELS = "/models"


# --- The stage config sections: the one home of every default, bound and choice -------------------
#
# Each field is a mapping with:
#   kind      "int", "number", "bool", "str", "str?" (string or null), "dict", "list?" (list or
#             null), "pair" (two integers);
#   default   the value when the field is not given (lists stand for tuples on the Airflow side);
#   minimum / maximum, exclusive_minimum / exclusive_maximum
#             bounds every reader enforces (for "pair": each item);
#   parse_maximum
#             a plausibility bound checked when a DAG is parsed and by the trigger form only: a
#             value above it is almost surely a typo (100000 epochs), or can never pass (a
#             threshold above 1 for metrics in [0, 1]); the trainer still runs with it;
#   choices   the allowed values;
#   override  "param": a run may override it from the trigger form (an Airflow Param of that
#             name) or ``dag_run.conf``; "conf": from ``dag_run.conf`` only; absent: never;
#   doc       one line for forms and docs.
# Structure checks that are not a default, bound or choice (the feature list, the custom-model
# reference, paths) stay with each reader.

#: Built-in model names (``training.model``); anything else is ``package.module:function``.
BUILTIN_MODELS = ("mlp", "cnn", "resnet50")
#: Metrics the blessing gate can use; all are "higher is better" and lie in [0, 1]. ``auc``: the
#: area under the ROC curve of each class against the rest, averaged over the classes (with two
#: classes, the usual AUC).
METRICS = ("accuracy", "macro_precision", "macro_recall", "macro_f1", "auc")
OPTIMIZERS = ("adam", "sgd", "rmsprop")
#: ``training.learning_rate_schedule``: ``constant``, or ``cosine``: from ``learning_rate`` down to 0
#: at the run's last step (Keras' ``CosineDecay`` of the optimizer's step).
LEARNING_RATE_SCHEDULES = ("constant", "cosine")
DATA_FORMATS = ("csv", "parquet", "images")
#: The formats of tables (rows of named columns): prep reads them into the same records, schema and
#: stats, and the ``mlp`` trains on them.
TABULAR_FORMATS = ("csv", "parquet")
FEATURE_TYPES = ("float", "int")
#: ``data.columns`` values: a CSV column's type, overriding what prep infers from the train split.
COLUMN_TYPES = ("numeric", "categorical", "boolean", "ignore")
#: ``data.na_values`` default: the cell texts (after stripping) that mean a missing value.
NA_VALUES = ("", "NA", "NaN", "null", "None")
#: ``training.cache``: where parsed training examples are kept between epochs. ``auto``: in memory
#: when they fit a budget derived from the container's memory limit, else in a file on the work
#: volume; ``memory``, ``file``: always there; ``none``: the shards are parsed again every epoch.
CACHE_MODES = ("auto", "memory", "file", "none")
#: ``training.early_stopping_monitor``: the per-epoch evaluation figure early stopping watches;
#: ``val_loss`` improves downwards, ``val_accuracy`` upwards.
EARLY_STOPPING_MONITORS = ("val_loss", "val_accuracy")
#: ``training.class_weight``: ``none``, or ``balanced``: each training example's loss is weighted
#: by ``train examples / (classes present x examples of its class)`` (scikit-learn's "balanced";
#: the weights average 1 over the training split), so a rare class counts as much as a common one.
CLASS_WEIGHTS = ("none", "balanced")
#: ``validation.on_anomaly``: ``fail`` stops the run before training (exit :attr:`ExitCode.DATA_REJECTED`),
#: ``warn`` records and reports the anomalies, then goes on.
ON_ANOMALY = ("fail", "warn")
#: The per-column override keys of ``validation.columns`` (each a field of the validation section, or
#: ``skip``: no drift or missing-rate check of that column).
COLUMN_CHECKS = ("numeric_drift", "categorical_drift", "missing_increase", "skip")
#: ``tuning.search``: ``grid`` runs every combination of the listed values; ``random`` draws
#: ``tuning.trials`` settings from the space with ``tuning.seed``.
SEARCHES = ("grid", "random")
#: ``tuning.metric``: the validation figure at a trial's final weights that picks the best trial:
#: ``val_accuracy`` is maximised, ``val_loss`` minimised.
TUNING_METRICS = ("val_accuracy", "val_loss")
#: Model names and other names that become directories and container names.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"

SECTIONS = {
    "data": {
        "path": {"kind": "str?", "default": None,
                 "doc": "file or directory relative to the data volume"},
        "format": {"kind": "str", "default": "csv", "choices": DATA_FORMATS,
                   "doc": "csv or parquet (tables: a file or a folder of *.csv or *.parquet files) or images "
                          "(one sub-folder per class)"},
        "label": {"kind": "str", "default": "label", "doc": "label column (tables)"},
        "classes": {"kind": "list?", "default": None,
                    "doc": "class names in class-id order, each written as the labels (or the image "
                           "sub-folders) name it; null = from the data: class ids 0..max, else the "
                           "sorted names. Declared, ids stay put when a night lacks a class, a label "
                           "outside the list is an error, and sharded prep takes names"},
        "features": {"kind": "list?", "default": None,
                     "doc": "feature columns as {name, type}; null = every other column, each typed as prep infers it"},
        "key": {"kind": "str?", "default": None,
                "doc": "column that identifies an example for the split; null = the row content"},
        "image_size": {"kind": "pair", "default": [32, 32], "minimum": 8, "maximum": 4096,
                       "doc": "[height, width] images are resized to"},
        "channels": {"kind": "int", "default": 1, "choices": (1, 3), "doc": "1 (grayscale) or 3 (RGB)"},
        "eval_fraction": {"kind": "number", "default": 0.2, "exclusive_minimum": 0, "exclusive_maximum": 1,
                          "doc": "share of examples held out for evaluation"},
        "split_seed": {"kind": "int", "default": 42, "doc": "salt of the split hash"},
        "shard_size": {"kind": "int", "default": 1000, "minimum": 1, "doc": "examples per TFRecord shard"},
        "shards": {"kind": "int", "default": 1, "minimum": 1, "parse_maximum": 1024,
                   "doc": "prep tasks (csv): 1 = one prep task; N = N mapped prep_shard tasks, each over "
                          "its slice of the input files, then a prep_merge task"},
        "columns": {"kind": "dict", "default": {},
                    "doc": "per-column type overrides (tables), column name -> numeric, categorical, boolean or "
                           "ignore; other columns get the type prep infers from the train split"},
        "na_values": {"kind": "list?", "default": list(NA_VALUES),
                      "doc": "cell texts that mean a missing value (tables; an empty cell, or a Parquet null, always does); "
                             "null = only empty cells"},
        "drop_missing_labels": {"kind": "bool", "default": False,
                                "doc": "drop (and count) rows whose label is missing instead of failing (tables)"},
        "max_vocabulary": {"kind": "int", "default": 1000, "minimum": 1, "parse_maximum": 1000000,
                           "doc": "most frequent values a text column keeps (tables); the rest share the "
                                  "out-of-vocabulary bucket"},
        "min_frequency": {"kind": "int", "default": 1, "minimum": 1,
                          "doc": "train-split count a text value needs to enter the vocabulary (tables)"},
        "hash_threshold": {"kind": "int", "default": 10000, "minimum": 1, "parse_maximum": 10000000,
                           "doc": "a text column with more distinct train values is hashed instead (tables)"},
        "hash_bins": {"kind": "int", "default": 1024, "minimum": 2, "parse_maximum": 1000000,
                      "doc": "buckets of a hashed text column (tables); one more holds missing values"},
        "window_days": {"kind": "int", "default": 0, "minimum": 0, "parse_maximum": 36600,
                        "doc": "read only the date partitions (data.path/<partition_key>=YYYY-MM-DD/) of the N whole "
                               "days (UTC) before the run's data interval end (tables); 0 = every table file under "
                               "data.path"},
        "partition_key": {"kind": "str", "default": "dt", "pattern": r"^[A-Za-z0-9_]+$",
                          "doc": "name of the date partition folders (<partition_key>=YYYY-MM-DD) a window reads"},
        "min_partitions": {"kind": "int", "default": 0, "minimum": 0,
                           "doc": "partitions a window needs; a missing one is an error below it (0 = every day "
                                  "of the window must be there)"},
    },
    "training": {
        "model": {"kind": "str", "default": "mlp", "override": "param",
                  "doc": "built-in model, or package.module:function on code_path"},
        "model_kwargs": {"kind": "dict", "default": {}, "doc": "extra keyword arguments of the model builder"},
        "code_path": {"kind": "str?", "default": None, "doc": "directory of a custom model's package"},
        "epochs": {"kind": "int", "default": 10, "minimum": 1, "parse_maximum": 100000, "override": "param",
                   "doc": "target number of epochs; a resumed run trains until it"},
        "batch_size": {"kind": "int", "default": 64, "minimum": 1, "parse_maximum": 65536, "override": "param",
                       "doc": "global batch size (split across GPUs)"},
        "learning_rate": {"kind": "number", "default": 0.001, "exclusive_minimum": 0, "parse_maximum": 10,
                          "override": "param",
                          "doc": "learning rate of the optimizer"},
        "optimizer": {"kind": "str", "default": "adam", "choices": OPTIMIZERS, "override": "param",
                      "doc": "optimizer of the training loop"},
        "learning_rate_schedule": {"kind": "str", "default": "constant", "choices": LEARNING_RATE_SCHEDULES,
                                   "doc": "constant, or cosine: decays from learning_rate to 0 over the "
                                          "run's epochs x steps per epoch"},
        "learning_rate_warmup_epochs": {"kind": "int", "default": 0, "minimum": 0,  # and < epochs: readers check
                                        "doc": "epochs whose steps ramp the rate linearly up to learning_rate "
                                               "before the schedule (0: none); fewer than epochs"},
        "seed": {"kind": "int", "default": 42, "minimum": 0, "override": "param",
                 "doc": "random seed: weight initialisation, and the data order (epoch e is shuffled with seed + e)"},
        "checkpoint_every_steps": {"kind": "int", "default": 100, "minimum": 0, "override": "conf",
                                   "doc": "also checkpoint every N steps (0: epoch ends only)"},
        "keep_checkpoints": {"kind": "int", "default": 3, "minimum": 1, "doc": "checkpoints kept"},
        "steps_per_loop": {"kind": "int", "default": 0, "minimum": 0, "maximum": 10000,
                           "doc": "training steps per compiled call (0: automatic, about 0.5 s of "
                                  "training per call); checkpoints, SIGTERM and NaN checks still land "
                                  "on their exact steps"},
        "mixed_precision": {"kind": "bool", "default": False, "override": "param",
                            "doc": "train with the mixed_float16 policy (float16 compute, float32 weights)"},
        "cache": {"kind": "str", "default": "auto", "choices": CACHE_MODES,
                  "doc": "where parsed examples are kept between epochs: auto (memory when they fit the "
                         "container's memory budget, else a file on the work volume), memory, file or none"},
        "shuffle_buffer": {"kind": "int", "default": 10000, "minimum": 1, "doc": "shuffle buffer in examples"},
        "warm_start": {"kind": "bool", "default": False, "override": "param",
                       "doc": "initialise from the newest blessed model instead of from scratch"},
        "early_stopping_patience": {"kind": "int", "default": 0, "minimum": 0, "parse_maximum": 100000,
                                    "override": "conf",
                                    "doc": "stop once early_stopping_monitor has not improved for this many "
                                           "epochs; the final weights are then the best epoch's (0: off)"},
        "early_stopping_monitor": {"kind": "str", "default": "val_loss", "choices": EARLY_STOPPING_MONITORS,
                                   "doc": "what early stopping watches: val_loss (lower is better) or "
                                          "val_accuracy (higher is better)"},
        "early_stopping_min_delta": {"kind": "number", "default": 0, "minimum": 0, "parse_maximum": 1000,
                                     "doc": "smallest change of early_stopping_monitor that counts as an "
                                            "improvement"},
        "gradient_clip_norm": {"kind": "number", "default": 0, "minimum": 0, "parse_maximum": 1000000,
                               "override": "conf",
                               "doc": "clip each step's gradients to this global norm, over all weights and "
                                      "the whole batch (0: off)"},
        "class_weight": {"kind": "str", "default": "none", "choices": CLASS_WEIGHTS,
                         "doc": "none, or balanced: weight each training example's loss by the inverse "
                                "frequency of its class in the training split"},
    },
    "evaluation": {
        "metric": {"kind": "str", "default": "accuracy", "choices": METRICS, "override": "param",
                   "doc": "metric of the blessing gate (higher is better)"},
        "threshold": {"kind": "number", "default": 0.9, "minimum": 0, "parse_maximum": 1, "override": "param",
                      "doc": "absolute minimum of the metric for a blessing"},
        "tolerance": {"kind": "number", "default": 0.01, "minimum": 0, "parse_maximum": 1,
                      "doc": "how much worse than the baseline (the newest exported version trained on the "
                             "same classes) a candidate may be, both scored on this run's eval split"},
        "slices": {"kind": "list?", "default": None,
                   "doc": "columns whose values slice the eval split (tables): a text or yes/no column's name, or "
                          "{column, buckets: [ascending edges]} for a numeric one; metrics per slice value, for "
                          "the candidate and the baseline"},
        "slice_floor": {"kind": "number", "default": 0, "minimum": 0, "parse_maximum": 1,
                        "doc": "the gate's metric every slice with at least slice_min_rows eval rows must reach "
                               "for a blessing (0: no floor)"},
        "slice_min_rows": {"kind": "int", "default": 30, "minimum": 1,
                           "doc": "eval rows a slice needs for its floor to count"},
    },
    "validation": {
        "on_anomaly": {"kind": "str", "default": "fail", "choices": ON_ANOMALY,
                       "doc": "fail: an anomaly stops the run before training (the production model stays); "
                              "warn: anomalies are recorded and reported, and the run goes on"},
        "accept_data_change": {"kind": "bool", "default": False, "override": "param",
                               "doc": "let this run go on despite data anomalies (a real change): the run "
                                      "records that it accepted them, and its data set becomes the next "
                                      "baseline if its model is blessed"},
        "numeric_drift": {"kind": "number", "default": 0.1, "minimum": 0, "parse_maximum": 1,
                          "doc": "largest Jensen-Shannon divergence (base 2, 0..1) between a numeric column's "
                                 "histogram and the production data set's"},
        "categorical_drift": {"kind": "number", "default": 0.1, "minimum": 0, "parse_maximum": 1,
                              "doc": "largest L-infinity distance between a text column's value frequencies "
                                     "and the production data set's"},
        "label_drift": {"kind": "number", "default": 0.1, "minimum": 0, "parse_maximum": 1,
                        "doc": "largest L-infinity distance between the class frequencies and the production "
                               "data set's"},
        "missing_increase": {"kind": "number", "default": 0.1, "minimum": 0, "parse_maximum": 1,
                             "doc": "largest rise of a column's share of missing values over the production "
                                    "data set's"},
        "min_row_ratio": {"kind": "number", "default": 0.5, "minimum": 0, "maximum": 1,
                          "doc": "fewest rows, as a multiple of the production data set's rows"},
        "max_row_ratio": {"kind": "number", "default": 2.0, "minimum": 1,
                          "doc": "most rows, as a multiple of the production data set's rows"},
        "columns": {"kind": "dict", "default": {},
                    "doc": "per-column overrides, column name -> {numeric_drift, categorical_drift, "
                           "missing_increase, skip}"},
    },
    "tuning": {
        "space": {"kind": "dict", "default": {},
                  "doc": "the search space: a training setting (or model_kwargs.<name>) -> a list of values, or "
                         "{low, high} for a range (log: true for a log range; whole numbers for an integer "
                         "setting); empty = no sweep, one train task"},
        "search": {"kind": "str", "default": "random", "choices": SEARCHES,
                   "doc": "grid: every combination of the listed values (lists only); random: tuning.trials "
                          "draws from the space, seeded"},
        "trials": {"kind": "int", "default": 4, "minimum": 1, "parse_maximum": 1000,
                   "doc": "trials of a random search (a grid runs every combination)"},
        "parallel": {"kind": "int", "default": 1, "minimum": 1,
                     "doc": "trials that train at once (in the GPU pool, when one is named)"},
        "seed": {"kind": "int", "default": 0, "minimum": 0, "doc": "seed of the random search"},
        "metric": {"kind": "str", "default": "val_accuracy", "choices": TUNING_METRICS,
                   "doc": "what picks the best trial, at its final weights on the eval split: val_accuracy "
                          "(maximised) or val_loss (minimised)"},
    },
    "export": {
        "model_name": {"kind": "str", "default": "model", "pattern": NAME_PATTERN,
                       "doc": "directory under the models volume (TF Serving's model name)"},
        "keep_versions": {"kind": "int", "default": 5, "minimum": 1, "doc": "versions kept"},
    },
}


def section_defaults(section):
    """A fresh mapping of every field of ``section`` to its default (lists and dicts copied)."""
    return {name: json.loads(json.dumps(spec["default"])) for name, spec in SECTIONS[section].items()}


def overridable(kinds=("param", "conf")):
    """``{field: section}`` of the fields a run may override (names are unique across sections)."""
    found = {}
    for section, fields in SECTIONS.items():
        for name, spec in fields.items():
            if spec.get("override") in kinds:
                found[name] = section
    return found


# --- The run directory: file names both sides read ----------------------------------------------

#: Under the run dir: the resolved config of each stage (``config/<stage>.json``).
CONFIG_DIR = "config"
#: Under the run dir: training state, keyed by the run, never by the try.
CHECKPOINTS_SUBDIR = "train/checkpoints"
TENSORBOARD_SUBDIR = "train/tensorboard"
FINAL_SUBDIR = "train/final"
METRICS_FILE = "metrics.json"
ATTEMPTS_FILE = "attempts.json"
EVALUATION_FILE = "evaluation.json"
BLESSING_FILE = "blessing.json"
#: The data gate's findings (the validate stage): checks, anomalies, baseline, decision.
VALIDATION_FILE = "validation.json"
#: Under the run dir: one directory per sweep trial (:func:`training_dir`), laid out as a run dir's
#: training state (``train/checkpoints``, ``train/final``, ``metrics.json``, ``attempts.json``).
TRIALS_DIR = "trials"
#: The select stage's choice: the metric, every trial's settings and result, and the chosen one.
SELECTION_FILE = "selection.json"
#: The run report, next to ``evaluation.json`` (and in ``<version>/report/`` of an export).
REPORT_FILE = "report.html"


def training_dir(run_directory, trial=None):
    """Where training keeps its state: the run dir, or a sweep trial's own dir under it."""
    if trial is None:
        return run_directory
    return "%s/%s/trial-%d" % (run_directory, TRIALS_DIR, trial)


def tensorboard_dir(run_directory, trial=None):
    """TensorBoard's event dir of a run; a trial's is a sub-dir of it, so one TensorBoard shows every trial."""
    path = "%s/%s" % (run_directory, TENSORBOARD_SUBDIR)
    return path if trial is None else "%s/trial-%d" % (path, trial)


def stage_config_path(run_directory, stage):
    """Where a stage records its resolved config inside ``run_directory``."""
    return "%s/%s/%s.json" % (run_directory, CONFIG_DIR, stage)


class ExitCode:
    """Exit codes of ``python -m trainer <stage>`` and what the operator does with them.

    Any code not listed here (1 for an unexpected error, 137 for a kill, ...) is a transient
    failure that Airflow retries; training then resumes from its last checkpoint.
    """

    OK = 0
    #: evaluate: the candidate did not pass the blessing gate; export is skipped, the run succeeds.
    NOT_BLESSED = 10
    #: bad data or a bad config: retrying cannot fix it, so the task fails without retrying.
    BAD_INPUT = 11
    #: training produced a NaN or infinite loss: fails without retrying, nothing is exported.
    DIVERGED = 12
    #: a directory the stage writes (:func:`writable_dirs`) is missing and cannot be made, or is
    #: not writable by the stage's user: checked before the stage starts, so nothing was written.
    #: The Docker operator then prepares the run's directories and starts the stage once more;
    #: where no one prepares them, the task fails without retrying.
    DIRS_NOT_READY = 13
    #: validate: tonight's data differs from the production model's data beyond the thresholds of the
    #: validation section; the run stops before training and is not retried.
    DATA_REJECTED = 14
    #: killed (SIGKILL: docker kill, the out-of-memory killer): retried like any unlisted code.
    KILLED = 137

    NO_RETRY = (BAD_INPUT, DIVERGED, DIRS_NOT_READY, DATA_REJECTED)

    #: What usually resolves each code (the docs' exit-code reference is generated from it).
    FIXES = {
        OK: "",
        NOT_BLESSED: "Nothing, when the candidate is worse: the current model stays. If good models are refused, "
                     "compare evaluation.metric, threshold and tolerance with the run report.",
        BAD_INPUT: "Read the end of the task log: it names the field, file or line. Correct the data or the "
                   "pipeline config, then clear the task.",
        DIVERGED: "Lower training.learning_rate, set training.gradient_clip_norm or a warm-up "
                  "(training.learning_rate_warmup_epochs), and look for extreme or missing values in the data.",
        DIRS_NOT_READY: "Make the work and models volumes writable by resources.user, or let tfpipe prepare them "
                        "(the Docker backend always does; Kubernetes: kubernetes.prepare_volumes).",
        DATA_REJECTED: "Read the task log or the run report: they name each column, measure, value and threshold. "
                       "Fix the upstream data and clear the run; or, when the change is real, trigger the run "
                       "again with accept_data_change: true (or raise that measure in the validation section).",
        KILLED: "Usually the out-of-memory killer: raise resources.mem_limit or lower training.batch_size. The "
                "task is retried and training resumes from its last checkpoint.",
        143: "The container was stopped (docker stop, a task timeout, a cleared or marked task); training "
             "checkpoints first. The task is retried and training resumes from that checkpoint.",
    }

    @classmethod
    def describe(cls, code):
        """A short human-readable meaning of an exit code."""
        return {
            cls.OK: "success",
            cls.NOT_BLESSED: "candidate not blessed",
            cls.BAD_INPUT: "bad input or config",
            cls.DIVERGED: "training diverged (NaN/inf loss)",
            cls.DIRS_NOT_READY: "a directory it writes is not writable by its user",
            cls.DATA_REJECTED: "data rejected by the data gate",
            cls.KILLED: "killed (SIGKILL: docker kill, or the out-of-memory killer)",
            143: "terminated (SIGTERM)",
        }.get(code, "failed")


class ContractError(ValueError):
    """A stage config does not follow the contract."""


# A string, compiled by ``re`` (and cached) on first use: importing the contract is part of every DAG
# file's parse, which never needs it.
_SAFE = r"[^A-Za-z0-9._-]+"


def safe_name(value, max_len=80):
    """A filesystem- and Docker-name-safe form of ``value`` (run ids hold ':' and '+')."""
    cleaned = re.sub(_SAFE, "_", str(value)).strip("._-") or "x"
    return cleaned[:max_len]


def run_dir(dag_id, run_id):
    """The run directory inside the container: keyed by DAG run, never by try."""
    return "%s/runs/%s/%s" % (CONTAINER_WORK, safe_name(dag_id), safe_name(run_id, 120))


_REQUIRED = {
    "schema_version": int,
    "stage": str,
    "run": dict,
    "paths": dict,
}
_RUN_KEYS = ("dag_id", "run_id", "task_id", "try_number")
#: Optional key of the config's ``run`` section: where a date window ends (``data.window_days``), an
#: ISO 8601 UTC time: the run's data interval end, or the time a run without one was triggered.
WINDOW_END_KEY = "data_interval_end"
_PATH_KEYS = ("data", "work", "models", "run_dir")


def writable_dirs(stage, run_directory, model_name, work=CONTAINER_WORK, models=CONTAINER_MODELS):
    """The directories ``stage`` writes, each of which must exist and be writable by its user.

    The trainer checks them before a stage starts (exit :attr:`ExitCode.DIRS_NOT_READY` if one is
    not ready); the operator's helper container makes every stage's ones ready for a run. The DAG's
    runs directory (the run dir's parent) is among them: writable by the stages' user, it lets the
    first stage of a later run make its new run dir itself. ``work`` and ``models``: where those
    volumes are mounted (the container's paths, unless a test mounts them elsewhere).
    """
    dirs = [work + "/cache", work + "/cache/cuda", run_directory.rstrip("/").rsplit("/", 1)[0], run_directory]
    if stage in ("prep", "prep_merge"):
        dirs.append(work + "/datasets")
    if stage == "export":
        dirs.append(models + "/" + model_name)
    return tuple(dirs)


def validate_stage_config(config):
    """Check the shape of a stage config and return it; raise :class:`ContractError` if wrong.

    Only the envelope is checked here; each stage validates its own section with messages that
    name the field.
    """
    if not isinstance(config, dict):
        raise ContractError("stage config must be a JSON object, got %s" % type(config).__name__)
    for key, kind in _REQUIRED.items():
        if key not in config:
            raise ContractError("stage config is missing %r" % key)
        if not isinstance(config[key], kind):
            raise ContractError("stage config %r must be a %s" % (key, kind.__name__))
    if config["schema_version"] != SCHEMA_VERSION:
        raise ContractError(
            "stage config schema_version %r is not supported by this trainer (expects %d): "
            "build the trainer image from the same tfpipe version as the provider"
            % (config["schema_version"], SCHEMA_VERSION)
        )
    if config["stage"] not in RUNNABLE_STAGES:
        raise ContractError("stage %r is not one of %s" % (config["stage"], ", ".join(RUNNABLE_STAGES)))
    for key in _RUN_KEYS:
        if key not in config["run"]:
            raise ContractError("stage config run.%s is missing" % key)
    for key in _PATH_KEYS:
        if not isinstance(config["paths"].get(key), str):
            raise ContractError("stage config paths.%s is missing or not a string" % key)
    section = config.get(config["stage"], {})
    if not isinstance(section, dict):
        raise ContractError("stage config %r section must be an object" % config["stage"])
    return config


def dumps(config):
    """Serialize a stage config (stable key order, so identical configs compare equal)."""
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def parse_result_line(lines):
    """Return the JSON result from a container's output lines (newest result line wins)."""
    for line in reversed(list(lines)):
        text = line.decode("utf-8", "replace") if isinstance(line, bytes) else str(line)
        text = text.strip()
        if text.startswith(RESULT_PREFIX):
            return json.loads(text[len(RESULT_PREFIX):])
    return None
