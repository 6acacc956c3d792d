"""The run report: plots and one self-contained ``report.html`` next to ``evaluation.json``.

Written by the evaluate stage into the run directory, blessed or not:

* ``loss.png`` and ``accuracy.png``: training and validation curves per epoch across every
  attempt of the train stage (``metrics.json``), one colour per try, and a dotted vertical line,
  labelled, where a retry took over (a resume from a checkpoint, or a restart);
* ``confusion_matrix.png``: counts ``[true][predicted]`` annotated, class names from the schema;
* ``report.html``: metrics, per-class precision/recall, the blessing decision and why, the
  candidate beside the production model on this run's eval split ("Champion vs challenger"),
  both per slice value when ``evaluation.slices`` names columns ("Slices"), data
  statistics, lineage (DAG run, image, attempts) and the three plots embedded as
  ``data:image/png;base64`` URIs: no external file, stylesheet or script. Every piece of text is
  escaped with :func:`html.escape`.

When the run directory holds ``selection.json`` (a sweep's select stage), a "Trials" section lists
every trial (its settings, the metric at its final weights, how it ended, epochs, time), the chosen
one marked, and one small plot per tuned setting of the metric against that setting's values (a log
axis where they span more than :data:`LOG_AXIS_SPAN`).

When the run directory holds ``validation.json`` (the validate stage, the data gate), a "Data check"
section shows its checks, flagged first, and one plot per flagged column: a numeric column's
shares over the gate's groups, a text column's (or the classes') most frequent values, baseline and
tonight side by side. The validate stage writes a report of that section alone when it finds
anomalies (:func:`write_data_check_report`); the evaluate stage's report replaces it.

The PNGs are written first and ``report.html`` last, each atomically (mode 0644), so an existing
``report.html`` always belongs to a complete set. The export stage copies them into the model
version (``<version>/report/``).

matplotlib is imported lazily, on the Agg backend, through ``Figure`` and ``FigureCanvasAgg``
only: pyplot (and its global state) is never imported. No TensorFlow here.
"""

import base64
import datetime
import html
import io
import os
import sys

from trainer import atomic, contract, slices

REPORT_NAME = contract.REPORT_FILE
#: The plots, in the order they are listed and embedded.
PLOTS = ("loss", "accuracy", "confusion_matrix")
PLOT_DPI = 100
#: Above this many classes the confusion matrix cells are not annotated (unreadable anyway).
ANNOTATE_MAX_CLASSES = 30
#: A trials plot's setting axis is logarithmic when its positive values span more than this factor.
LOG_AXIS_SPAN = 100.0


def plot_name(plot):
    """The file name of a plot: ``loss.png``, ``accuracy.png``, ``confusion_matrix.png``."""
    return plot + ".png"


def report_files(directory):
    """The report files that exist in ``directory`` (plots first, ``report.html`` last)."""
    names = [plot_name(p) for p in PLOTS] + [REPORT_NAME]
    return [n for n in names if os.path.isfile(os.path.join(directory, n))]


def remove_report(run_dir):
    """Delete the report files of ``run_dir`` (so a failed report never leaves a stale one)."""
    for name in [REPORT_NAME] + [plot_name(p) for p in PLOTS]:
        try:
            os.remove(os.path.join(run_dir, name))
        except OSError:
            pass


# --- the run's records --------------------------------------------------------------------------

def _read(run_dir, *parts, default=None):
    try:
        return atomic.read_json(os.path.join(run_dir, *parts), default)
    except ValueError:  # unreadable JSON: the report shows what it has
        return default


def resume_points(history, attempts=None):
    """Where a different try took over in ``history`` (metrics.json, sorted by epoch).

    Returns ``[{"epoch", "try_number", "label"}]``: ``epoch`` is the first epoch recorded by
    that try; the label says whether it resumed from a checkpoint (and at which step), after
    ``attempts.json``.
    """
    resumed = {}
    for attempt in attempts or []:
        resumed[attempt.get("try_number")] = attempt.get("resumed_from")
    points, previous = [], None
    for record in history:
        try_number = record.get("try_number")
        if previous is not None and try_number != previous:
            origin = resumed.get(try_number)
            if origin:
                label = "try %s resumed at step %s" % (try_number, origin.get("step"))
            elif try_number in resumed:
                label = "try %s restarted" % try_number
            else:
                label = "try %s" % try_number
            points.append({"epoch": record.get("epoch"), "try_number": try_number,
                           "label": label})
        previous = try_number
    return points


def segments(history):
    """Runs of consecutive epochs recorded by the same try: ``[(try_number, [records])]``."""
    runs = []
    for record in history:
        if runs and runs[-1][0] == record.get("try_number"):
            runs[-1][1].append(record)
        else:
            runs.append((record.get("try_number"), [record]))
    return runs


# --- plots --------------------------------------------------------------------------------------

