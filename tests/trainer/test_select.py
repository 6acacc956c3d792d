"""The select stage of a sweep: which trial it picks, what it reports, and how it promotes it.

Most tests lay out the trials' directories as the train stage leaves them (``final.json``,
``attempts.json``, ``metrics.json``, ``config/train.json`` and a weights file), so each outcome (a
failed, diverged, killed or never started trial, a tie) is set exactly; one test runs real trials.
"""

import datetime
import json
import os

import pytest

from conftest import SWEEP_TRIALS
from trainer import common, contract, select
from trainer.errors import BadInput


def lay_out_trial(ws, index, params, accuracy=None, loss=None, status="completed", epochs=2,
                  times=(("2026-11-29T18:00:00+00:00", "2026-11-29T18:00:10+00:00"),)):
    """Write trial ``index``'s directory as training leaves it: final weights and ``final.json``
    (when ``status`` is completed, with ``final_val_accuracy`` ``accuracy`` and ``final_val_loss``
    ``loss``), one attempt per ``(start, end)`` of ``times`` (the last one ending with ``status``),
    ``epochs`` epochs of history and the trial's recorded train config."""
    directory = contract.training_dir(ws.run_dir(), index)
    trial = {"index": index, "params": params}
    attempts = [{"try_number": n + 1, "status": "interrupted", "start_time": start, "end_time": end,
                 "epochs_run": 1} for n, (start, end) in enumerate(times)]
    attempts[-1]["status"] = status
    write(os.path.join(directory, contract.ATTEMPTS_FILE), attempts)
    write(os.path.join(directory, contract.METRICS_FILE),
          [{"epoch": e + 1, "val_accuracy": accuracy, "val_loss": loss} for e in range(epochs)])
    write(contract.stage_config_path(directory, "train"), dict(ws.trial_config(trial), stage="train"))
    if status == "completed":
        final = os.path.join(directory, contract.FINAL_SUBDIR)
        write(os.path.join(final, "final.json"), {"epochs": epochs, "final_val_accuracy": accuracy,
                                                  "final_val_loss": loss})
        with open(os.path.join(final, "weights.index"), "wb") as handle:
            handle.write(b"weights of trial %d" % index)
    return trial


