"""The evaluate stage: metrics of the final weights on the eval split, and the blessing gate.

Writes ``<run_dir>/evaluation.json`` (loss, accuracy, macro precision/recall/F1, per-class
precision/recall/F1/support, confusion matrix ``[true][predicted]``; ``baseline``: the production
model's on the same split; ``slices``: both per slice value) and ``blessing.json``.

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
decision.

The baseline's value is the production model's score on this run's eval split, in the same pass
as the candidate's (:mod:`trainer.champion`: its SavedModel's serving signature fed tonight's eval
rows as raw features), since the data moves every night and a score recorded on an older split is
no fair comparison. A production model that cannot read tonight's data (a column gone or of
another kind, a SavedModel that does not load) is named in a warning and in ``baseline.why``
(``baseline.same_split`` false), and the gate compares the score recorded in its metadata.json
(``baseline.recorded_value``, kept in every case).

Slices (``evaluation.slices``, :mod:`trainer.slices`): the metrics of both models per value of the
named columns. With ``evaluation.slice_floor`` above 0, every slice value with at least
``evaluation.slice_min_rows`` eval rows must reach the floor on the gate's metric.

After a sweep, the final weights are the chosen trial's, and the model is built with that trial's
training settings (:func:`trainer.common.trained_settings`).

Not blessed: :class:`~trainer.errors.NotBlessed` (exit 10).
"""

import os

from trainer import atomic, champion, checkpoints, common, contract, data, models, report, slices
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


