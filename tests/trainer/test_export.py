"""The export stage: SavedModel on raw inputs, atomic publication, retention, idempotency."""

import csv
import glob
import json
import os
import shutil
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow as tf  # noqa: E402

from conftest import SWEEP_TRIALS, write_image_folder, write_user_model  # noqa: E402
from trainer import common, contract, evaluate, export, prep, select, train  # noqa: E402
from trainer import config as config_mod  # noqa: E402
from trainer.evaluate import load_final_model  # noqa: E402
from trainer.errors import BadInput, NotBlessed  # noqa: E402


def entries(ws, name="blobs"):
    """Every entry of the model root, hidden ones included."""
    path = os.path.join(ws.models, name)
    return sorted(os.listdir(path)) if os.path.isdir(path) else []


def test_export_serves_raw_csv_features_after_a_fresh_load(trained):
    evaluate.run(trained.config("evaluate"))
    result = export.run(trained.config("export"))
    model_dir = os.path.join(trained.models, "blobs", "1")
    assert result == {"model_dir": model_dir, "version": 1, "model_name": "blobs",
                      "metrics": trained.read("evaluation.json")["metrics"],
                      "already_exported": False,
                      "report": os.path.join(model_dir, "report", "report.html")}
    assert entries(trained) == ["1"]
    meta = json.load(open(os.path.join(model_dir, "metadata.json")))
    assert (meta["dag_id"], meta["run_id"], meta["version"]) == (
        trained.dag_id, trained.run_id, 1)
    assert meta["data"]["fingerprint"] == trained.read("dataset.json")["fingerprint"]
    assert meta["image"]["reference"] == "tfpipe/trainer:test"
    assert meta["tensorflow_version"] == tf.__version__
    assert meta["hyperparameters"]["optimizer"] == "adam"
    assert [a["status"] for a in meta["attempts"]] == ["completed"]
    assert set(meta["signature"]["inputs"]) == {"f0", "f1", "f2", "f3"}
    assert meta["verification"]["max_abs_diff"] <= 1e-4
    assert os.path.exists(os.path.join(model_dir, "variables_ckpt", "model.index"))
    assert "selection" not in meta, "a run without a sweep has no selection"

    with open(os.path.join(trained.data, "blobs.csv")) as handle:
        rows = list(csv.DictReader(handle))[:40]
    loaded = tf.saved_model.load(model_dir)
    serve = loaded.signatures["serving_default"]
    raw = {"f%d" % i: tf.constant([float(r["f%d" % i]) for r in rows]) for i in range(4)}
    out = serve(**raw)
    labels = np.array([int(r["label"]) for r in rows])
    assert out["probabilities"].shape == (40, 3)
    np.testing.assert_allclose(out["probabilities"].numpy().sum(axis=1), 1.0, atol=1e-5)
    assert np.mean(out["class_id"].numpy() == labels) >= 0.9
    assert [n.decode() for n in out["class_name"].numpy()] == [
        str(i) for i in out["class_id"].numpy()]


@pytest.mark.integration
def test_an_export_after_a_sweep_is_the_chosen_trial_and_says_so(swept):
    """After select, evaluate and export build the chosen trial's model (its hidden layers, not the DAG's
    default mlp's, which its weights would not fit) from the weights select promoted; the version's
    metadata.json names the trial, its settings, the metric and its value, and how many trials ran."""
    chosen = select.run(swept.select_config(SWEEP_TRIALS))
    units = SWEEP_TRIALS[chosen["chosen"]]["params"]["model_kwargs.hidden_units"]
    evaluation = evaluate.run(swept.config("evaluate", evaluation={"threshold": 0.0}))
    assert swept.read("evaluation.json")["final"] == swept.read(
        contract.TRIALS_DIR, "trial-%d" % chosen["chosen"], "train", "final", "final.json")
    result = export.run(swept.config("export"))
    meta = json.load(open(os.path.join(result["model_dir"], "metadata.json")))
    assert meta["selection"] == {"trial": chosen["chosen"], "params": chosen["params"], "metric": "val_accuracy",
                                 "value": chosen["value"], "trials": 2}
    assert meta["hyperparameters"]["model_kwargs"] == {"hidden_units": units}
    assert meta["evaluation"]["metrics"] == evaluation["metrics"]
    assert [a["status"] for a in meta["attempts"]] == ["completed"]
    kernels = [shape for name, shape in tf.train.list_variables(os.path.join(result["model_dir"], "variables_ckpt", "model"))
               if "kernel" in name and "OPTIMIZER" not in name]
    assert sorted(shape[-1] for shape in kernels) == sorted(units + [3])


