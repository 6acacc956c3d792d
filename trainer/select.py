"""The select stage of a sweep: pick the best trial and make its training output the run's.

Each trial of ``config["trials"]`` (:data:`~trainer.contract.TRIALS_KEY`) trained in its own
directory, :func:`trainer.contract.training_dir`. A trial finished when its
``train/final/final.json`` exists; its figure is that file's ``final_<tuning.metric>``, measured at
the final weights on the eval split (``val_accuracy`` is maximised, ``val_loss`` minimised). A tie
goes to the lowest index; a trial that did not finish, or has no finite figure, is never chosen.
When none finished the stage fails with :class:`~trainer.errors.BadInput` (exit 11) naming each
trial and how its last attempt ended.

The chosen trial's training output then becomes the run's, as a plain train would have left it:
``train/final``, ``metrics.json``, ``attempts.json`` and ``config/train.json`` are copied into the
run dir, each through a temporary file or directory renamed into place, and ``selection.json``
(:data:`~trainer.contract.SELECTION_FILE`) is written last, as the marker that the promotion is
whole. The later stages (evaluate, export, the report) read the run dir as after a plain train.
Everything here depends on the trials' files alone, so a retried select writes the same files.

No TensorFlow here: the stage reads and copies JSON and a few weight files.
"""

import datetime
import math
import os
import shutil

from trainer import atomic, common, contract
from trainer.common import LOG
from trainer.errors import BadInput

#: Which way each ``tuning.metric`` improves.
GOALS = {"val_accuracy": "max", "val_loss": "min"}
#: The files of a trial's directory that become the run's (``train/final`` is copied as a tree).
PROMOTED_FILES = (contract.METRICS_FILE, contract.ATTEMPTS_FILE,
                  os.path.join(contract.CONFIG_DIR, "train.json"))


def _read(path, default=None):
    """A JSON file, or ``default`` when it is missing or unreadable (the trial then did not finish)."""
    try:
        return atomic.read_json(path, default)
    except ValueError:
        LOG.warning("ignoring unreadable %s", path)
        return default


def _seconds(attempts):
    """Wall seconds summed over the attempts that recorded both their start and their end."""
    total = 0.0
    for attempt in attempts:
        try:
            start = datetime.datetime.fromisoformat(attempt["start_time"])
            end = datetime.datetime.fromisoformat(attempt["end_time"])
        except (KeyError, TypeError, ValueError):
            continue  # killed before it recorded its end
        total += (end - start).total_seconds()
    return total


def _finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def outcome(run_dir, trial, metric):
    """What trial ``trial`` (``{"index", "params"}``) left: ``{"index", "params", "status", "value",
    "epochs", "seconds"}``. ``status``: ``completed`` when its final weights exist, else how its last
    attempt ended (``failed``, ``diverged``, ``interrupted``), or ``not started``; ``value``: the
    metric at the final weights, None when it did not finish or the figure is not finite."""
    directory = contract.training_dir(run_dir, trial["index"])
    final = _read(os.path.join(directory, contract.FINAL_SUBDIR, "final.json"))
    attempts = [a for a in _read(os.path.join(directory, contract.ATTEMPTS_FILE), []) or []
                if isinstance(a, dict)]
    if isinstance(final, dict):
        status, epochs = "completed", final.get("epochs")
        value = final.get("final_" + metric)
    else:
        last = attempts[-1].get("status") if attempts else None
        # at select time no trial trains: a try recorded as running was killed before it could say so
        status = {None: "not started", "running": "interrupted",
                  "completed": "final weights missing"}.get(last, last)
        history = _read(os.path.join(directory, contract.METRICS_FILE), []) or []
        epochs = max([h.get("epoch") or 0 for h in history if isinstance(h, dict)] or [0])
        value = None
    return {"index": trial["index"], "params": trial["params"], "status": status,
            "value": float(value) if _finite(value) else None, "epochs": epochs,
            "seconds": round(_seconds(attempts), 3)}


def choose(outcomes, metric):
    """The best outcome by ``metric`` (its goal in :data:`GOALS`), the lowest index on a tie; None
    when no trial completed with a finite figure."""
    sign = -1.0 if GOALS[metric] == "max" else 1.0
    ranked = [o for o in outcomes if o["status"] == "completed" and o["value"] is not None]
    return min(ranked, key=lambda o: (sign * o["value"], o["index"])) if ranked else None


