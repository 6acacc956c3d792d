"""Shared fixtures of the in-image trainer tests: small real data sets and stage configs.

Everything is written under pytest's ``tmp_path``: ``data/`` (read-only input in production),
``work/`` (datasets and run directories) and ``models/``.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

from trainer import contract

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pytest_configure(config):
    for name, text in (
            ("integration", "runs several stages or the CLI end to end"),
            ("resume", "checkpoint / resume behaviour of the train stage"),
            ("gcs", "needs Google Cloud Storage (not run in the offline image)"),
            ("reliability", "failure injection: corrupt files, kills, aborted exports"),
            ("gpu", "needs a GPU")):
        config.addinivalue_line("markers", "%s: %s" % (name, text))


def write_blobs_csv(path, rows=300, classes=3, features=4, seed=0, string_labels=False,
                    spread=0.6):
    """Write a learnable CSV: ``classes`` gaussian blobs in ``features`` dimensions.

    Columns ``f0..f{n-1}`` (raw, un-normalised scales) and ``label`` (int ids, or names).
    Returns ``(features_matrix, labels)``.
    """
    import numpy as np

    rng = np.random.RandomState(seed)
    centers = rng.uniform(-4, 4, size=(classes, features))
    labels = np.arange(rows) % classes
    x = centers[labels] + rng.normal(scale=spread, size=(rows, features))
    x = x * np.arange(1, features + 1) * 10.0 + 100.0  # different scales and offsets
    names = ["cat", "dog", "eel", "fox", "gnu"]
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(",".join(["f%d" % i for i in range(features)] + ["label"]) + "\n")
        for row, label in zip(x, labels):
            value = names[label] if string_labels else str(label)
            handle.write(",".join("%.5f" % v for v in row) + "," + value + "\n")
    return x, labels


#: The text categories of :func:`write_mixed_csv`'s ``plan`` column and how each moves the label.
PLANS = {"basic": 2.0, "standard": 0.0, "premium": -2.0}


def write_mixed_csv(path, rows=400, seed=0, plans=PLANS):
    """Write a learnable churn-like CSV with text categories, booleans and empty cells.

    Columns: ``customer_id`` (unique text), ``tenure`` (numeric, every 7th empty), ``monthly``
    (numeric, every 11th ``NA``), ``plan`` (a key of ``plans``, every 13th empty), ``autopay``
    (yes/no), ``zip`` (five digits, of 6 values), ``churn`` (0/1: mostly decided by the plan and
    the tenure). Returns the rows as dicts of the cell texts.
    """
    import numpy as np

    rng = np.random.RandomState(seed)
    names = sorted(plans)
    out = []
    for i in range(rows):
        plan = names[rng.randint(len(names))]
        tenure = rng.uniform(0, 60)
        monthly = rng.uniform(20, 120)
        autopay = rng.rand() < 0.5
        score = plans[plan] - (tenure - 30) / 10.0 + (0.5 if not autopay else -0.5) + rng.normal(scale=0.5)
        out.append({"customer_id": "c%05d" % i, "tenure": "" if i % 7 == 3 else "%.2f" % tenure,
                    "monthly": "NA" if i % 11 == 5 else "%.2f" % monthly,
                    "plan": "" if i % 13 == 6 else plan, "autopay": "yes" if autopay else "no",
                    "zip": "%05d" % (10001 + rng.randint(6)), "churn": "1" if score > 0 else "0"})
    os.makedirs(os.path.dirname(path), exist_ok=True)
    header = ["customer_id", "tenure", "monthly", "plan", "autopay", "zip", "churn"]
    with open(path, "w") as handle:
        handle.write(",".join(header) + "\n")
        for row in out:
            handle.write(",".join(row[c] for c in header) + "\n")
    return out


def make_image(kind, size, rng, mode="RGB"):
    """A PIL image of class ``kind``: "bright_left", "bright_top" or "dark" plus noise."""
    import numpy as np
    from PIL import Image

    w, h = size
    pixels = rng.randint(0, 60, size=(h, w, 3)).astype(np.uint8)
    if kind == "bright_left":
        pixels[:, : w // 2] += 150
    elif kind == "bright_top":
        pixels[: h // 2, :] += 150
    image = Image.fromarray(pixels, "RGB")
    return image.convert(mode)


def write_image_folder(root, classes=("bright_left", "bright_top"), per_class=15, seed=0,
                       size=(20, 20)):
    """Write an image-folder data set (one sub-folder per class), PNG and JPEG mixed.

    Images have odd sizes around ``size`` so prep has to resize them.
    """
    import numpy as np

    rng = np.random.RandomState(seed)
    for kind in classes:
        os.makedirs(os.path.join(root, kind), exist_ok=True)
        for i in range(per_class):
            dims = (size[0] + i % 3, size[1] + (i % 2) * 4)
            image = make_image(kind, dims, rng, mode="L" if i % 4 == 0 else "RGB")
            ext = "jpg" if i % 3 == 0 else "png"
            image.save(os.path.join(root, kind, "%s_%03d.%s" % (kind, i, ext)))
    return root


# A user's model module: a layer class of its own, a Python lambda closing over data-set
# statistics and a Dense size from model_kwargs, none of which a Keras config could rebuild.
# The layer's call branches in Python on a tensor, which only autograph turns into a graph: the
# train step and the serving signature must trace it with autograph on, and the export must make
# no trace of it with autograph off (Keras' own per-layer traces did).
USER_MODEL = """\
import tensorflow as tf