def write(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(obj, handle)


def read_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


PROMOTED = ["train/final/final.json", "train/final/weights.index", "metrics.json", "attempts.json",
            "config/train.json"]


def test_the_trial_with_the_highest_val_accuracy_becomes_the_runs_training_output(ws):
    trials = [lay_out_trial(ws, 0, {"learning_rate": 0.1}, accuracy=0.8, loss=0.5),
              lay_out_trial(ws, 1, {"learning_rate": 0.01}, accuracy=0.9, loss=0.6),
              lay_out_trial(ws, 2, {"learning_rate": 0.001}, accuracy=0.85, loss=0.4)]
    result = select.run(ws.select_config(trials))
    assert result == {"chosen": 1, "params": {"learning_rate": 0.01}, "metric": "val_accuracy", "value": 0.9,
                      "trials": 3, "finished": 3, "final_dir": os.path.join(ws.run_dir(), contract.FINAL_SUBDIR)}
    chosen = contract.training_dir(ws.run_dir(), 1)
    for name in PROMOTED:
        assert read_bytes(os.path.join(ws.run_dir(), name)) == read_bytes(os.path.join(chosen, name)), name
    assert ws.read("config", "train.json")[contract.TRIAL_KEY] == trials[1]
    assert sorted(os.listdir(os.path.join(ws.run_dir(), "train"))) == ["final"], "no temporary copy left"


def test_val_loss_is_minimised(ws):
    trials = [lay_out_trial(ws, 0, {"learning_rate": 0.1}, accuracy=0.8, loss=0.5),
              lay_out_trial(ws, 1, {"learning_rate": 0.01}, accuracy=0.9, loss=0.6),
              lay_out_trial(ws, 2, {"learning_rate": 0.001}, accuracy=0.85, loss=0.4)]
    result = select.run(ws.select_config(trials, metric="val_loss"))
    assert (result["chosen"], result["value"]) == (2, 0.4)
    assert ws.read(contract.SELECTION_FILE)["goal"] == "min"
    assert ws.read("train", "final", "final.json")["final_val_loss"] == 0.4


@pytest.mark.parametrize("metric", ["val_accuracy", "val_loss"])
def test_a_tie_goes_to_the_lowest_index(ws, metric):
    trials = [lay_out_trial(ws, 3, {"units": 8}, accuracy=0.7, loss=0.7),
              lay_out_trial(ws, 2, {"units": 16}, accuracy=0.9, loss=0.3),
              lay_out_trial(ws, 1, {"units": 32}, accuracy=0.9, loss=0.3)]
    assert select.run(ws.select_config(trials, metric=metric))["chosen"] == 1


def test_trials_that_did_not_finish_are_skipped_and_reported(ws, capsys):
    """A diverged, a failed, a killed (last attempt still "running"), a never started trial and a
    finished one without the figure are never chosen, even when a worse trial is the only choice; each
    is listed with how it ended, its epochs and its wall seconds summed over its attempts."""
    two_tries = (("2026-11-29T18:00:00+00:00", "2026-11-29T18:00:10+00:00"),
                 ("2026-11-29T18:01:00+00:00", "2026-11-29T18:01:05+00:00"))
    killed = (("2026-11-29T18:00:00+00:00", "2026-11-29T18:00:04+00:00"), ("2026-11-29T18:01:00+00:00", None))
    trials = [lay_out_trial(ws, 0, {"learning_rate": 5.0}, status="diverged", epochs=1),
              lay_out_trial(ws, 1, {"learning_rate": 0.5}, accuracy=0.4, loss=1.5, times=two_tries),
              lay_out_trial(ws, 2, {"learning_rate": 0.05}, status="failed", epochs=0),
              lay_out_trial(ws, 3, {"learning_rate": 0.01}, status="running", times=killed),
              {"index": 4, "params": {"learning_rate": 0.001}},
              lay_out_trial(ws, 5, {"learning_rate": 0.002}, accuracy=None, loss=None)]
    result = select.run(ws.select_config(trials))
    assert (result["chosen"], result["trials"], result["finished"]) == (1, 6, 2)
    outcomes = {t["index"]: t for t in ws.read(contract.SELECTION_FILE)["trials"]}
    assert {i: (t["status"], t["value"], t["epochs"], t["seconds"]) for i, t in outcomes.items()} == {
        0: ("diverged", None, 1, 10.0), 1: ("completed", 0.4, 2, 15.0), 2: ("failed", None, 0, 10.0),
        3: ("interrupted", None, 2, 4.0), 4: ("not started", None, 0, 0.0), 5: ("completed", None, 2, 10.0)}
    table = [line.split(" INFO ", 1)[1] for line in capsys.readouterr().out.splitlines() if " INFO " in line]
    header = table.index(next(line for line in table if line.lstrip().startswith("trial")))
    assert table[header].split() == ["trial", "learning_rate", "val_accuracy", "status", "epochs", "seconds"]
    assert table[header + 2].split() == ["*", "1", "0.5", "0.4000", "completed", "2", "15"]
    assert table[header + 5].split() == ["4", "0.001", "-", "not", "started", "0", "0"]


def test_no_finished_trial_fails_without_retry_naming_each_trial(ws, cli, without_tensorflow):
    """Run as the task runs it (``python -m trainer select``), where ``import tensorflow`` fails: exit 11
    (bad input, not retried) and a message naming every trial, its settings and how it ended."""
    trials = [lay_out_trial(ws, 0, {"learning_rate": 5.0}, status="diverged"),
              lay_out_trial(ws, 1, {"learning_rate": 0.5}, status="failed"),
              {"index": 2, "params": {"learning_rate": 0.05}}]
    proc = cli("select", ws.select_config(trials), env=without_tensorflow)
    assert proc.returncode == contract.ExitCode.BAD_INPUT == 11, proc.stdout + proc.stderr
    assert ("tuning: no trial of the sweep finished (trial 0 (learning_rate=5.0): diverged; trial 1 "
            "(learning_rate=0.5): failed; trial 2 (learning_rate=0.05): not started). Fix: ") in proc.stderr
    assert not os.path.exists(os.path.join(ws.run_dir(), contract.SELECTION_FILE))
    assert not os.path.exists(os.path.join(ws.run_dir(), "train", "final"))


def test_selection_file_and_result_line_have_their_documented_shape(ws, cli, without_tensorflow):
    """``selection.json``: metric, goal, search, the chosen trial and every trial's outcome; the result
    line: the choice in brief. The stage runs without TensorFlow."""
    trials = [lay_out_trial(ws, 0, {"learning_rate": 0.1, "model_kwargs.units": 8}, accuracy=0.75, loss=0.5),
              lay_out_trial(ws, 1, {"learning_rate": 0.01, "model_kwargs.units": 64}, accuracy=0.8125, loss=0.6)]
    proc = cli("select", ws.select_config(trials, search="random"), env=without_tensorflow)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    params = {"learning_rate": 0.01, "model_kwargs.units": 64}
    assert contract.parse_result_line(proc.stdout.splitlines()) == {
        "chosen": 1, "params": params, "metric": "val_accuracy", "value": 0.8125, "trials": 2, "finished": 2,
        "final_dir": ws.run_dir() + "/" + contract.FINAL_SUBDIR}
    assert ws.read(contract.SELECTION_FILE) == {
        "metric": "val_accuracy", "goal": "max", "search": "random",
        "chosen": {"index": 1, "params": params, "value": 0.8125},
        "trials": [{"index": 0, "params": {"learning_rate": 0.1, "model_kwargs.units": 8}, "status": "completed",
                    "value": 0.75, "epochs": 2, "seconds": 10.0},
                   {"index": 1, "params": params, "status": "completed", "value": 0.8125, "epochs": 2,
                    "seconds": 10.0}]}
    assert "chose trial 1 of 2 (2 finished): val_accuracy max 0.8125" in proc.stdout


def test_a_retried_select_writes_the_same_files_and_follows_a_retried_trial(ws):
    """Select again (a retried task) on the same trials: every promoted file and selection.json are the
    same bytes. After a failed trial was retried and finished best, select promotes it instead, and
    leaves nothing of the earlier choice."""
    trials = [lay_out_trial(ws, 0, {"learning_rate": 0.1}, accuracy=0.8, loss=0.5),
              lay_out_trial(ws, 1, {"learning_rate": 0.01}, status="failed")]
    select.run(ws.select_config(trials))
    names = PROMOTED + [contract.SELECTION_FILE]
    first = {name: read_bytes(os.path.join(ws.run_dir(), name)) for name in names}
    select.run(ws.select_config(trials, try_number=2))
    assert {name: read_bytes(os.path.join(ws.run_dir(), name)) for name in names} == first
    lay_out_trial(ws, 1, {"learning_rate": 0.01}, accuracy=0.95, loss=0.2)
    assert select.run(ws.select_config(trials, try_number=3))["chosen"] == 1
    chosen = contract.training_dir(ws.run_dir(), 1)
    for name in PROMOTED:
        assert read_bytes(os.path.join(ws.run_dir(), name)) == read_bytes(os.path.join(chosen, name)), name
    assert ws.read(contract.SELECTION_FILE)["chosen"]["index"] == 1


def test_the_stages_after_select_take_the_chosen_trials_training_settings(ws):
    """Evaluate and export build the model the final weights belong to: after select, the chosen trial's
    training section (promoted with its weights as config/train.json) replaces the DAG's; a promoted
    config of another trial is refused; a run without a sweep keeps its own config."""
    evaluate_config = common.begin(ws.config("evaluate"), "evaluate")
    assert common.trained_settings(evaluate_config) is evaluate_config
    trials = [lay_out_trial(ws, 0, {"model_kwargs.hidden_units": [8]}, accuracy=0.8, loss=0.5),
              lay_out_trial(ws, 1, {"model_kwargs.hidden_units": [24, 12], "batch_size": 16}, accuracy=0.9, loss=0.4)]
    select.run(ws.select_config(trials))
    settings = common.trained_settings(evaluate_config)
    assert settings["training"]["model_kwargs"] == {"hidden_units": [24, 12]}
    assert settings["training"]["batch_size"] == 16 and settings["evaluation"] == evaluate_config["evaluation"]
    write(os.path.join(ws.run_dir(), "config", "train.json"),
          json.load(open(contract.stage_config_path(contract.training_dir(ws.run_dir(), 0), "train"))))
    with pytest.raises(BadInput, match=r"config/train.json: is not the config of trial 1, which selection.json "
                                       r"chose\. Fix: clear the select task"):
        common.trained_settings(evaluate_config)


ABSENT = object()


@pytest.mark.parametrize("key, value, field", [
    (contract.TRIALS_KEY, ABSENT, "trials: the select stage's config lists no trials"),
    (contract.TRIALS_KEY, [], "trials: must be a non-empty list"),
    (contract.TRIALS_KEY, [{"index": 0, "params": {}}, {"index": -1, "params": {}}], "trials[1].index: must be"),
    (contract.TRIALS_KEY, [{"index": 0, "params": {}}, {"index": 0, "params": {}}], "trials[1].index: trial 0 is listed twice"),
    (contract.TRIALS_KEY, [{"index": 0, "parms": {}}], "trials[0].parms: unknown key (did you mean 'params'?)"),
    (contract.TRIAL_KEY, {"index": "1", "params": {}}, "trial.index: must be a whole number"),
    (contract.TRIAL_KEY, {"index": 1, "params": [0.1]}, "trial.params: must be an object"),
    (contract.TRIAL_KEY, 3, "trial: must be an object {index, params}"),
])
def test_a_malformed_sweep_key_is_refused_naming_the_field(ws, key, value, field):
    config = ws.select_config([{"index": 0, "params": {}}])
    if value is ABSENT:
        del config[key]
    else:
        config[key] = value
    with pytest.raises(BadInput) as info:
        select.run(config)
    assert str(info.value).startswith(field) and "Fix: " in str(info.value)


@pytest.mark.integration
def test_select_after_real_trials_promotes_the_best_ones_weights(swept):
    """Two trials trained for real (models of different shapes): select picks the better
    final_val_accuracy and the run's final weights are that trial's, byte for byte."""
    finals = [json.load(open(os.path.join(contract.training_dir(swept.run_dir(), t["index"]),
                                          contract.FINAL_SUBDIR, "final.json"))) for t in SWEEP_TRIALS]
    values = [f["final_val_accuracy"] for f in finals]
    best = values.index(max(values))
    result = select.run(swept.select_config(SWEEP_TRIALS))
    assert (result["chosen"], result["value"], result["finished"]) == (best, values[best], 2)
    source = os.path.join(contract.training_dir(swept.run_dir(), best), contract.FINAL_SUBDIR)
    target = os.path.join(swept.run_dir(), contract.FINAL_SUBDIR)
    assert sorted(os.listdir(target)) == sorted(os.listdir(source))
    for name in os.listdir(source):
        assert read_bytes(os.path.join(target, name)) == read_bytes(os.path.join(source, name)), name
    attempts = swept.read(contract.ATTEMPTS_FILE)
    assert [a["status"] for a in attempts] == ["completed"]
    took = [datetime.datetime.fromisoformat(attempts[0][k]) for k in ("start_time", "end_time")]
    assert swept.read(contract.SELECTION_FILE)["trials"][best]["seconds"] == (took[1] - took[0]).total_seconds()