def test_a_declared_class_the_data_lacks_is_an_output_of_the_exported_model(ws):
    """``data.classes`` lists a class tonight's data has no example of: training, the blessing gate
    and the export go through, and the served model has one output per listed class, named so."""
    with open(os.path.join(ws.data, "blobs.csv")) as handle:
        text = handle.read().replace(",0\n", ",zero\n").replace(",1\n", ",one\n").replace(",2\n", ",two\n")
    with open(os.path.join(ws.data, "blobs.csv"), "w") as handle:
        handle.write(text)
    declared = {"classes": ["two", "none_tonight", "zero", "one"]}
    prep.run(ws.config("prep", data=declared))
    train.run(ws.config("train", data=declared, training={"epochs": 5, "class_weight": "balanced"}))
    evaluate.run(ws.config("evaluate", data=declared))
    result = export.run(ws.config("export", data=declared))
    meta = json.load(open(os.path.join(result["model_dir"], "metadata.json")))
    assert meta["data"]["class_names"] == declared["classes"]
    assert result["report"] and os.path.exists(result["report"]), "the run report is made with an empty class"
    with open(os.path.join(ws.data, "blobs.csv")) as handle:
        rows = list(csv.DictReader(handle))[:40]
    out = tf.saved_model.load(result["model_dir"]).signatures["serving_default"](
        **{"f%d" % i: tf.constant([float(r["f%d" % i]) for r in rows]) for i in range(4)})
    assert out["probabilities"].shape == (40, 4)
    names = [n.decode() for n in out["class_name"].numpy()]
    assert "none_tonight" not in names
    assert np.mean([name == r["label"] for name, r in zip(names, rows)]) >= 0.9


# Serving a version in a fresh interpreter that has TensorFlow and nothing of the user's code.
_SERVE_ELSEWHERE = r"""
import importlib.util, json, os, sys
import tensorflow as tf
request = json.load(sys.stdin)
assert importlib.util.find_spec(request["package"]) is None, "the user's code is importable"
serve = tf.saved_model.load(request["model_dir"]).signatures["serving_default"]
inputs = {name: [spec.dtype.name, spec.shape.as_list()]
          for name, spec in serve.structured_input_signature[1].items()}
out = serve(**{name: tf.constant(values, tf.float32)
               for name, values in request["features"].items()})
reader = tf.train.load_checkpoint(os.path.join(request["model_dir"], "variables", "variables"))
print(json.dumps({"inputs": inputs, "shapes": sorted(reader.get_variable_to_shape_map().values()),
                  "probabilities": out["probabilities"].numpy().tolist(),
                  "class_name": [n.decode() for n in out["class_name"].numpy()]}))
"""


