"""The export stage: publish a blessed model as ``<models>/<model_name>/<version>/``.

The SavedModel (see :mod:`trainer.serving`), a weights checkpoint ``variables_ckpt/model`` (used
by warm starts) and ``metadata.json`` are written into ``<model_name>/.tmp-<random>/``; the
SavedModel is reloaded there and its serving signature must reproduce the in-memory model on real
eval examples in raw form (atol 1e-4). Only then is the directory renamed to the next integer
version (never replacing one). Retention keeps the newest ``export.keep_versions``; stale
``.tmp-*`` directories older than an hour are removed. A retry of the same DAG run returns the
version it already exported.

The run report of the evaluate stage (``report.html`` and its plots, see :mod:`trainer.report`)
is copied into ``<version>/report/`` before the rename and listed in ``metadata.json``
(``"report": null`` when the run has none: a missing report never fails an export).

After a sweep, ``metadata.json`` also has ``"selection"``: the chosen trial, its settings, the metric
and its value, and how many trials ran (:func:`trainer.select.summary`); ``hyperparameters`` are
that trial's training settings.
"""

import os
import shutil

from trainer import atomic, checkpoints, common, contract, data, report, select
from trainer.common import LOG
from trainer.errors import BadInput
from trainer.evaluate import load_final_model
from trainer.serving import ServingModule

common.quiet_tensorflow()
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

VERIFY_EXAMPLES = 8
VERIFY_ATOL = 1e-4
#: Sub-directory of a model version that holds the run report.
REPORT_DIR = "report"


class ExportCheckFailed(RuntimeError):
    """The reloaded SavedModel does not reproduce the in-memory model."""


def find_existing(root, run):
    """The version already exported by this DAG run, or None."""
    for version in reversed(common.list_versions(root)):
        meta = common.read_version_metadata(root, version) or {}
        if (meta.get("dag_id"), meta.get("run_id")) == (run["dag_id"], run["run_id"]):
            return version, meta
    return None


def save_saved_model(module, path):
    """Write ``module`` as a SavedModel with its ``serving_default`` signature, and the Keras
    model's variables, without Keras' own traces of every layer's call.

    Those traces are only for ``tf.keras.models.load_model``, which nothing here uses (serving
    goes through the signature; warm starts read ``variables_ckpt``), and Keras traces them with
    autograph off: a user's layer whose ``call`` branches in Python on a tensor failed the export
    after training it without complaint. They were also about half of the save's time.
    """
    from keras.saving.saved_model import utils as keras_saving  # Keras 2.9, pinned with TF
    with keras_saving.keras_option_scope(save_traces=False):
        tf.saved_model.save(module, path,
                            signatures={"serving_default": module.serve.get_concrete_function()})


def verify_reloaded(path, module, x):
    """Reload the SavedModel at ``path`` and compare its signature with the in-memory model."""
    expected = tf.nn.softmax(module.model(x, training=False)).numpy()
    loaded = tf.saved_model.load(path)
    outputs = loaded.signatures["serving_default"](**module.raw_inputs(x))
    got = outputs["probabilities"].numpy()
    if got.shape != expected.shape:
        raise ExportCheckFailed("reloaded SavedModel %s returns probabilities of shape %s, "
                                "expected %s" % (path, got.shape, expected.shape))
    diff = float(np.max(np.abs(got - expected)))
    if not diff <= VERIFY_ATOL:
        raise ExportCheckFailed("reloaded SavedModel %s differs from the trained model by %.3g "
                                "(> %g) on %d eval examples" % (path, diff, VERIFY_ATOL, len(x)))
    names = [n.decode("utf-8") for n in outputs["class_name"].numpy()]
    ids = outputs["class_id"].numpy().tolist()
    if names != [module.class_names[i] for i in ids]:
        raise ExportCheckFailed("reloaded SavedModel %s: class_name does not match class_id"
                                % path)
    LOG.info("reloaded SavedModel matches the trained model on %d eval examples (max diff %.2g)",
             len(x), diff)
    return {"examples": int(len(x)), "max_abs_diff": diff, "atol": VERIFY_ATOL}


def copy_report(run_dir, version_dir):
    """Copy the run report into ``<version_dir>/report/``; return its metadata entry or None.

    The entry lists paths relative to the version directory. A run without ``report.html`` (its
    report could not be made) or a copy error gives None and a warning, never a failure.
    """
    names = report.report_files(run_dir)
    if report.REPORT_NAME not in names:
        LOG.warning("no run report in %s; exporting without one", run_dir)
        return None
    target = os.path.join(version_dir, REPORT_DIR)
    try:
        os.makedirs(target)
        for name in names:
            shutil.copyfile(os.path.join(run_dir, name), os.path.join(target, name))
    except (IOError, OSError) as error:
        LOG.warning("run report not copied into the export (%s); exporting without one", error)
        shutil.rmtree(target, ignore_errors=True)
        return None
    return {"html": "%s/%s" % (REPORT_DIR, report.REPORT_NAME),
            "plots": ["%s/%s" % (REPORT_DIR, n) for n in names if n != report.REPORT_NAME]}


#: Written into the dependency image by docker/deps.Dockerfile: the root image it was built on.
ROOT_IMAGE_FILE = "/opt/tfpipe/root-image.json"


