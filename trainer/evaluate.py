"""The evaluate stage: metrics of the final weights on the eval split, and the blessing gate.

Writes ``<run_dir>/evaluation.json`` (loss, accuracy, macro precision/recall/F1, per-class
precision/recall/F1/support, confusion matrix ``[true][predicted]``) and ``blessing.json``.

The run report (:mod:`trainer.report`: loss/accuracy/confusion-matrix plots and a self-contained
``report.html``) is written next to them, blessed or not. A report that cannot be made (a
matplotlib error, ...) is logged as a warning and recorded as ``"report": null``: it never fails
the stage.

Blessing: the candidate's ``evaluation.metric`` must reach ``evaluation.threshold`` and, when a
baseline exists, ``baseline - evaluation.tolerance``. The baseline is the newest version under
``<models>/<model_name>/`` with a ``metadata.json`` (its recorded evaluation metric), ignoring a
version exported by this same DAG run and one trained on other classes (its ``data.class_names``:
another list or order, as when ``data.classes`` grows; its metric measured another task, and the
gate would hold back every model of the new classes). The versions passed over are named in the
decision. Not blessed: :class:`~trainer.errors.NotBlessed` (exit 10).
"""

import os

from trainer import atomic, checkpoints, common, contract, data, models, report
from trainer.common import LOG
from trainer.errors import NotBlessed
from trainer.sources import show_names

common.quiet_tensorflow()
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def load_final_model(config, schema, stats):
    """Rebuild the model from the config and restore ``<run_dir>/train/final/weights``."""
    model = models.build_model(config, schema, stats)
    prefix = os.path.join(config["paths"]["run_dir"], contract.FINAL_SUBDIR, "weights")
    checkpoints.read_weights(model, prefix, "final weights of the train stage (run it first)")
    return model


def predict(model, dataset):
    """Return ``(logits, labels)`` as numpy arrays for every batch of ``dataset``."""
    call = tf.function(lambda x: model(x, training=False))
    logits, labels = [], []
    for x, y in dataset:
        logits.append(call(x).numpy())
        labels.append(y.numpy())
    return np.concatenate(logits), np.concatenate(labels)