class Centre(tf.keras.layers.Layer):
    def __init__(self, mean, **kwargs):
        super(Centre, self).__init__(**kwargs)
        self.mean = tf.constant(mean, tf.float32)

    def call(self, inputs):
        if tf.reduce_any(tf.math.is_nan(inputs)):
            inputs = tf.where(tf.math.is_nan(inputs), tf.zeros_like(inputs), inputs)
        return inputs - self.mean


def build(input_spec, num_classes, stats, units=4):
    inputs = tf.keras.Input(shape=input_spec['shape'], name='features')
    mean = [stats['features'][n]['mean'] for n in input_spec['feature_names']]
    x = Centre(mean)(inputs)
    x = tf.keras.layers.Lambda(lambda t: t / 100.0)(x)
    x = tf.keras.layers.Dense(units, activation='relu')(x)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(x))
"""


def write_user_model(data_root, package, module="tiny"):
    """Write :data:`USER_MODEL` as ``<data_root>/code/<package>/<module>.py``.

    Returns ``(code_dir, model)``: the package's parent (``training.code_path`` is ``"code"``) and
    the ``training.model`` name, ``package.module:build``. A package name no other test imports
    keeps one test's module out of another's ``sys.modules``.
    """
    code = os.path.join(data_root, "code")
    os.makedirs(os.path.join(code, package))
    open(os.path.join(code, package, "__init__.py"), "w").close()
    with open(os.path.join(code, package, module + ".py"), "w") as handle:
        handle.write(USER_MODEL)
    return code, "%s.%s:build" % (package, module)


class Workspace(object):
    """The three volumes of one test and a factory for stage configs."""

    def __init__(self, base, dag_id="tfpipe_test", run_id="manual__2026-11-29T18:00:00+00:00"):
        self.base = str(base)
        self.data = os.path.join(self.base, "data")
        self.work = os.path.join(self.base, "work")
        self.models = os.path.join(self.base, "models")
        for path in (self.data, self.work, self.models):
            os.makedirs(path, exist_ok=True)
        self.dag_id, self.run_id = dag_id, run_id

    def run_dir(self, run_id=None):
        """The run directory of ``run_id``: contract.run_dir, moved under this work volume."""
        in_container = contract.run_dir(self.dag_id, run_id or self.run_id)
        return os.path.join(self.work, os.path.relpath(in_container, contract.CONTAINER_WORK))

    def config(self, stage, run_id=None, try_number=1, data=None, training=None,
               evaluation=None, export=None):
        """A complete stage config with small, fast defaults; sections are merged."""
        run_id = run_id or self.run_id
        config = {
            "schema_version": contract.SCHEMA_VERSION, "stage": stage,
            "run": {"dag_id": self.dag_id, "run_id": run_id, "task_id": stage,
                    "try_number": try_number, "image": "tfpipe/trainer:test"},
            "paths": {"data": self.data, "work": self.work, "models": self.models,
                      "run_dir": self.run_dir(run_id)},
            "data": {"format": "csv", "path": "blobs.csv", "label": "label",
                     "eval_fraction": 0.2, "split_seed": 42, "shard_size": 100},
            "training": {"model": "mlp", "epochs": 3, "batch_size": 32, "learning_rate": 0.01,
                         "optimizer": "adam", "seed": 7, "checkpoint_every_steps": 0,
                         "keep_checkpoints": 3, "shuffle_buffer": 1000},
            "evaluation": {"metric": "accuracy", "threshold": 0.8, "tolerance": 0.01},
            "export": {"model_name": "blobs", "keep_versions": 3},
        }
        for name, section in (("data", data), ("training", training),
                              ("evaluation", evaluation), ("export", export)):
            if section:
                config[name].update(section)
        return config

    def trial_config(self, trial, try_number=1, training=None, run_id=None):
        """The train config of sweep trial ``trial`` (``{"index", "params"}``) as a sweep writes it:
        the trial's settings merged into ``training`` (``model_kwargs.<name>`` into its
        ``model_kwargs``), and the trial itself under ``contract.TRIAL_KEY``."""
        settings = dict(training or {})
        for name, value in trial["params"].items():
            if name.startswith("model_kwargs."):
                settings["model_kwargs"] = dict(settings.get("model_kwargs") or {}, **{name[len("model_kwargs."):]: value})
            else:
                settings[name] = value
        config = self.config("train", run_id=run_id, try_number=try_number, training=settings)
        config[contract.TRIAL_KEY] = trial
        return config

    def select_config(self, trials, metric="val_accuracy", search="grid", try_number=1, run_id=None):
        """The select config of a sweep over ``trials``."""
        config = self.config(contract.SELECT_STAGE, run_id=run_id, try_number=try_number)
        config["tuning"] = {"metric": metric, "search": search}
        config[contract.TRIALS_KEY] = trials
        return config

    def read(self, *parts, run_id=None):
        """Load a JSON file of the run directory."""
        with open(os.path.join(self.run_dir(run_id), *parts)) as handle:
            return json.load(handle)

    def visible(self, *parts):
        """Visible (non-hidden) entries of a directory under the workspace, sorted."""
        path = os.path.join(self.base, *parts)
        if not os.path.isdir(path):
            return []
        return sorted(n for n in os.listdir(path) if not n.startswith("."))


@pytest.fixture
def ws(tmp_path):
    """A fresh workspace with a 300-row, 3-class blobs CSV at data/blobs.csv."""
    workspace = Workspace(tmp_path)
    write_blobs_csv(os.path.join(workspace.data, "blobs.csv"))
    return workspace


@pytest.fixture(scope="session")
def trained_template(tmp_path_factory):
    """A workspace where prep and train (mlp, 3 epochs) already ran; copy it, don't modify it."""
    from trainer import prep, train

    workspace = Workspace(tmp_path_factory.mktemp("trained"))
    write_blobs_csv(os.path.join(workspace.data, "blobs.csv"))
    prep.run(workspace.config("prep"))
    train.run(workspace.config("train"))
    return workspace