def test_a_user_model_serves_raw_features_without_the_users_code(ws, tmp_path, monkeypatch):
    """A model built by the user's code (code_path + model_kwargs) is exported with the same
    raw-feature signature, and the SavedModel alone serves it: a fresh process without the code
    gets the in-memory model's probabilities."""
    monkeypatch.setattr(sys, "path", list(sys.path))  # code_path goes on sys.path: only here
    code, model_name = write_user_model(ws.data, "exportmodels")
    sections = {"training": {"model": model_name, "code_path": "code", "epochs": 2,
                             "model_kwargs": {"units": 6}},
                "evaluation": {"threshold": 0.0}}  # the signature is at stake, not accuracy
    prep.run(ws.config("prep", **sections))
    train.run(ws.config("train", **sections))
    evaluate.run(ws.config("evaluate", **sections))
    result = export.run(ws.config("export", **sections))
    meta = json.load(open(os.path.join(result["model_dir"], "metadata.json")))
    assert meta["hyperparameters"]["model"] == model_name
    assert set(meta["signature"]["inputs"]) == {"f0", "f1", "f2", "f3"}

    with open(os.path.join(ws.data, "blobs.csv")) as handle:
        rows = list(csv.DictReader(handle))[:20]
    features = {"f%d" % i: [float(r["f%d" % i]) for r in rows] for i in range(4)}
    config = config_mod.resolve(ws.config("export", **sections))
    _, schema, stats = common.load_dataset(config)
    model = load_final_model(config, schema, stats)
    x = np.array([features["f%d" % i] for i in range(4)], np.float32).T
    expected = tf.nn.softmax(model(x, training=False)).numpy()

    shutil.rmtree(code)
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE_ELSEWHERE], cwd=str(tmp_path),
        input=json.dumps({"model_dir": result["model_dir"], "package": "exportmodels",
                          "features": features}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    served = json.loads(proc.stdout.strip().splitlines()[-1])
    assert served["inputs"] == {"f%d" % i: ["float32", [None]] for i in range(4)}
    assert [4, 6] in served["shapes"]  # the Dense size model_kwargs asked for
    probabilities = np.array(served["probabilities"])
    assert probabilities.shape == (20, 3)
    np.testing.assert_allclose(probabilities, expected, atol=1e-4)
    assert served["class_name"] == [schema["class_names"][i]
                                    for i in probabilities.argmax(axis=1)]


def test_export_is_idempotent_for_the_same_run(trained, capsys):
    evaluate.run(trained.config("evaluate"))
    first = export.run(trained.config("export"))
    again = export.run(trained.config("export", try_number=2))
    assert again["version"] == first["version"] == 1 and again["already_exported"] is True
    assert again["report"] == first["report"] and os.path.isfile(first["report"])
    assert "already exported as version 1" in capsys.readouterr().out
    assert entries(trained) == ["1"]


def test_export_refuses_an_unblessed_candidate(trained):
    with pytest.raises(BadInput, match="blessing.json does not exist"):
        export.run(trained.config("export"))
    with pytest.raises(NotBlessed):  # no accuracy reaches 1.01: blessing.json says not blessed
        evaluate.run(trained.config("evaluate", evaluation={"threshold": 1.01}))
    with pytest.raises(BadInput, match="not blessed"):
        export.run(trained.config("export"))
    assert entries(trained) == []


@pytest.mark.reliability
def test_a_failure_mid_export_leaves_no_version_and_no_leftover(trained, monkeypatch):
    evaluate.run(trained.config("evaluate"))
    seen = {}

    def failing_check(path, module, x):
        seen["files"] = sorted(os.listdir(path))  # the SavedModel was really written
        raise export.ExportCheckFailed("injected: reloaded model differs")
    monkeypatch.setattr(export, "verify_reloaded", failing_check)
    with pytest.raises(export.ExportCheckFailed):
        export.run(trained.config("export"))
    assert "saved_model.pb" in seen["files"] and "variables_ckpt" in seen["files"]
    assert entries(trained) == []
    monkeypatch.undo()
    assert export.run(trained.config("export", try_number=2))["version"] == 1


@pytest.mark.reliability
def test_a_real_mismatch_fails_the_reload_check(trained, monkeypatch):
    evaluate.run(trained.config("evaluate"))
    original = export.ServingModule.raw_inputs

    def shifted(self, x):  # feed the reloaded model slightly different raw features
        raw = original(self, x)
        return {k: v + 5.0 for k, v in raw.items()}
    monkeypatch.setattr(export.ServingModule, "raw_inputs", shifted)
    with pytest.raises(export.ExportCheckFailed, match="differs from the trained model"):
        export.run(trained.config("export"))
    assert entries(trained) == []


def test_retention_versions_and_stale_temps(trained, monkeypatch):
    evaluate.run(trained.config("evaluate"))
    root = os.path.join(trained.models, "blobs")
    for n in range(2, 5):  # the same trained run dir under other run ids
        shutil.copytree(trained.run_dir(), trained.run_dir("run%d" % n))
    export.run(trained.config("export"))
    stale = os.path.join(root, ".tmp-stale")
    fresh = os.path.join(root, ".tmp-fresh")
    os.makedirs(stale)
    os.makedirs(fresh)
    os.utime(stale, (time.time() - 7200,) * 2)
    assert export.run(trained.config("export", run_id="run2"))["version"] == 2
    assert entries(trained) == [".tmp-fresh", "1", "2"]
    # a version that "appears meanwhile" is never overwritten: the next number is taken
    real = common.list_versions
    monkeypatch.setattr(common, "list_versions", lambda r: real(r)[:-1])
    assert export.run(trained.config("export", run_id="run3"))["version"] == 3
    monkeypatch.setattr(common, "list_versions", real)
    meta2 = json.load(open(os.path.join(root, "2", "metadata.json")))
    assert meta2["run_id"] == "run2" and meta2["version"] == 2
    result = export.run(trained.config("export", run_id="run4", export={"keep_versions": 2}))
    assert result["version"] == 4
    assert entries(trained) == [".tmp-fresh", "3", "4"]


@pytest.mark.integration
def test_image_model_serves_encoded_png_and_jpeg_bytes(ws):
    write_image_folder(os.path.join(ws.data, "imgs"), per_class=20)
    sections = {"data": {"format": "images", "path": "imgs", "image_size": [16, 16],
                         "channels": 1, "eval_fraction": 0.25},
                "training": {"model": "cnn", "epochs": 4, "batch_size": 8},
                "export": {"model_name": "shapes"}}
    prep.run(ws.config("prep", **sections))
    train.run(ws.config("train", **sections))
    evaluate.run(ws.config("evaluate", **sections))
    result = export.run(ws.config("export", **sections))
    meta = json.load(open(os.path.join(result["model_dir"], "metadata.json")))
    assert list(meta["signature"]["inputs"]) == ["image_bytes"]
    files = sorted(glob.glob(os.path.join(ws.data, "imgs", "*", "*")))
    serve = tf.saved_model.load(result["model_dir"]).signatures["serving_default"]
    out = serve(image_bytes=tf.constant([open(f, "rb").read() for f in files]))
    truth = [os.path.basename(os.path.dirname(f)) for f in files]
    names = [n.decode() for n in out["class_name"].numpy()]
    assert np.mean([a == b for a, b in zip(names, truth)]) >= 0.9


def test_an_exported_version_is_readable_by_other_users(trained):
    old = os.umask(0o077)  # even under a strict umask: TF Serving runs as another uid
    try:
        evaluate.run(trained.config("evaluate"))
        result = export.run(trained.config("export"))
    finally:
        os.umask(old)
    modes = {}
    for dirpath, dirnames, filenames in os.walk(result["model_dir"]):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            modes[os.path.relpath(path, result["model_dir"])] = stat.S_IMODE(os.stat(path).st_mode)
    assert stat.S_IMODE(os.stat(result["model_dir"]).st_mode) == 0o755
    assert {"saved_model.pb", "variables", "metadata.json", "report",
            "report/report.html"} <= set(modes)
    for rel, mode in modes.items():
        path = os.path.join(result["model_dir"], rel)
        assert mode == (0o755 if os.path.isdir(path) else 0o644), (rel, oct(mode))
    for name in ("evaluation.json", "blessing.json", "report.html", "loss.png"):
        assert stat.S_IMODE(os.stat(os.path.join(trained.run_dir(), name)).st_mode) == 0o644
    dataset = os.path.join(trained.work, "datasets", trained.read("dataset.json")["fingerprint"])
    assert stat.S_IMODE(os.stat(dataset).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(os.path.join(dataset, "schema.json")).st_mode) == 0o644
    final = os.path.join(trained.run_dir(), "train", "final")
    assert stat.S_IMODE(os.stat(final).st_mode) == 0o755
