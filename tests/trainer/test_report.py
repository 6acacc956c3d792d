"""The run report: plots and a self-contained report.html from evaluate, shipped by export."""

import base64
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from html.parser import HTMLParser

import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow  # noqa: E402,F401

from conftest import SWEEP_TRIALS, write_blobs_csv  # noqa: E402
from trainer import atomic, contract, evaluate, export, prep, report, select, train  # noqa: E402
from trainer.errors import NotBlessed  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
PLOT_FILES = ["loss.png", "accuracy.png", "confusion_matrix.png"]


class Checker(HTMLParser):
    """Records tag balance problems, the text and the <img> sources of a document."""

    def __init__(self):
        HTMLParser.__init__(self, convert_charrefs=True)
        self.stack, self.problems, self.text, self.images, self.tags = [], [], [], [], set()
        self.image_tags = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])
            self.image_tags.append(attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append("</%s> closes <%s>" % (tag, self.stack[-1:] or None))
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(path):
    """Parse an HTML file; assert it is balanced; return the checker (``.text`` joined)."""
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    checker = Checker()
    checker.feed(source)
    checker.close()
    assert checker.problems == [] and checker.stack == [], (checker.problems, checker.stack)
    checker.text = " ".join(" ".join(checker.text).split())
    checker.source = source
    return checker


def check_png(path):
    from PIL import Image

    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == PNG_SIGNATURE, path
    with Image.open(path) as image:
        image.load()
        assert image.format == "PNG"
        assert image.size[0] > 100 and image.size[1] > 100, image.size
    return data


def check_self_contained(page):
    assert page.source.count("data:image/png;base64,") == 3
    assert len(page.images) == 3 and all(s.startswith("data:image/png;base64,")
                                         for s in page.images)
    assert not page.tags & {"script", "link", "iframe", "object"}
    assert not re.search(r"(src|href)=\"(?!data:)", page.source)
    assert "url(" not in page.source and "@import" not in page.source


@pytest.mark.integration
@pytest.mark.resume
def test_report_of_a_resumed_run_is_written_and_exported(ws):
    write_blobs_csv(os.path.join(ws.data, "blobs.csv"), string_labels=True)
    prep.run(ws.config("prep"))
    train.run(ws.config("train", training={"epochs": 2}))
    train.run(ws.config("train", try_number=2, training={"epochs": 3}))  # resumes at step 16
    history = ws.read("metrics.json")
    assert [(h["epoch"], h["try_number"]) for h in history] == [(1, 1), (2, 1), (3, 2)]
    assert report.resume_points(history, ws.read("attempts.json")) == [
        {"epoch": 3, "try_number": 2, "label": "try 2 resumed at step 16"}]

    result = evaluate.run(ws.config("evaluate", training={"epochs": 3}))
    run_dir = ws.run_dir()
    assert result["report"] == os.path.join(run_dir, "report.html")
    assert result["plots"] == [os.path.join(run_dir, n) for n in PLOT_FILES]
    pngs = [check_png(p) for p in result["plots"]]

    page = parse(result["report"])
    check_self_contained(page)
    assert [base64.b64decode(s.split(",", 1)[1]) for s in page.images] == [
        pngs[2], pngs[0], pngs[1]]  # confusion matrix, loss, accuracy: the files' bytes
    evaluation, blessing = ws.read("evaluation.json"), ws.read("blessing.json")
    for name in ("accuracy", "loss", "macro_precision", "macro_recall", "macro_f1", "auc"):
        assert "%.4f" % evaluation["metrics"][name] in page.text, name
    for row in evaluation["per_class"]:
        assert "%s %.4f %.4f %.4f %.4f %d" % (row["class_name"], row["precision"], row["recall"], row["f1"],
                                               row["auc"], row["support"]) in page.text
    assert "BLESSED" in page.text and "NOT BLESSED" not in page.text
    assert blessing["reason"] in page.text and "threshold 0.8000" in page.text
    assert "none (no earlier exported version)" in page.text
    schema = json.load(open(os.path.join(ws.work, "datasets", evaluation["fingerprint"],
                                         "schema.json")))
    assert schema["class_names"] == ["cat", "dog", "eel"]
    stats = json.load(open(os.path.join(ws.work, "datasets", evaluation["fingerprint"],
                                        "stats.json")))
    hist = stats["class_histogram"]
    for c, name in enumerate(schema["class_names"]):
        assert "%s %d %d" % (name, hist["train"][c], hist["eval"][c]) in page.text
    assert evaluation["fingerprint"] in page.text
    for text in (ws.dag_id, ws.run_id, "tfpipe/trainer:test", "try 2 resumed at step 16",
                 "epoch 2, step 16 (ckpt-16)", "completed"):
        assert text in page.text, text

    exported = export.run(ws.config("export", training={"epochs": 3}))
    version = exported["model_dir"]
    assert exported["report"] == os.path.join(version, "report", "report.html")
    assert sorted(os.listdir(os.path.join(version, "report"))) == sorted(
        PLOT_FILES + ["report.html"])
    for name in PLOT_FILES + ["report.html"]:
        with open(os.path.join(version, "report", name), "rb") as a, \
                open(os.path.join(run_dir, name), "rb") as b:
            assert a.read() == b.read(), name
    meta = json.load(open(os.path.join(version, "metadata.json")))
    assert meta["report"] == {"html": "report/report.html",
                              "plots": ["report/%s" % n for n in PLOT_FILES]}


def test_a_candidate_that_is_not_blessed_gets_a_report_too(trained):
    with pytest.raises(NotBlessed) as info:
        evaluate.run(trained.config("evaluate", evaluation={"threshold": 1.01}))
    result = info.value.result
    assert result["report"] == os.path.join(trained.run_dir(), "report.html")
    assert len(result["plots"]) == 3 and all(os.path.isfile(p) for p in result["plots"])
    page = parse(result["report"])
    check_self_contained(page)
    assert "NOT BLESSED" in page.text and "below the threshold 1.0100" in page.text
    assert "threshold 1.0100" in page.text


def test_a_report_failure_never_fails_the_run(trained, monkeypatch, capsys):
    import matplotlib.figure

    evaluate.run(trained.config("evaluate"))  # a first try leaves a report ...
    assert os.path.isfile(os.path.join(trained.run_dir(), "report.html"))

    def broken(self, *args, **kwargs):
        raise RuntimeError("injected matplotlib failure")
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", broken)
    capsys.readouterr()
    result = evaluate.run(trained.config("evaluate", try_number=2))
    out = capsys.readouterr().out
    assert result["blessed"] is True and result["report"] is None and result["plots"] == []
    assert "WARNING run report not written (RuntimeError: injected matplotlib failure)" in out
    # ... which is removed: never a report that contradicts the newest blessing.json
    assert report.report_files(trained.run_dir()) == []
    exported = export.run(trained.config("export"))
    assert exported["report"] is None
    assert not os.path.exists(os.path.join(exported["model_dir"], "report"))
    assert json.load(open(os.path.join(exported["model_dir"], "metadata.json")))["report"] is None


def test_the_evaluate_report_shows_the_data_check_of_a_run_that_went_on(trained):
    """A run whose data gate warned and went on: evaluate's report has the "Data check" section, its
    flagged checks and the plot of each flagged column, besides its own three plots."""
    from trainer import validate

    pointer = trained.read("dataset.json")
    tonight_dir = os.path.join(trained.work, "datasets", pointer["fingerprint"])
    base_dir = os.path.join(trained.work, "datasets", "baseline")
    shutil.copytree(tonight_dir, base_dir)
    schema = atomic.read_json(os.path.join(base_dir, "schema.json"))
    schema.update(fingerprint="baseline", features=schema["features"][:-1])  # tonight's last column is new
    atomic.write_json(os.path.join(base_dir, "schema.json"), schema)
    stats = atomic.read_json(os.path.join(base_dir, "stats.json"))
    stats["class_histogram"] = {"train": [200, 20, 20], "eval": [50, 5, 5]}  # the classes were skewed
    atomic.write_json(os.path.join(base_dir, "stats.json"), stats)
    atomic.write_json(os.path.join(trained.models, "blobs", "1", "metadata.json"), {
        "dag_id": trained.dag_id, "run_id": "an earlier run", "data": {"fingerprint": "baseline"},
        "evaluation": {"blessing": {"blessed": True}}})
    config = trained.config("validate")
    config["validation"] = {"on_anomaly": "warn"}
    checked = validate.run(config)
    assert checked["decision"] == "warned"
    assert [(a["column"], a["check"]) for a in checked["anomalies"]] == [(None, "label_drift"), ("f3", "column_new")]

    result = evaluate.run(trained.config("evaluate"))
    page = parse(result["report"])
    assert len(page.images) == 4 and page.source.count("data:image/png;base64,") == 4
    assert "Data check" in page.text and "WARNED" in page.text
    assert "FLAGGED (data set) label_drift" in page.text and "FLAGGED f3 column_new" in page.text
    assert page.text.index("Data check") < page.text.index("Class histogram")
    assert "(label): baseline and tonight's distribution" in [dict(a)["alt"] for a in page.image_tags]


@pytest.mark.integration
def test_the_report_of_a_sweep_lists_its_trials_with_the_chosen_one_marked(swept):
    """After a sweep, evaluate's report has a "Trials" section: a row per trial (its setting, the metric,
    status, epochs, time) with the chosen one marked, and one plot of the metric by the tuned setting."""
    chosen = select.run(swept.select_config(SWEEP_TRIALS))
    page = parse(evaluate.run(swept.config("evaluate", evaluation={"threshold": 0.0}))["report"])
    assert len(page.images) == 4 and "val_accuracy by model_kwargs.hidden_units" in [
        dict(a)["alt"] for a in page.image_tags]
    trials = page.text[page.text.index("Trials"):page.text.index("Data ")]
    assert "2 trial(s), grid search; trial %d chosen by val_accuracy (higher is better): %.4f." % (
        chosen["chosen"], chosen["value"]) in trials
    assert "trial model_kwargs.hidden_units val_accuracy status epochs time" in trials
    for trial in swept.read(contract.SELECTION_FILE)["trials"]:
        row = "%d %s %.4f completed 2 %d s" % (trial["index"], trial["params"]["model_kwargs.hidden_units"],
                                               trial["value"], round(trial["seconds"]))
        assert ("chosen " + row if trial["index"] == chosen["chosen"] else row) in trials, (row, trials)


def test_the_trials_section_shows_unfinished_trials_and_plots_each_setting(tmp_path):
    """Every trial is listed, a failed one without a figure; each tuned setting gets its plot (numbers
    as set, spanning decades; texts as categories); the section comes after Training."""
    run_dir = str(tmp_path / "run")
    trials = [{"index": 0, "params": {"learning_rate": 0.0001, "optimizer": "adam"}, "status": "completed",
               "value": 0.5, "epochs": 3, "seconds": 61.4},
              {"index": 1, "params": {"learning_rate": 0.1, "optimizer": "<sgd>"}, "status": "completed",
               "value": 0.75, "epochs": 3, "seconds": 9.0},
              {"index": 2, "params": {"learning_rate": 0.01, "optimizer": "adam"}, "status": "failed",
               "value": None, "epochs": 1, "seconds": 2.0}]
    atomic.write_json(os.path.join(run_dir, contract.SELECTION_FILE), {
        "metric": "val_loss", "goal": "min", "search": "random", "trials": trials,
        "chosen": {"index": 0, "params": trials[0]["params"], "value": 0.5}})
    page = parse(report.write_report(run_dir, evaluation={}, blessing=None)["report"])
    assert len(page.images) == 5
    assert {dict(a)["alt"] for a in page.image_tags} >= {"val_loss by learning_rate", "val_loss by optimizer"}
    text = page.text
    assert text.index("Training") < text.index("Trials") < text.index("Lineage")
    trials_text = text[text.index("Trials"):text.index("Data ")]
    assert "3 trial(s), random search; trial 0 chosen by val_loss (lower is better): 0.5000." in trials_text
    assert "chosen 0 0.0001 adam 0.5000 completed 3 1 min 01 s" in trials_text
    assert "1 0.1 <sgd> 0.7500 completed 3 9 s" in trials_text and "&lt;sgd&gt;" in page.source
    assert "2 0.01 adam - failed 1 2 s" in trials_text


def test_report_text_is_escaped_and_odd_class_names_plot(tmp_path):
    run_dir = str(tmp_path / "run")
    names = ["<script>alert(1)</script>", "$x$ & \"y\"", "a_b"]
    per_class = [{"class_id": i, "class_name": n, "precision": 0.5, "recall": 0.25, "f1": 0.3,
                  "support": 4} for i, n in enumerate(names)]
    atomic.write_json(os.path.join(run_dir, "evaluation.json"), {
        "metrics": {"accuracy": 0.5, "loss": 1.25}, "per_class": per_class,
        "confusion_matrix": [[2, 1, 1], [1, 2, 1], [0, 1, 3]], "class_names": names,
        "examples": 12, "fingerprint": "f" * 64})
    atomic.write_json(os.path.join(run_dir, "blessing.json"), {
        "blessed": False, "decision": "not blessed", "reason": "<b>bad</b> & worse",
        "metric": "accuracy", "candidate": {"value": 0.5}, "baseline": {
            "version": 7, "value": 0.9}, "threshold": 0.3, "tolerance": 0.01})
    atomic.write_json(os.path.join(run_dir, "config", "evaluate.json"), {
        "run": {"dag_id": "<dag>", "run_id": "r&1", "task_id": "evaluate", "try_number": 1,
                "image": "img\"quote"}, "export": {"model_name": "m"}})
    atomic.write_json(os.path.join(run_dir, "attempts.json"), [
        {"try_number": 1, "status": "failed", "resumed_from": None, "error": "<oops>"},
        {"try_number": 3, "status": "completed", "resumed_from": None}])
    atomic.write_json(os.path.join(run_dir, "metrics.json"), [
        {"epoch": 1, "try_number": 1, "loss": 2.0, "accuracy": 0.3, "val_loss": 2.1,
         "val_accuracy": 0.2},
        {"epoch": 2, "try_number": 3, "loss": 1.0, "accuracy": 0.6, "val_loss": 1.2,
         "val_accuracy": 0.5}])
    written = report.write_report(run_dir)
    for path in written["plots"]:
        check_png(path)
    page = parse(written["report"])
    check_self_contained(page)
    source = page.source
    assert "<script" not in source and "<b>bad" not in source and "<oops>" not in source
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in source and "&lt;dag&gt;" in source
    assert "$x$ &amp; &quot;y&quot;" in source and "img&quot;quote" in source
    assert "<b>bad</b> & worse" in page.text and "try 3 restarted" in page.text
    assert "version 7: 0.9000" in page.text and "0.8900" in page.text  # baseline - tolerance
    # no history and no attempts at all: placeholders, still three plots
    os.remove(os.path.join(run_dir, "metrics.json"))
    os.remove(os.path.join(run_dir, "attempts.json"))
    written = report.write_report(run_dir)
    check_self_contained(parse(written["report"]))
    for path in written["plots"]:
        check_png(path)


def test_matplotlib_reads_the_font_list_built_into_the_image():
    # Rebuilding the list costs every evaluate stage about 0.25 s: the image's list must be used,
    # without a writable HOME, and by any other --user the operator picks (a sticky, writable
    # directory, as matplotlib only uses a writable one).
    code = ("import logging, matplotlib\n"
            "logging.basicConfig(level=logging.DEBUG)\n"
            "from matplotlib import font_manager\n"
            "print('CACHEDIR', matplotlib.get_cachedir())\n")
    proc = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, HOME="/nonexistent"),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          universal_newlines=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "CACHEDIR /opt/tfpipe/matplotlib" in proc.stdout, proc.stdout + proc.stderr
    assert "Using fontManager instance from /opt/tfpipe/matplotlib/fontlist-v" in proc.stderr
    assert "generated new fontManager" not in proc.stderr
    assert stat.S_IMODE(os.stat("/opt/tfpipe/matplotlib").st_mode) == 0o1777