def _matplotlib():
    """``(Figure, FigureCanvasAgg, MaxNLocator)``, selecting Agg before anything else."""
    if "matplotlib.pyplot" not in sys.modules:
        os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator
    return Figure, FigureCanvasAgg, MaxNLocator


def _mpl_text(value):
    """Text for matplotlib: a ``$`` would start mathtext (and fail on most class names)."""
    return str(value).replace("$", r"\$")


def _png(figure, canvas_class):
    canvas_class(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=PLOT_DPI)
    return buffer.getvalue()


def _placeholder(axes, text):
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, color="0.4")
    axes.set_xticks([])
    axes.set_yticks([])


def plot_curves(history, attempts, key, title, ylabel):
    """PNG bytes: ``key`` (training) and ``val_<key>`` (validation) per epoch, per try."""
    Figure, Canvas, MaxNLocator = _matplotlib()
    figure = Figure(figsize=(7.5, 4.5), dpi=PLOT_DPI)
    axes = figure.add_subplot(1, 1, 1)
    axes.set_title(title)
    rows = [r for r in history if isinstance(r.get("epoch"), (int, float))]
    if not rows:
        _placeholder(axes, "no per-epoch history (metrics.json is missing or empty)")
        return _png(figure, Canvas)
    tries = []
    for try_number, _ in segments(rows):
        if try_number not in tries:
            tries.append(try_number)
    labelled = set()
    for try_number, records in segments(rows):
        color = "C%d" % (tries.index(try_number) % 10)
        epochs = [r["epoch"] for r in records]
        first = try_number not in labelled
        labelled.add(try_number)
        axes.plot(epochs, [r.get(key) for r in records], color=color, marker="o",
                  linestyle="-", label="training (try %s)" % try_number if first else None)
        axes.plot(epochs, [r.get("val_" + key) for r in records], color=color, marker="s",
                  linestyle="--", markerfacecolor="white",
                  label="validation (try %s)" % try_number if first else None)
    for point in resume_points(rows, attempts):
        x = point["epoch"] - 0.5
        axes.axvline(x, color="0.35", linestyle=":", linewidth=1.5)
        axes.text(x, 0.98, " " + _mpl_text(point["label"]), transform=axes.get_xaxis_transform(),
                  rotation=90, ha="right", va="top", fontsize=8, color="0.25",
                  bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.8, "pad": 1})
    axes.set_xlabel("epoch")
    axes.set_ylabel(ylabel)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    return _png(figure, Canvas)


def plot_confusion(matrix, class_names):
    """PNG bytes: the confusion matrix ``[true][predicted]`` with annotated counts."""
    Figure, Canvas, _ = _matplotlib()
    n = len(matrix)
    side = min(16.0, max(5.0, 0.5 * n + 3.0))
    figure = Figure(figsize=(side + 1.0, side), dpi=PLOT_DPI)
    axes = figure.add_subplot(1, 1, 1)
    axes.set_title("confusion matrix (eval split)")
    if not n:
        _placeholder(axes, "no confusion matrix")
        return _png(figure, Canvas)
    image = axes.imshow(matrix, cmap="Blues", interpolation="nearest")
    figure.colorbar(image, ax=axes, fraction=0.046, pad=0.04)
    names = [_mpl_text(c) for c in class_names] if len(class_names) == n else \
        [str(i) for i in range(n)]
    if n <= 60:
        axes.set_xticks(range(n))
        axes.set_yticks(range(n))
        long_names = max(len(c) for c in names) > 3
        axes.set_xticklabels(names, rotation=45 if long_names else 0,
                             ha="right" if long_names else "center")
        axes.set_yticklabels(names)
    axes.set_xlabel("predicted class")
    axes.set_ylabel("true class")
    if n <= ANNOTATE_MAX_CLASSES:
        peak = max(max(row) for row in matrix) or 1
        for i, row in enumerate(matrix):
            for j, count in enumerate(row):
                axes.text(j, i, str(count), ha="center", va="center", fontsize=9,
                          color="white" if count > peak / 2.0 else "black")
    figure.tight_layout()
    return _png(figure, Canvas)