def _copy(template, tmp_path):
    target = tmp_path / "ws"
    shutil.copytree(template.base, str(target))
    return Workspace(target)


@pytest.fixture
def trained(trained_template, tmp_path):
    """A private copy of :func:`trained_template` (prep + train done) in this test's tmp_path."""
    return _copy(trained_template, tmp_path)


#: The two trials of :func:`swept_template`: models of different shapes, so a later stage that built
#: the DAG's model instead of the chosen trial's could not load its weights.
SWEEP_TRIALS = [{"index": 0, "params": {"model_kwargs.hidden_units": [8]}},
                {"index": 1, "params": {"model_kwargs.hidden_units": [24, 12]}}]


@pytest.fixture(scope="session")
def swept_template(tmp_path_factory):
    """A workspace where prep and the two trials of :data:`SWEEP_TRIALS` (mlp, 2 epochs) already ran;
    copy it, don't modify it."""
    from trainer import prep, train

    workspace = Workspace(tmp_path_factory.mktemp("swept"))
    write_blobs_csv(os.path.join(workspace.data, "blobs.csv"))
    prep.run(workspace.config("prep"))
    for trial in SWEEP_TRIALS:
        train.run(workspace.trial_config(trial, training={"epochs": 2}))
    return workspace


@pytest.fixture
def swept(swept_template, tmp_path):
    """A private copy of :func:`swept_template` (prep and both trials done) in this test's tmp_path."""
    return _copy(swept_template, tmp_path)


def run_cli(stage, config=None, env=None, args=(), timeout=300, stdin=None):
    """Run ``python3 -m trainer <stage>`` with the config in $TFPIPE_CONFIG (or ``stdin``)."""
    environ = dict(os.environ)
    environ["PYTHONPATH"] = REPO + os.pathsep + environ.get("PYTHONPATH", "")
    environ.pop(contract.CONFIG_ENV, None)
    if config is not None:
        environ[contract.CONFIG_ENV] = json.dumps(config)
    environ.update(env or {})
    return subprocess.run([sys.executable, "-m", "trainer", stage] + list(args), env=environ,
                          input=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=timeout)


@pytest.fixture
def cli():
    """The :func:`run_cli` helper."""
    return run_cli


@pytest.fixture
def without_tensorflow(tmp_path):
    """Environment for :func:`run_cli` in which ``import tensorflow`` fails.

    A ``tensorflow`` package that raises goes first on the path, so a stage that still imported
    TensorFlow anywhere would fail, not just run slower. Checked here: the block itself works.
    """
    blocker = tmp_path / "block-tensorflow"
    (blocker / "tensorflow").mkdir(parents=True)
    (blocker / "tensorflow" / "__init__.py").write_text("raise ImportError('blocked: this stage imported tensorflow')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker), REPO, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", "import tensorflow"], env=dict(os.environ, **env),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert proc.returncode == 1 and "blocked: this stage imported tensorflow" in proc.stderr, proc.stderr
    return env