def roc_auc(scores, positives):
    """Area under the ROC curve: the chance that a random positive scores above a random negative
    (a tie counts half), from the ranks (Mann-Whitney U). None when either side is empty."""
    positives = np.asarray(positives, dtype=bool)
    n_pos = int(positives.sum())
    n_neg = positives.size - n_pos
    if not n_pos or not n_neg:
        return None
    _, inverse, counts = np.unique(np.asarray(scores, dtype=np.float64), return_inverse=True,
                                   return_counts=True)
    ranks = (np.cumsum(counts) - (counts - 1) / 2.0)[inverse]  # tied scores share their mean rank
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def softmax(logits):
    """Class probabilities of ``logits`` [examples, classes], in float64."""
    shifted = np.asarray(logits, dtype=np.float64)
    shifted = np.exp(shifted - shifted.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def compute_metrics(logits, labels, class_names):
    """Loss, accuracy, macro and per-class precision/recall/F1/AUC and the confusion matrix.

    ``auc`` is each class's ROC AUC against the rest (its softmax probability as the score),
    averaged over the classes that have both positives and negatives in the split (scikit-learn's
    one-vs-rest macro AUC; with two classes both classes' AUC is the usual one).
    """
    num_classes = len(class_names)
    losses = tf.keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    predicted = np.argmax(logits, axis=1)
    probabilities = softmax(logits)
    confusion = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(confusion, (labels, predicted), 1)
    per_class, present = [], []
    for c, name in enumerate(class_names):
        tp = float(confusion[c, c])
        support, predicted_c = int(confusion[c].sum()), float(confusion[:, c].sum())
        precision = tp / predicted_c if predicted_c else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class.append({"class_id": c, "class_name": name, "precision": precision,
                          "recall": recall, "f1": f1, "support": support,
                          "auc": roc_auc(probabilities[:, c], labels == c)})
        if support:
            present.append(per_class[-1])

    def macro(key):
        return float(np.mean([p[key] for p in present])) if present else 0.0
    aucs = [p["auc"] for p in per_class if p["auc"] is not None]
    metrics = {"loss": float(np.mean(losses.numpy())),
               "accuracy": float(np.mean(predicted == labels)),
               "macro_precision": macro("precision"), "macro_recall": macro("recall"),
               "macro_f1": macro("f1"),
               # no class with both positives and negatives (one class in the split): 0, as macro()
               "auc": float(np.mean(aucs)) if aucs else 0.0}
    return {"metrics": metrics, "per_class": per_class, "confusion_matrix": confusion.tolist(),
            "examples": int(labels.size)}


def find_baseline(config, metric, class_names):
    """The baseline: ``(baseline, passed_over)``.

    ``baseline`` is the newest exported version with metadata (not from this DAG run) whose metric
    measured the same classes (``class_names``, the data set's), or None. ``passed_over`` lists the
    newer versions it is not, each ``{"version", "why"}``, newest first, so that the decision can say
    why the baseline is older than the newest version, or missing.
    """
    root = common.model_root(config)
    run = config["run"]
    passed_over = []
    for version in reversed(common.list_versions(root)):
        meta = common.read_version_metadata(root, version)
        if not meta:
            passed_over.append({"version": version, "why": "no readable metadata.json"})
            continue
        if (meta.get("dag_id"), meta.get("run_id")) == (run["dag_id"], run["run_id"]):
            continue
        trained_on = common.version_class_names(meta)
        if trained_on is not None and trained_on != list(class_names):
            LOG.warning("version %d of %s was trained on the classes [%s], this data set has [%s]: its %s "
                        "measured another task; not a baseline", version, root, show_names(trained_on),
                        show_names(list(class_names)), metric)
            passed_over.append({"version": version, "why": "trained on other classes"})
            continue
        value = (meta.get("evaluation") or {}).get("metrics", {}).get(metric)
        if value is None:
            LOG.warning("version %d of %s has no %s in metadata.json; not a baseline",
                        version, root, metric)
            passed_over.append({"version": version, "why": "no %s in its metadata" % metric})
            continue
        return ({"version": version, "metric": metric, "value": float(value),
                 "model_dir": os.path.join(root, str(version))}, passed_over)
    return None, passed_over


def decide(value, metric, threshold, tolerance, baseline, passed_over=()):
    """The blessing decision: ``(blessed, reason)``. The reason names the versions ``passed_over``
    when the baseline is not the newest version, or there is none because of them."""
    if value < threshold:
        return False, "%s %.4f is below the threshold %.4f" % (metric, value, threshold)
    note = " (passed over %s)" % report.passed_over_text(passed_over) if passed_over else ""
    if baseline is None:
        return True, "%s %.4f reaches the threshold %.4f and there is no baseline%s" % (
            metric, value, threshold, note)
    floor = baseline["value"] - tolerance
    if value < floor:
        return False, ("%s %.4f is worse than baseline version %d (%.4f) minus tolerance %.4f%s"
                       % (metric, value, baseline["version"], baseline["value"], tolerance, note))
    return True, ("%s %.4f reaches the threshold %.4f and baseline version %d (%.4f) minus "
                  "tolerance %.4f%s" % (metric, value, threshold, baseline["version"],
                                        baseline["value"], tolerance, note))


def write_report(config, evaluation, blessing, schema, stats):
    """Write the run report; return ``{"report", "plots"}``, or None (with a warning) if it fails.

    A report is never a reason to fail a run: any error here is logged, the stale report files
    of an earlier try are removed, and evaluation goes on.
    """
    run_dir = config["paths"]["run_dir"]
    try:
        written = report.write_report(run_dir, config=config, evaluation=evaluation,
                                      blessing=blessing, schema=schema, stats=stats)
    except Exception as error:  # noqa: BLE001 -- by design: the report is best effort
        LOG.warning("run report not written (%s: %s); the evaluation is not affected",
                    type(error).__name__, (str(error).strip().splitlines() or [""])[0][:300])
        report.remove_report(run_dir)
        return None
    LOG.info("run report: %s (%d plots)", written["report"], len(written["plots"]))
    return written


def run(config):
    """Run the evaluate stage; return the metrics and the blessing (raise NotBlessed if not)."""
    config = common.begin(config, "evaluate")
    run_dir = config["paths"]["run_dir"]
    evaluation_cfg = config["evaluation"]
    dataset_dir, schema, stats = common.load_dataset(config)
    common.setup_tensorflow(config["training"])
    model = load_final_model(config, schema, stats)
    base = data.base_dataset(dataset_dir, schema, "eval", cache=False)
    logits, labels = predict(model, data.eval_dataset(base, config["training"]["batch_size"]))
    evaluation = compute_metrics(logits, labels, schema["class_names"])
    evaluation.update(class_names=schema["class_names"], fingerprint=schema["fingerprint"],
                      final=atomic.read_json(os.path.join(run_dir, contract.FINAL_SUBDIR,
                                                          "final.json")),
                      time=common.now_iso())
    atomic.write_json(os.path.join(run_dir, contract.EVALUATION_FILE), evaluation)
    metrics = evaluation["metrics"]
    LOG.info("evaluation on %d examples: %s", evaluation["examples"],
             ", ".join("%s %.4f" % kv for kv in sorted(metrics.items())))

    metric = evaluation_cfg["metric"]
    value = metrics[metric]
    baseline, passed_over = find_baseline(config, metric, schema["class_names"])
    blessed, reason = decide(value, metric, evaluation_cfg["threshold"],
                             evaluation_cfg["tolerance"], baseline, passed_over)
    blessing = {"blessed": blessed, "decision": "blessed" if blessed else "not blessed",
                "reason": reason, "metric": metric,
                "candidate": {"value": value, "dag_id": config["run"]["dag_id"],
                              "run_id": config["run"]["run_id"]},
                "baseline": baseline, "passed_over": passed_over, "threshold": evaluation_cfg["threshold"],
                "tolerance": evaluation_cfg["tolerance"], "time": common.now_iso()}
    atomic.write_json(os.path.join(run_dir, contract.BLESSING_FILE), blessing)
    LOG.info("%s: %s", blessing["decision"], reason)
    written = write_report(config, evaluation, blessing, schema, stats)
    result = {"blessed": blessed, "metric": metric, "value": value, "metrics": metrics,
              "baseline": baseline, "passed_over": passed_over, "reason": reason,
              "threshold": evaluation_cfg["threshold"],
              "tolerance": evaluation_cfg["tolerance"],
              "evaluation_path": os.path.join(run_dir, contract.EVALUATION_FILE),
              "report": written["report"] if written else None,
              "plots": written["plots"] if written else []}
    if not blessed:
        raise NotBlessed(reason, result)
    return result