def plot_distribution(column, distribution):
    """PNG bytes: a flagged column's shares, baseline and tonight side by side, over the gate's
    groups (numeric) or its most frequent values (text, classes)."""
    Figure, Canvas, _ = _matplotlib()
    labels = [_mpl_text(label) for label in distribution.get("labels") or []]
    figure = Figure(figsize=(7.5, 4.5), dpi=PLOT_DPI)
    axes = figure.add_subplot(1, 1, 1)
    kind = "groups of equal baseline mass" if distribution.get("kind") == "numeric" else "most frequent values"
    axes.set_title(_mpl_text("%s: baseline vs tonight (%s)" % (column, kind)), fontsize=10)
    if not labels:
        _placeholder(axes, "no distribution recorded")
        return _png(figure, Canvas)
    positions = list(range(len(labels)))
    width = 0.4
    axes.bar([p - width / 2 for p in positions], distribution.get("baseline") or [0] * len(labels),
             width, label="baseline (production data set)", color="C0")
    axes.bar([p + width / 2 for p in positions], distribution.get("tonight") or [0] * len(labels),
             width, label="tonight", color="C3")
    axes.set_xticks(positions)
    axes.set_xticklabels(labels, rotation=30 if max(len(label) for label in labels) > 6 else 0,
                         ha="right" if max(len(label) for label in labels) > 6 else "center", fontsize=8)
    axes.set_ylabel(_mpl_text(distribution.get("ylabel") or "share"))
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend(fontsize=8, loc="best")
    figure.tight_layout()
    return _png(figure, Canvas)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def plot_trials(setting, trials, metric, chosen):
    """PNG bytes: ``metric`` of each trial that has one against its value of ``setting`` (numbers on
    their axis, logarithmic over more than :data:`LOG_AXIS_SPAN`; other values as categories),
    trial ``chosen`` marked."""
    Figure, Canvas, _ = _matplotlib()
    figure = Figure(figsize=(4.2, 3.2), dpi=PLOT_DPI)
    axes = figure.add_subplot(1, 1, 1)
    axes.set_title(_mpl_text("%s by %s" % (metric, setting)), fontsize=10)
    points = [(t["params"].get(setting), t["value"], t["index"]) for t in trials
              if _is_number(t.get("value")) and setting in (t.get("params") or {})]
    if not points:
        _placeholder(axes, "no trial has a %s" % metric)
        return _png(figure, Canvas)
    if all(_is_number(x) for x, _, _ in points):
        xs = [x for x, _, _ in points]
        if min(xs) > 0 and max(xs) / min(xs) > LOG_AXIS_SPAN:
            axes.set_xscale("log")
    else:
        categories = []
        for x, _, _ in points:
            if str(x) not in categories:
                categories.append(str(x))
        xs = [categories.index(str(x)) for x, _, _ in points]
        axes.set_xticks(range(len(categories)))
        axes.set_xlim(-0.5, len(categories) - 0.5)
        axes.set_xticklabels([_mpl_text(c) for c in categories], fontsize=8)
    ys = [y for _, y, _ in points]
    axes.scatter(xs, ys, color="C0", label="trial")
    for x, y, (_, _, index) in zip(xs, ys, points):
        if index == chosen:
            axes.scatter([x], [y], color="C3", marker="*", s=160, zorder=3, label="chosen (trial %d)" % index)
    axes.set_xlabel(_mpl_text(setting))
    axes.set_ylabel(_mpl_text(metric))
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    figure.tight_layout()
    return _png(figure, Canvas)


def _tuned_settings(selection):
    return sorted({name for t in (selection or {}).get("trials") or [] for name in t.get("params") or {}})


def render_plots(history, attempts, evaluation):
    """``{plot: png bytes}`` for every plot of :data:`PLOTS`."""
    return {
        "loss": plot_curves(history, attempts, "loss", "loss per epoch", "loss"),
        "accuracy": plot_curves(history, attempts, "accuracy", "accuracy per epoch",
                                "accuracy"),
        "confusion_matrix": plot_confusion(evaluation.get("confusion_matrix") or [],
                                           evaluation.get("class_names") or []),
    }


# --- HTML ---------------------------------------------------------------------------------------

def _e(value):
    return html.escape("" if value is None else str(value), quote=True)


def _num(value, digits=4):
    if isinstance(value, bool) or value is None:
        return _e("-" if value is None else value)
    if isinstance(value, int):
        return _e(value)
    if isinstance(value, float):
        return _e("%.*f" % (digits, value))
    return _e(value)


def _table(headers, rows, numeric=()):
    """An HTML table; cells are already-escaped strings, columns ``numeric`` right-aligned."""
    out = ["<table>", "<thead><tr>"]
    out += ["<th>%s</th>" % _e(h) for h in headers]
    out.append("</tr></thead>")
    out.append("<tbody>")
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            cls = ' class="num"' if i in numeric else ""
            cells.append("<td%s>%s</td>" % (cls, cell))
        out.append("<tr>%s</tr>" % "".join(cells))
    out.append("</tbody></table>")
    return "\n".join(out)


def _pairs(rows):
    """A two-column key/value table; keys are escaped here, values are escaped already."""
    out = ["<table class=\"kv\"><tbody>"]
    for key, value in rows:
        out.append("<tr><th>%s</th><td>%s</td></tr>" % (_e(key), value))
    out.append("</tbody></table>")
    return "\n".join(out)


def _img(png, alt):
    return '<img src="data:image/png;base64,%s" alt="%s">' % (
        base64.b64encode(png).decode("ascii"), _e(alt))


_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1100px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ddd; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.5em 0 1em; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
thead th { background: #f3f3f3; } table.kv th { background: #f8f8f8; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.decision { display: inline-block; padding: 0.3em 0.8em; border-radius: 4px; color: #fff;
            font-weight: bold; letter-spacing: 0.05em; }