def predict(model, dataset, production=None, slice_specs=()):
    """One pass over ``dataset``: ``{"logits", "labels", "production", "why", "columns"}`` as numpy.

    ``production`` (a :class:`~trainer.champion.Production`, or None) scores the same batches: its
    logits, or None and ``why`` it could not (the candidate's figures never depend on it).
    ``columns`` holds the raw values of each slice spec's column, read from the same batches.
    """
    call = tf.function(lambda x: model(x, training=False))
    logits, labels, other, columns = [], [], [], [[] for _ in slice_specs]
    why = None
    for x, y in dataset:
        logits.append(call(x).numpy())
        labels.append(y.numpy())
        if production is not None and why is None:
            try:
                other.append(production.probabilities(x))
            except champion.CannotScore as error:
                why = str(error)
        for values, spec in zip(columns, slice_specs):
            values.append(slices.column_values(spec, x))
    scored = production is not None and why is None
    return {"logits": np.concatenate(logits), "labels": np.concatenate(labels), "why": why,
            "production": champion.as_logits(np.concatenate(other)) if scored else None,
            "columns": [np.concatenate(values) for values in columns]}


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
    measured the same classes (``class_names``, the data set's), or None; its ``value`` is the
    recorded one (``recorded_value``) until :func:`score_baseline` scores it on this run's split.
    ``passed_over`` lists the newer versions it is not, each ``{"version", "why"}``, newest first,
    so that the decision can say why the baseline is older than the newest version, or missing.
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
        return ({"version": version, "metric": metric, "value": float(value), "recorded_value": float(value),
                 "same_split": False, "why": None, "model_dir": os.path.join(root, str(version))}, passed_over)
    return None, passed_over


def load_production(baseline, schema):
    """``(production, why)``: the baseline version ready to score this run's data
    (:class:`~trainer.champion.Production`), or None and why not (None, None without a baseline)."""
    if baseline is None:
        return None, None
    metadata = atomic.read_json(os.path.join(baseline["model_dir"], "metadata.json")) or {}
    try:
        return champion.Production(baseline["model_dir"], metadata, schema), None
    except champion.CannotScore as error:
        return None, str(error)


def score_baseline(baseline, scored, why, class_names):
    """The baseline's part of ``evaluation.json``: its metrics on this run's eval split when it
    could read it, and the gate's figure: the same-split value, or the recorded one and why.

    Updates ``baseline`` (the gate's record) in place: ``value``, ``same_split`` and ``why``.
    """
    if baseline is None:
        return None
    metric = baseline["metric"]
    recorded = common.read_version_metadata(os.path.dirname(baseline["model_dir"]), baseline["version"]) or {}
    out = {"version": baseline["version"], "model_dir": baseline["model_dir"],
           "recorded": {"metrics": (recorded.get("evaluation") or {}).get("metrics"),
                        "per_class": (recorded.get("evaluation") or {}).get("per_class")}}
    if scored["production"] is None:
        baseline.update(same_split=False, why=why, value=baseline["recorded_value"])
        LOG.warning("production model (version %d) cannot read this run's data: %s; the gate compares its "
                    "recorded %s %.4f, measured on an older eval split", baseline["version"], why, metric,
                    baseline["recorded_value"])
        out.update(same_split=False, why=why)
        return out
    metrics = compute_metrics(scored["production"], scored["labels"], class_names)
    baseline.update(same_split=True, why=None, value=metrics["metrics"][metric])
    LOG.info("production model (version %d) on this run's eval split: %s %.4f (recorded %.4f)",
             baseline["version"], metric, baseline["value"], baseline["recorded_value"])
    out.update(same_split=True, why=None, **metrics)
    return out


def slice_metrics(class_names):
    """The metrics of one slice: :func:`compute_metrics`' overall figures, ``auc`` None where no
    class of the slice has both positives and negatives (it is undefined there, not 0)."""
    def measure(logits, labels):
        result = compute_metrics(logits, labels, class_names)
        metrics = dict(result["metrics"])
        if all(c["auc"] is None for c in result["per_class"]):
            metrics["auc"] = None
        return metrics
    return measure


def _baseline_text(baseline):
    if baseline.get("same_split"):
        return "baseline version %d (%.4f on this run's eval split)" % (baseline["version"], baseline["value"])
    return "baseline version %d (%.4f recorded: it cannot score this run's data)" % (
        baseline["version"], baseline["value"])


def decide(value, metric, threshold, tolerance, baseline, passed_over=(), slice_failures=()):
    """The blessing decision: ``(blessed, reason)``. The reason names the versions ``passed_over``
    when the baseline is not the newest version, or there is none because of them, and the slices
    below the floor (``slice_failures``, a reason of their own: :func:`trainer.slices.floor_reason`)."""
    if value < threshold:
        return False, "%s %.4f is below the threshold %.4f" % (metric, value, threshold)
    note = " (passed over %s)" % report.passed_over_text(passed_over) if passed_over else ""
    if baseline is None:
        blessed, reason = True, "%s %.4f reaches the threshold %.4f and there is no baseline%s" % (
            metric, value, threshold, note)
    elif value < baseline["value"] - tolerance:
        return False, ("%s %.4f is worse than %s minus tolerance %.4f%s"
                       % (metric, value, _baseline_text(baseline), tolerance, note))
    else:
        blessed, reason = True, ("%s %.4f reaches the threshold %.4f and %s minus tolerance %.4f%s"
                                 % (metric, value, threshold, _baseline_text(baseline), tolerance, note))
    if slice_failures:
        return False, "%s, but %s" % (reason, slice_failures)
    return blessed, reason


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
    config = common.trained_settings(common.begin(config, "evaluate"))
    run_dir = config["paths"]["run_dir"]
    evaluation_cfg = config["evaluation"]
    metric = evaluation_cfg["metric"]
    dataset_dir, schema, stats = common.load_dataset(config)
    class_names = schema["class_names"]
    slice_specs = slices.resolve(evaluation_cfg["slices"], schema)
    common.setup_tensorflow(config["training"])
    model = load_final_model(config, schema, stats)
    baseline, passed_over = find_baseline(config, metric, class_names)
    production, why = load_production(baseline, schema)
    base = data.base_dataset(dataset_dir, schema, "eval", cache=False)
    scored = predict(model, data.eval_dataset(base, config["training"]["batch_size"]), production, slice_specs)
    evaluation = compute_metrics(scored["logits"], scored["labels"], class_names)
    evaluation.update(class_names=class_names, fingerprint=schema["fingerprint"],
                      final=atomic.read_json(os.path.join(run_dir, contract.FINAL_SUBDIR,
                                                          "final.json")),
                      baseline=score_baseline(baseline, scored, why or scored["why"], class_names),
                      slices=None, time=common.now_iso())
    metrics = evaluation["metrics"]
    LOG.info("evaluation on %d examples: %s", evaluation["examples"],
             ", ".join("%s %.4f" % kv for kv in sorted(metrics.items())))
    failures = []
    if slice_specs:
        entries = slices.table(slice_specs, scored["columns"], scored["labels"], scored["logits"],
                               scored["production"], slice_metrics(class_names))
        failures = slices.below_floor(entries, metric, evaluation_cfg["slice_floor"],
                                      evaluation_cfg["slice_min_rows"])
        evaluation["slices"] = {
            "columns": [{k: spec[k] for k in ("column", "kind", "buckets")} for spec in slice_specs],
            "metric": metric, "floor": evaluation_cfg["slice_floor"], "min_rows": evaluation_cfg["slice_min_rows"],
            "below_floor": [slices.slice_name(e) for e in failures], "values": entries}
    atomic.write_json(os.path.join(run_dir, contract.EVALUATION_FILE), evaluation)

    value = metrics[metric]
    blessed, reason = decide(value, metric, evaluation_cfg["threshold"], evaluation_cfg["tolerance"],
                             baseline, passed_over,
                             slices.floor_reason(failures, metric, evaluation_cfg["slice_floor"]))
    blessing = {"blessed": blessed, "decision": "blessed" if blessed else "not blessed",
                "reason": reason, "metric": metric,
                "candidate": {"value": value, "dag_id": config["run"]["dag_id"],
                              "run_id": config["run"]["run_id"]},
                "baseline": baseline, "passed_over": passed_over, "threshold": evaluation_cfg["threshold"],
                "tolerance": evaluation_cfg["tolerance"],
                "slice_floor": evaluation_cfg["slice_floor"],
                "slices_below_floor": [slices.slice_name(e) for e in failures], "time": common.now_iso()}
    atomic.write_json(os.path.join(run_dir, contract.BLESSING_FILE), blessing)
    LOG.info("%s: %s", blessing["decision"], reason)
    written = write_report(config, evaluation, blessing, schema, stats)
    result = {"blessed": blessed, "metric": metric, "value": value, "metrics": metrics,
              "baseline": baseline, "passed_over": passed_over, "reason": reason,
              "threshold": evaluation_cfg["threshold"],
              "tolerance": evaluation_cfg["tolerance"],
              "slices_below_floor": blessing["slices_below_floor"],
              "evaluation_path": os.path.join(run_dir, contract.EVALUATION_FILE),
              "report": written["report"] if written else None,
              "plots": written["plots"] if written else []}
    if not blessed:
        raise NotBlessed(reason, result)
    return result