def test_champion_and_slice_sections_show_both_models_escaped_and_bounded(tmp_path):
    """The "Champion vs challenger" section puts the candidate beside the production model (overall and
    per class), or says why the production model could not score this run's data and shows its recorded
    figures; the "Slices" section lists each slice value (texts escaped, missing as "(missing)") with
    both models' metric, flags a value below the floor, and lists at most SLICE_VALUES_SHOWN values per
    column, the most rows first, saying how many more evaluation.json holds."""
    run_dir = str(tmp_path / "run")
    per_class = [{"class_id": i, "class_name": n, "precision": 0.5, "recall": 0.25 + i / 10.0, "f1": 0.3 + i / 10.0,
                  "support": 4} for i, n in enumerate(["no", "yes"])]
    theirs = [dict(c, f1=0.11 + c["class_id"] / 100.0, recall=0.21) for c in per_class]
    many = [{"column": "city", "value": "c%03d" % i, "rows": 100 + i, "candidate": {"accuracy": 0.5},
             "production": {"accuracy": 0.25}} for i in range(report.SLICE_VALUES_SHOWN + 3)]
    values = [{"column": "plan", "value": "<b>gold</b>", "rows": 40, "candidate": {"accuracy": 0.6125},
               "production": {"accuracy": 0.8125}},
              {"column": "plan", "value": None, "rows": 7, "candidate": {"accuracy": 0.9375}, "production": None}]
    evaluation = {"metrics": {"accuracy": 0.75, "loss": 0.5}, "per_class": per_class,
                  "confusion_matrix": [[3, 1], [1, 3]], "class_names": ["no", "yes"], "examples": 8,
                  "baseline": {"version": 4, "same_split": True, "why": None, "examples": 8,
                               "metrics": {"accuracy": 0.625, "loss": 0.75}, "per_class": theirs},
                  "slices": {"columns": [{"column": "plan", "kind": "text", "buckets": None},
                                         {"column": "city", "kind": "text", "buckets": None}],
                             "metric": "accuracy", "floor": 0.7, "min_rows": 30,
                             "below_floor": ["plan=<b>gold</b>"], "values": values + many}}
    blessing = {"blessed": False, "decision": "not blessed", "reason": "slice", "metric": "accuracy",
                "candidate": {"value": 0.75}, "threshold": 0.5, "tolerance": 0.01,
                "baseline": {"version": 4, "value": 0.625, "recorded_value": 0.875, "same_split": True}}
    page = parse(report.write_report(run_dir, evaluation=evaluation, blessing=blessing)["report"])
    text, source = page.text, page.source
    champion = text[text.index("Champion vs challenger"):text.index("Slices")]
    assert "production v4" in champion and "accuracy 0.7500 0.6250 0.1250" in champion
    assert "yes 0.4000 0.1200 0.3500 0.2100 4" in champion
    assert "version 4: 0.6250 on this run's eval split (recorded 0.8750)" in text
    sliced = text[text.index("Slices"):text.index("Confusion matrix")]
    assert "plan <b>gold</b> 40 0.6125 0.8125 below the floor" in sliced and "<b>gold" not in source
    assert "plan (missing) 7 0.9375 -" in sliced
    assert "c052 152" in sliced and "c000 " not in sliced and "c003 103" in sliced
    assert "3 more slice values with fewer rows are in evaluation.json" in sliced
    # a production model that could not score this run's data: why, and its recorded figures
    evaluation["baseline"] = {"version": 4, "same_split": False, "why": "its column(s) 'plan' are not in this run's data",
                              "recorded": {"metrics": {"accuracy": 0.875}, "per_class": theirs}}
    blessing["baseline"].update(value=0.875, same_split=False, why=evaluation["baseline"]["why"])
    text = parse(report.write_report(run_dir, evaluation=evaluation, blessing=blessing)["report"]).text
    champion = text[text.index("Champion vs challenger"):text.index("Slices")]
    assert "production version 4 cannot score this run's data: its column(s) 'plan' are not in this run's data" \
        in champion and "production v4 (recorded)" in champion and "accuracy 0.7500 0.8750 -0.1250" in champion
    assert "version 4: 0.8750 recorded, since it cannot score this run's data: its column(s)" in text