.blessed { background: #2e7d32; } .not-blessed { background: #c62828; }
.flag { color: #c62828; font-weight: bold; }
img { max-width: 100%; height: auto; border: 1px solid #eee; margin: 0.5em 0; }
code { font-size: 0.9em; } .muted { color: #777; }
"""


def passed_over_text(passed_over):
    """The newer versions the blessing gate passed over (``blessing.json``'s ``passed_over``: another
    task's classes, no such metric), as ``"version 3: why; version 2: why"``; "" for none. They say
    why the baseline is older than the newest version, or missing although versions exist."""
    return "; ".join("version %s: %s" % (p.get("version"), p.get("why"))
                     for p in passed_over or () if isinstance(p, dict))


def _decision_section(blessing, evaluation):
    if not blessing:
        return "<p class=\"muted\">no blessing.json</p>"
    blessed = blessing.get("blessed") is True
    baseline = blessing.get("baseline")
    threshold, tolerance = blessing.get("threshold"), blessing.get("tolerance")
    required = threshold
    if baseline and isinstance(baseline.get("value"), (int, float)) and \
            isinstance(tolerance, (int, float)) and isinstance(threshold, (int, float)):
        required = max(threshold, baseline["value"] - tolerance)
    passed_over = _e(passed_over_text(blessing.get("passed_over")))
    if baseline:
        base_text = "version %s: %s" % (_e(baseline.get("version")), _num(baseline.get("value")))
        if baseline.get("same_split"):
            base_text += " on this run's eval split (recorded %s)" % _num(baseline.get("recorded_value"))
        elif "same_split" in baseline:
            base_text += " recorded, since it cannot score this run's data: %s" % _e(baseline.get("why"))
        if passed_over:
            base_text += " (passed over %s)" % passed_over
    else:
        base_text = "none (passed over %s)" % passed_over if passed_over else "none (no earlier exported version)"
    candidate = blessing.get("candidate") or {}
    rows = [("metric", _e(blessing.get("metric"))),
            ("candidate", _num(candidate.get("value"))),
            ("threshold", _num(threshold)),
            ("baseline", base_text),
            ("tolerance", _num(tolerance)),
            ("required (max of threshold, baseline - tolerance)", _num(required))]
    return "\n".join([
        '<p><span class="decision %s">%s</span></p>' % (
            "blessed" if blessed else "not-blessed",
            _e((blessing.get("decision") or ("blessed" if blessed else "not blessed")).upper())),
        "<p>%s</p>" % _e(blessing.get("reason")),
        _pairs(rows)])


_METRIC_ORDER = ("accuracy", "loss", "macro_precision", "macro_recall", "macro_f1", "auc")


def _metrics_section(evaluation):
    metrics = evaluation.get("metrics") or {}
    names = [m for m in _METRIC_ORDER if m in metrics] + sorted(
        m for m in metrics if m not in _METRIC_ORDER)
    rows = [(m, _num(metrics[m])) for m in names]
    rows.append(("eval examples", _num(evaluation.get("examples"))))
    out = [_pairs(rows), "<h3>Per class</h3>"]
    out.append(_table(["class", "precision", "recall", "F1", "AUC", "support"], [
        [_e(c.get("class_name")), _num(c.get("precision")), _num(c.get("recall")),
         _num(c.get("f1")), _num(c.get("auc")), _num(c.get("support"))]
        for c in evaluation.get("per_class") or []], numeric=(1, 2, 3, 4, 5)))
    return "\n".join(out)


def _champion_section(evaluation):
    """Candidate and production model side by side, overall and per class, on this run's eval split;
    when the production model could not score it, why, and its recorded figures."""
    baseline = evaluation.get("baseline")
    if not baseline:
        return "<p class=\"muted\">no production model: no earlier exported version to compare with</p>"
    version = _e(baseline.get("version"))
    if not baseline.get("same_split"):
        out = ["<p>production version %s cannot score this run's data: %s. The gate compares the figures "
               "recorded when it was exported, measured on an older eval split.</p>" % (version, _e(baseline.get("why")))]
        theirs, label = (baseline.get("recorded") or {}).get("metrics") or {}, "production v%s (recorded)" % version
        their_classes = (baseline.get("recorded") or {}).get("per_class") or []
    else:
        out = ["<p>Both models scored on this run's eval split (%s examples).</p>" % _num(baseline.get("examples"))]
        theirs, label = baseline.get("metrics") or {}, "production v%s" % version
        their_classes = baseline.get("per_class") or []
    ours = evaluation.get("metrics") or {}
    names = [m for m in _METRIC_ORDER if m in ours] + sorted(m for m in ours if m not in _METRIC_ORDER)

    def diff(a, b):
        return _num(a - b) if isinstance(a, (int, float)) and isinstance(b, (int, float)) else _num(None)
    out.append(_table(["metric", "candidate", label, "candidate - production"],
                      [[_e(m), _num(ours.get(m)), _num(theirs.get(m)), diff(ours.get(m), theirs.get(m))]
                       for m in names], numeric=(1, 2, 3)))
    by_name = {c.get("class_name"): c for c in their_classes if isinstance(c, dict)}
    out.append("<h3>Per class</h3>")
    out.append(_table(["class", "candidate F1", "production F1", "candidate recall", "production recall",
                       "support"], [
        [_e(c.get("class_name")), _num(c.get("f1")), _num(by_name.get(c.get("class_name"), {}).get("f1")),
         _num(c.get("recall")), _num(by_name.get(c.get("class_name"), {}).get("recall")), _num(c.get("support"))]
        for c in evaluation.get("per_class") or []], numeric=(1, 2, 3, 4, 5)))
    return "\n".join(out)


#: Slice values a report lists per column (the most rows first); evaluation.json holds them all.
SLICE_VALUES_SHOWN = 50


def _slices_section(sliced):
    """One row per slice value: rows, the gate's metric of both models, and the floor's verdict."""
    metric, floor, min_rows = sliced.get("metric"), sliced.get("floor"), sliced.get("min_rows")
    below = set(sliced.get("below_floor") or [])
    out = ["<p>%s per slice value of this run's eval split%s.</p>" % (
        _e(metric), "; floor %s for the slices of at least %s rows" % (_num(floor), _e(min_rows)) if floor else "")]
    rows, hidden = [], 0
    for column in sliced.get("columns") or []:
        entries = [e for e in sliced.get("values") or [] if e.get("column") == column.get("column")]
        shown = sorted(entries, key=lambda e: -e.get("rows", 0))[:SLICE_VALUES_SHOWN]
        hidden += len(entries) - len(shown)
        for entry in [e for e in entries if e in shown]:
            name = slices.slice_name(entry)
            verdict = '<span class="flag">below the floor</span>' if name in below else ""
            rows.append([_e(entry.get("column")), _e(name[len(entry.get("column")) + 1:]),
                         _num(entry.get("rows")), _num((entry.get("candidate") or {}).get(metric)),
                         _num((entry.get("production") or {}).get(metric)), verdict])
    out.append(_table(["column", "value", "rows", "candidate %s" % metric, "production %s" % metric, "floor"],
                      rows, numeric=(2, 3, 4)))
    if hidden:
        out.append("<p class=\"muted\">%d more slice values with fewer rows are in evaluation.json</p>" % hidden)
    return "\n".join(out)


_HYPERPARAMETERS = ("model", "epochs", "batch_size", "learning_rate", "optimizer",
                    "learning_rate_schedule", "learning_rate_warmup_epochs", "mixed_precision",
                    "warm_start", "seed", "early_stopping_patience", "gradient_clip_norm",
                    "class_weight")


def _training_section(history, attempts, evaluation, pngs, training):
    out = []
    if training:
        out.append(_pairs([(k, _e(training[k])) for k in _HYPERPARAMETERS if k in training]))
    out += [_img(pngs["loss"], "training and validation loss per epoch"),
           _img(pngs["accuracy"], "training and validation accuracy per epoch")]
    points = resume_points(history, attempts)
    if points:
        out.append("<p>%s</p>" % _e("; ".join("%s (from epoch %s)" % (p["label"], p["epoch"])
                                            for p in points)))
    final = evaluation.get("final") or {}
    if final:
        out.append("<p>final weights: %s epochs, %s steps (try %s)</p>" % (
            _e(final.get("epochs")), _e(final.get("steps")), _e(final.get("try_number"))))
    if final.get("best_epoch"):
        out.append("<p>early stopping: %s; the final weights are those of epoch %s, the best by %s</p>" % (
            "stopped after epoch %s" % _e(final.get("epochs")) if final.get("stopped_early")
            else "ran every epoch", _e(final.get("best_epoch")),
            _e((training or {}).get("early_stopping_monitor", "the monitored figure"))))
    out.append(_table(["epoch", "try", "loss", "accuracy", "val_loss", "val_accuracy",
                       "seconds"], [
        [_e(r.get("epoch")), _e(r.get("try_number")), _num(r.get("loss")),
         _num(r.get("accuracy")), _num(r.get("val_loss")), _num(r.get("val_accuracy")),
         _num(r.get("seconds"), 1)] for r in history], numeric=(2, 3, 4, 5, 6)))
    return "\n".join(out)


def _duration(seconds):
    if not _is_number(seconds):
        return "-"
    minutes, rest = divmod(int(round(seconds)), 60)
    return "%d min %02d s" % (minutes, rest) if minutes else "%d s" % rest


def _setting(value):
    """A tuned setting's value as set (``%g``: 0.0003 and 3e-05, not 0.0000)."""
    return _e("%g" % value) if isinstance(value, float) else _e("-" if value is None else value)


def _trials_section(selection):
    """The sweep's trials (``selection.json``): a table with the chosen row marked, then the metric
    against each tuned setting."""
    metric, chosen = selection.get("metric"), (selection.get("chosen") or {}).get("index")
    trials = [t for t in selection.get("trials") or [] if isinstance(t, dict)]
    names = _tuned_settings(selection)
    out = ["<p>%d trial(s), %s search; trial %s chosen by %s (%s): %s.</p>" % (
        len(trials), _e(selection.get("search")), _e(chosen), _e(metric),
        "higher is better" if selection.get("goal") == "max" else "lower is better",
        _num((selection.get("chosen") or {}).get("value")))]
    rows = []
    for t in trials:
        mark = '<span class="flag">chosen</span>' if t.get("index") == chosen else ""
        rows.append([mark, _e(t.get("index"))] + [_setting((t.get("params") or {}).get(name)) for name in names]
                    + [_num(t.get("value")), _e(t.get("status")), _num(t.get("epochs")),
                       _e(_duration(t.get("seconds")))])
    out.append(_table(["", "trial"] + names + [metric, "status", "epochs", "time"], rows,
                      numeric=tuple(range(1, len(names) + 5))))
    for name in names:
        out.append(_img(plot_trials(name, trials, metric, chosen), "%s by %s" % (metric, name)))
    return "\n".join(out)


def _splits(by_split):
    return [s for s in ("train", "eval") if s in by_split] + sorted(
        s for s in by_split if s not in ("train", "eval"))


#: Vocabulary values a report shows per column; the whole list is in schema.json.
VOCABULARY_SHOWN = 8


def _column_row(feature):
    """A row of the report's column table: a feature's type, origin, missing cells and encoding."""
    missing = feature.get("missing") or {}
    if feature.get("type") != "categorical":
        encoding = "-"
    elif feature.get("encoding") == "hash":
        encoding = "hashed into %s buckets (more than %s distinct values)" % (
            feature.get("hash_bins"), feature.get("distinct_above"))
    else:
        vocabulary = feature.get("vocabulary") or []
        shown = ", ".join(vocabulary[:VOCABULARY_SHOWN]) + (", ..." if len(vocabulary) > VOCABULARY_SHOWN else "")
        encoding = "vocabulary of %d (of %s distinct): %s; %s train value(s) out of it" % (
            len(vocabulary), feature.get("distinct"), shown, feature.get("oov_train", 0))
    return [_e(feature.get("name")), _e(feature.get("type")), _e(feature.get("source", "-")),
            _num(missing.get("train")), _num(missing.get("eval")), _e(encoding)]


def _data_section(schema, stats, evaluation, dataset):
    schema = schema or {}
    fingerprint = schema.get("fingerprint") or evaluation.get("fingerprint") or \
        (dataset or {}).get("fingerprint")
    counts = schema.get("counts") or {}
    rows = [("fingerprint", "<code>%s</code>" % _e(fingerprint)),
            ("format", _e(schema.get("format"))),
            ("examples", _e(", ".join("%s %s" % (counts[s], s) for s in _splits(counts))
                            if counts else "-"))]
    if schema.get("image"):
        image = schema["image"]
        rows.append(("image", _e("%sx%s, %s channel(s)" % (image.get("height"),
                                                          image.get("width"),
                                                          image.get("channels")))))
    elif schema.get("features"):
        rows.append(("features", _e(", ".join(str(f.get("name")) for f in schema["features"]))))
    if schema.get("ignored"):
        rows.append(("ignored columns", _e(", ".join(schema["ignored"]))))
    dropped = (schema.get("dropped_rows") or {}).get("count")
    if dropped:
        rows.append(("rows dropped (missing label)", _e("%d, e.g. line(s) %s" % (dropped, ", ".join(
            str(n) for n in schema["dropped_rows"].get("first_lines") or [])))))
    out = [_pairs(rows)]
    if any("missing" in f for f in schema.get("features") or []):
        out.append("<h3>Columns</h3>")
        out.append(_table(["column", "type", "from", "missing (train)", "missing (eval)", "encoding"],
                          [_column_row(f) for f in schema["features"]], numeric=(3, 4)))
    names = schema.get("class_names") or evaluation.get("class_names") or []
    histogram = (stats or {}).get("class_histogram") or {}
    splits = _splits(histogram)
    if names and splits:
        out.append("<h3>Class histogram</h3>")
        table_rows = []
        for c, name in enumerate(names):
            cells = [_e(name)]
            for split in splits:
                values = histogram[split]
                cells.append(_num(values[c] if c < len(values) else None))
            table_rows.append(cells)
        out.append(_table(["class"] + splits, table_rows,
                          numeric=tuple(range(1, len(splits) + 1))))
    return "\n".join(out)


def _lineage_section(run, attempts, model_name):
    run = run or {}
    rows = [("DAG", _e(run.get("dag_id"))), ("run", _e(run.get("run_id"))),
            ("evaluate task", "%s (try %s)" % (_e(run.get("task_id")), _e(run.get("try_number")))),
            ("image", _e(run.get("image"))),
            ("image content id", _e(os.environ.get("TFPIPE_IMAGE_ID"))),
            ("model name", _e(model_name))]
    out = [_pairs(rows), "<h3>Training attempts</h3>"]

    def origin(attempt):
        resumed = attempt.get("resumed_from")
        if resumed:
            return "epoch %s, step %s (%s)" % (_e(resumed.get("epoch")), _e(resumed.get("step")),
                                               _e(os.path.basename(
                                                   str(resumed.get("checkpoint") or ""))))
        warm = attempt.get("warm_start")
        if warm:
            return "scratch, warm start from version %s" % _e(warm.get("version"))
        return "scratch"
    out.append(_table(["try", "status", "resumed from", "start", "end", "epochs run",
                       "steps run", "error"], [
        [_e(a.get("try_number")), _e(a.get("status")), origin(a), _e(a.get("start_time")),
         _e(a.get("end_time")), _num(a.get("epochs_run")), _num(a.get("steps_run")),
         _e(a.get("error"))] for a in attempts], numeric=(5, 6)))
    return "\n".join(out)


def _check_row(record):
    where = "(data set)" if record.get("column") is None else record.get("column")
    threshold = record.get("threshold")
    if isinstance(threshold, list):
        threshold = " .. ".join(_num(t) for t in threshold)
    else:
        threshold = _num(threshold)
    flag = '<span class="flag">FLAGGED</span>' if not record.get("ok") else "ok"
    return [flag, _e(where), _e(record.get("check")), _num(record.get("value")), threshold,
            _e(record.get("detail"))]


def _data_check_section(validation):
    """The "Data check" section of ``validation.json``: decision, baseline, the checks (flagged
    first), what could not be checked, and one plot per flagged column."""
    decision = validation.get("decision") or "-"
    baseline = validation.get("baseline")
    if validation.get("same_data"):
        base_text = "version %s: the same data set (%s)" % (_e(baseline.get("version")), _e(baseline.get("fingerprint")))
    elif baseline:
        base_text = "version %s, data set <code>%s</code>" % (_e(baseline.get("version")),
                                                             _e(baseline.get("fingerprint")))
    else:
        base_text = "none: %s" % _e(validation.get("no_baseline_reason"))
    records = [r for r in validation.get("checks") or [] if isinstance(r, dict)]
    flagged = [r for r in records if not r.get("ok")]
    rows = [("decision", '<span class="decision %s">%s</span>' % (
                "blessed" if decision == "passed" else "not-blessed", _e(decision.upper()))),
            ("baseline (production data set)", base_text),
            ("tonight's data set", "<code>%s</code>" % _e(validation.get("fingerprint"))),
            ("checks", "%d, %d flagged" % (len(records), len(flagged)))]
    if validation.get("accepted"):
        rows.append(("accepted", "yes: accept_data_change let the run go on despite the anomalies"))
    out = [_pairs(rows)]
    if records:
        ordered = flagged + [r for r in records if r.get("ok")]
        out.append(_table(["", "column", "check", "value", "threshold", "detail"],
                          [_check_row(r) for r in ordered], numeric=(3, 4)))
    skipped = [s for s in validation.get("skipped") or [] if isinstance(s, dict)]
    if skipped:
        out.append("<h3>Not checked</h3>")
        out.append(_table(["column", "check", "why"], [
            [_e("(data set)" if s.get("column") is None else s.get("column")), _e(s.get("check")), _e(s.get("why"))]
            for s in skipped]))
    for warning in validation.get("warnings") or []:
        out.append('<p class="muted">%s</p>' % _e(warning))
    distributions = validation.get("distributions") or {}
    for column in sorted(distributions):
        out.append("<h3>%s</h3>" % _e(column))
        out.append(_img(plot_distribution(column, distributions[column]),
                        "%s: baseline and tonight's distribution" % column))
    return "\n".join(out)


def data_check_plot_count(validation):
    """The plots the "Data check" section of ``validation`` embeds (one per flagged column)."""
    return len((validation or {}).get("distributions") or {})


def render_html(pngs, evaluation, blessing, history, attempts, run=None, schema=None,
                stats=None, dataset=None, model_name=None, training=None, generated=None,
                validation=None, selection=None):
    """The self-contained HTML report (a string); a "Trials" section when ``selection``, a "Data
    check" section when ``validation``."""
    run = run or {}
    generated = generated or datetime.datetime.now(datetime.timezone.utc).replace(
        microsecond=0).isoformat()
    title = "tfpipe run report: %s / %s" % (run.get("dag_id"), run.get("run_id"))
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>%s</title>" % _e(title),
        "<style>%s</style>" % _CSS,
        "</head>",
        "<body>",
        "<h1>%s</h1>" % _e(title),
        '<p class="muted">generated %s</p>' % _e(generated),
        "<h2>Blessing decision</h2>", _decision_section(blessing, evaluation),
        "<h2>Evaluation metrics</h2>", _metrics_section(evaluation),
        "<h2>Champion vs challenger</h2>", _champion_section(evaluation),
    ] + (["<h2>Slices</h2>", _slices_section(evaluation["slices"])] if evaluation.get("slices") else []) + [
        "<h2>Confusion matrix</h2>",
        _img(pngs["confusion_matrix"], "confusion matrix of the eval split"),
        "<h2>Training</h2>", _training_section(history, attempts, evaluation, pngs, training),
    ] + (["<h2>Trials</h2>", _trials_section(selection)] if selection else []) + (
        ["<h2>Data check</h2>", _data_check_section(validation)] if validation else []) + [
        "<h2>Data</h2>", _data_section(schema, stats, evaluation, dataset),
        "<h2>Lineage</h2>", _lineage_section(run, attempts, model_name),
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(parts)


def write_report(run_dir, config=None, evaluation=None, blessing=None, schema=None, stats=None):
    """Write the plots and ``report.html`` into ``run_dir``; return ``{"report", "plots"}``.

    Whatever is not passed is read from the run directory: ``evaluation.json``,
    ``blessing.json``, ``config/evaluate.json`` (run identity); ``metrics.json``,
    ``attempts.json`` and, after a sweep, ``selection.json`` always are. Raises on any failure (the
    caller decides that a report is never a reason to fail a run).
    """
    if evaluation is None:
        evaluation = _read(run_dir, contract.EVALUATION_FILE, default={})
    if blessing is None:
        blessing = _read(run_dir, contract.BLESSING_FILE)
    if config is None:
        config = _read(contract.stage_config_path(run_dir, "evaluate"), default={})
    history = [r for r in _read(run_dir, contract.METRICS_FILE, default=[]) or []
               if isinstance(r, dict)]
    attempts = [a for a in _read(run_dir, contract.ATTEMPTS_FILE, default=[]) or []
                if isinstance(a, dict)]
    pngs = render_plots(history, attempts, evaluation)
    text = render_html(pngs, evaluation, blessing, history, attempts, run=config.get("run"),
                       schema=schema, stats=stats, dataset=_read(run_dir, "dataset.json"),
                       model_name=(config.get("export") or {}).get("model_name"),
                       training=config.get("training"),
                       validation=_read(run_dir, contract.VALIDATION_FILE),
                       selection=_read(run_dir, contract.SELECTION_FILE))
    plots = []
    for plot in PLOTS:
        path = os.path.join(run_dir, plot_name(plot))
        atomic.write_bytes(path, pngs[plot])
        plots.append(path)
    path = os.path.join(run_dir, REPORT_NAME)
    atomic.write_text(path, text)
    return {"report": path, "plots": plots}


def render_data_check_html(validation, run=None, schema=None, stats=None, dataset=None, generated=None):
    """The self-contained HTML report of a data check alone (the validate stage's), a string."""
    run = run or {}
    generated = generated or datetime.datetime.now(datetime.timezone.utc).replace(
        microsecond=0).isoformat()
    title = "tfpipe data check: %s / %s" % (run.get("dag_id"), run.get("run_id"))
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>%s</title>" % _e(title), "<style>%s</style>" % _CSS, "</head>", "<body>",
        "<h1>%s</h1>" % _e(title),
        '<p class="muted">generated %s by the validate task (try %s), before training</p>' % (
            _e(generated), _e(run.get("try_number"))),
        "<h2>Data check</h2>", _data_check_section(validation),
        "<h2>Data</h2>", _data_section(schema, stats, {}, dataset),
        "</body>", "</html>", ""])


def write_data_check_report(run_dir, validation, config=None, schema=None, stats=None):
    """Write ``report.html`` of a data check into ``run_dir``; return ``{"report", "plot_count"}``.

    Its plots are embedded only: the evaluate stage's report, which replaces this one when the run
    goes on, embeds them again. Raises on any failure (the caller decides it never fails a run).
    """
    text = render_data_check_html(validation, run=(config or {}).get("run"), schema=schema, stats=stats,
                                  dataset=_read(run_dir, "dataset.json"))
    path = os.path.join(run_dir, REPORT_NAME)
    atomic.write_text(path, text)
    return {"report": path, "plot_count": data_check_plot_count(validation)}


def remove_data_check_report(run_dir):
    """Delete an earlier try's data check report: before the run has an evaluation, ``report.html``
    can only be one, and a data check without anomalies writes none."""
    if not os.path.exists(os.path.join(run_dir, contract.EVALUATION_FILE)):
        try:
            os.remove(os.path.join(run_dir, REPORT_NAME))
        except OSError:
            pass