def image_provenance(run_info, root_file=ROOT_IMAGE_FILE):
    """Which image made this model, so a deploy step can refuse an unapproved one.

    ``content_id`` is the hash of the image's inputs (baked in at build); ``id`` (the Docker
    image ID, ``sha256:...``) and ``repo_digest`` (``name@sha256:...`` when the image came from
    a registry) cannot be known inside the image, so the operator reads them from the engine
    and passes them in ``run``; ``root`` is the image it was built on (``official`` or
    ``offline``, with the root's image ID and repo digest), baked in at build.
    """
    root = atomic.read_json(root_file, None)
    if isinstance(root, dict):
        root = {k: (v or None) for k, v in root.items()}
    return {"reference": run_info.get("image"), "content_id": os.environ.get("TFPIPE_IMAGE_ID"),
            "id": run_info.get("image_id"), "repo_digest": run_info.get("image_repo_digest"),
            "root": root}


def _publish(tmp, root, metadata):
    """Rename ``tmp`` to the next free integer version; return the version."""
    version = max(common.list_versions(root) or [0]) + 1
    while True:
        metadata["version"] = version
        atomic.write_json(os.path.join(tmp, "metadata.json"), metadata)
        try:
            atomic.publish_dir(tmp, os.path.join(root, str(version)))
            return version
        except FileExistsError:
            LOG.info("version %d appeared meanwhile; trying %d", version, version + 1)
            version += 1


def apply_retention(root, keep, protect):
    """Delete the oldest versions beyond ``keep`` (never ``protect``); return the deleted ones."""
    versions = common.list_versions(root)
    doomed = [v for v in versions[:max(0, len(versions) - keep)] if v != protect]
    for version in doomed:
        atomic.remove_dir(os.path.join(root, str(version)), root)
        LOG.info("retention: removed version %d (keeping the newest %d)", version, keep)
    return doomed


def _result(root, version, model_name, metrics, report_entry, existing=False):
    model_dir = os.path.join(root, str(version))
    html = (report_entry or {}).get("html")
    return {"model_dir": model_dir, "version": version, "model_name": model_name,
            "metrics": metrics, "already_exported": existing,
            "report": os.path.join(model_dir, html) if html else None}


def run(config):
    """Run the export stage; return ``{model_dir, version, model_name, metrics, report, ...}``."""
    config = common.trained_settings(common.begin(config, "export"))
    run_dir, run_info = config["paths"]["run_dir"], config["run"]
    model_name = config["export"]["model_name"]
    blessing_path = os.path.join(run_dir, contract.BLESSING_FILE)
    blessing = atomic.read_json(blessing_path)
    if not blessing:
        raise BadInput("export refused: %s does not exist (run the evaluate stage first)"
                       % blessing_path)
    if blessing.get("blessed") is not True:
        raise BadInput("export refused: %s says the candidate is not blessed (%s)"
                       % (blessing_path, blessing.get("reason")))
    evaluation = atomic.read_json(os.path.join(run_dir, contract.EVALUATION_FILE), {})
    root = common.model_root(config)
    os.makedirs(root, exist_ok=True)
    for name in atomic.clean_stale_temps(root):
        LOG.info("removed stale temporary directory %s/%s", root, name)
    existing = find_existing(root, run_info)
    if existing:
        LOG.info("run %s of %s was already exported as version %d; nothing to do",
                 run_info["run_id"], run_info["dag_id"], existing[0])
        metrics = (existing[1].get("evaluation") or {}).get("metrics", {})
        return _result(root, existing[0], model_name, metrics, existing[1].get("report"),
                       existing=True)

    dataset_dir, schema, stats = common.load_dataset(config)
    common.setup_tensorflow(config["training"])
    model = load_final_model(config, schema, stats)
    module = ServingModule(model, schema)
    base = data.base_dataset(dataset_dir, schema, "eval", cache=False)
    x, _ = next(iter(base.batch(VERIFY_EXAMPLES)))

    with atomic.temp_dir(root) as tmp:
        save_saved_model(module, tmp)
        checkpoints.write_weights(model, os.path.join(tmp, "variables_ckpt", "model"))
        check = verify_reloaded(tmp, module, x)
        report_entry = copy_report(run_dir, tmp)
        metadata = {
            "model_name": model_name, "created": common.now_iso(),
            "dag_id": run_info["dag_id"], "run_id": run_info["run_id"],
            "task_id": run_info["task_id"], "try_number": run_info["try_number"],
            "image": image_provenance(run_info),
            "data": {"fingerprint": schema["fingerprint"], "format": schema["format"],
                     "counts": schema["counts"], "class_names": schema["class_names"],
                     "features": schema["features"], "image": schema["image"],
                     # this run's date window: a data set reused from another run says another end
                     "window": (atomic.read_json(os.path.join(run_dir, "dataset.json")) or {}).get("window")},
            "hyperparameters": config["training"],
            "evaluation": {"metrics": evaluation.get("metrics", {}), "blessing": blessing,
                           "per_class": evaluation.get("per_class"), "slices": evaluation.get("slices")},
            "tensorflow_version": tf.__version__,
            "training": atomic.read_json(os.path.join(run_dir, contract.FINAL_SUBDIR,
                                                      "final.json")),
            "attempts": atomic.read_json(os.path.join(run_dir, contract.ATTEMPTS_FILE), []),
            "signature": module.describe(), "verification": check, "report": report_entry,
        }
        selection = select.read_selection(run_dir)
        if selection:  # the sweep trial these weights are, and what chose it
            metadata["selection"] = select.summary(selection)
        version = _publish(tmp, root, metadata)
    model_dir = os.path.join(root, str(version))
    LOG.info("exported %s version %d to %s", model_name, version, model_dir)
    apply_retention(root, config["export"]["keep_versions"], version)
    return _result(root, version, model_name, metadata["evaluation"]["metrics"], report_entry)