def table_lines(outcomes, metric, chosen_index):
    """The trials as aligned text lines for the log; the chosen one marked ``*``."""
    names = sorted({name for o in outcomes for name in o["params"]})
    header = ["", "trial"] + names + [metric, "status", "epochs", "seconds"]
    rows = [header]
    for o in outcomes:
        rows.append(["*" if o["index"] == chosen_index else "", str(o["index"])]
                    + [str(o["params"].get(name, "-")) for name in names]
                    + ["-" if o["value"] is None else "%.4f" % o["value"], o["status"],
                       str(o["epochs"]), "%.0f" % o["seconds"]])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def promote(run_dir, index):
    """Make trial ``index``'s training output the run's: ``train/final`` as a tree, then
    :data:`PROMOTED_FILES`, each renamed into place whole."""
    source = contract.training_dir(run_dir, index)
    train_dir = os.path.join(run_dir, "train")
    atomic.clean_stale_temps(train_dir, max_age_s=0)  # a killed select's copy: select runs alone
    with atomic.temp_dir(train_dir) as tmp:
        copy = os.path.join(tmp, "final")
        shutil.copytree(os.path.join(source, contract.FINAL_SUBDIR), copy)
        atomic.replace_dir(copy, os.path.join(run_dir, contract.FINAL_SUBDIR))
    for name in PROMOTED_FILES:
        target = os.path.join(run_dir, name)
        try:
            with open(os.path.join(source, name), "rb") as handle:
                content = handle.read()
        except FileNotFoundError:
            if os.path.exists(target):  # an earlier choice's: it must not pass for this trial's
                os.remove(target)
            continue
        atomic.write_bytes(target, content)


def read_selection(run_dir):
    """The run's ``selection.json`` (None for a run without a sweep)."""
    return _read(os.path.join(run_dir, contract.SELECTION_FILE))


def summary(selection):
    """The short record of a selection that an export's ``metadata.json`` keeps:
    ``{"trial", "params", "metric", "value", "trials"}`` (``trials``: how many the sweep ran)."""
    chosen = selection["chosen"]
    return {"trial": chosen["index"], "params": chosen["params"], "metric": selection["metric"],
            "value": chosen["value"], "trials": len(selection["trials"])}


def _no_trial_finished(outcomes):
    trials = "; ".join("trial %d (%s): %s" % (o["index"], common.describe_params(o["params"]), o["status"])
                       for o in outcomes)
    return BadInput("tuning: no trial of the sweep finished (%s). Fix: read the train task log of each "
                    "trial; clear the failed trials to retry them, or change tuning.space (a diverged "
                    "trial: lower its learning rate)." % trials)


def run(config):
    """Run the select stage; return ``{chosen, params, metric, value, trials, finished, final_dir}`` (``final_dir``:
    the run's final weights, now the chosen trial's, as train's result names them)."""
    config = common.begin(config, contract.SELECT_STAGE)
    if contract.TRIALS_KEY not in config:
        raise BadInput("%s: the select stage's config lists no trials. Fix: run select only after a "
                       "sweep's train tasks, from the same tfpipe version as the provider." % contract.TRIALS_KEY)
    run_dir, tuning = config["paths"]["run_dir"], config["tuning"]
    metric = tuning["metric"]
    outcomes = [outcome(run_dir, trial, metric)
                for trial in sorted(config[contract.TRIALS_KEY], key=lambda t: t["index"])]
    best = choose(outcomes, metric)
    for line in table_lines(outcomes, metric, best["index"] if best else None):
        LOG.info("%s", line)
    if best is None:
        raise _no_trial_finished(outcomes)
    # the marker goes first, and comes back last: a select killed in between leaves none
    selection_path = os.path.join(run_dir, contract.SELECTION_FILE)
    if os.path.exists(selection_path):
        os.remove(selection_path)
    promote(run_dir, best["index"])
    selection = {"metric": metric, "goal": GOALS[metric], "search": tuning["search"],
                 "chosen": {"index": best["index"], "params": best["params"], "value": best["value"]},
                 "trials": outcomes}
    atomic.write_json(selection_path, selection)
    finished = sum(1 for o in outcomes if o["status"] == "completed")
    LOG.info("chose trial %d of %d (%d finished): %s %s %.4f, %s", best["index"], len(outcomes), finished,
             metric, GOALS[metric], best["value"], common.describe_params(best["params"]))
    return {"chosen": best["index"], "params": best["params"], "metric": metric, "value": best["value"],
            "trials": len(outcomes), "finished": finished,
            "final_dir": os.path.join(run_dir, contract.FINAL_SUBDIR)}
