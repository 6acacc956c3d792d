"""Early stopping: where training stops, which weights are final, and that both survive a resume.

``early_stopping_min_delta`` 100 makes every epoch after the first "no improvement" (a val_loss
never falls by 100), so with patience 2 training stops after epoch 3 with epoch 1's weights; a
one-epoch run of the same seed gives those weights to compare with (training on the CPU is
deterministic here: ``test_train.py`` compares runs to 1e-6 the same way).
"""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from trainer import checkpoints, evaluate, prep, train
from trainer import config as config_mod
from trainer.errors import BadInput

from test_train import final_weights, train_until_crash  # noqa: E402

STOPS = {"epochs": 10, "early_stopping_patience": 2, "early_stopping_min_delta": 100}


def assert_same_weights(got, expected):
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-6, err_msg=name)


def checkpoint_names(path):
    return [name for name, _ in tf.train.list_variables(path)]


def test_patience_stops_training_and_the_best_epoch_s_weights_are_final(ws, capsys):
    for run_id in ("one", "early"):
        prep.run(ws.config("prep", run_id=run_id))
    train.run(ws.config("train", run_id="one", training={"epochs": 1}))
    expected = final_weights(ws, "one")
    capsys.readouterr()

    result = train.run(ws.config("train", run_id="early", training=STOPS))
    out = capsys.readouterr().out
    assert "early stopping after epoch 3: val_loss has not improved by more than 100 for 2 epoch(s); " \
           "best epoch 1" in out
    assert "final weights: those of epoch 1, the best by val_loss" in out
    assert result["epochs"] == 3 and result["steps"] == 24  # 8 steps per epoch, not 10 epochs
    assert result["best_epoch"] == 1 and result["stopped_early"] is True
    history = ws.read("metrics.json", run_id="early")
    assert [(h["epoch"], h.get("best", False)) for h in history] == [(1, True), (2, False), (3, False)]
    # the final_* figures are the best epoch's, as the weights are
    assert result["final_val_loss"] == history[0]["val_loss"]
    assert result["final_loss"] == history[0]["loss"]
    final = ws.read("train", "final", "final.json", run_id="early")
    assert final["best_epoch"] == 1 and final["stopped_early"] is True
    assert_same_weights(final_weights(ws, "early"), expected)
    # the evaluate stage scores those weights: epoch 1's val_accuracy, from the same eval split
    scored = evaluate.run(ws.config("evaluate", run_id="early", evaluation={"threshold": 0.0}))
    assert scored["metrics"]["accuracy"] == pytest.approx(history[0]["val_accuracy"], abs=1e-6)
    with open(scored["report"]) as handle:
        page = handle.read()
    assert ("early stopping: stopped after epoch 3; the final weights are those of epoch 1, the best "
            "by val_loss") in page


@pytest.mark.resume
def test_a_resumed_try_keeps_the_best_epoch_and_a_finished_one_trains_nothing(ws, monkeypatch, capsys):
    """A crash right after epoch 2's checkpoint: the next try resumes there, trains epoch 3 only
    and stops with epoch 1's weights, the best epoch it restored from the checkpoint (not from
    the model it restored, which is epoch 2's). Cleared again, a try restores epoch 3's
    checkpoint, whose patience has run out: it trains nothing and writes the same weights.
    Epoch 2's checkpoint, the one resumed from, is a traced write (one eager save first)."""
    monkeypatch.setattr(checkpoints, "EAGER_SAVES", 1)
    for run_id in ("one", "early"):
        prep.run(ws.config("prep", run_id=run_id))
    train.run(ws.config("train", run_id="one", training={"epochs": 1}))
    expected = final_weights(ws, "one")

    train_until_crash(monkeypatch, ws.config("train", run_id="early", training=STOPS), 16)
    ckpt_dir = os.path.join(ws.run_dir("early"), "train", "checkpoints")
    saved = checkpoint_names(os.path.join(ckpt_dir, "ckpt-16"))
    assert "best/epoch/.ATTRIBUTES/VARIABLE_VALUE" in saved
    # a copy of every model variable (final_weights reads those of the model alone)
    assert sum(name.startswith("best/copies/") for name in saved) == len(expected)
    # traced (two data files: one per device the trace sees) and not written again eagerly
    assert len(glob.glob(os.path.join(ckpt_dir, "ckpt-16.data-*"))) > 1
    assert "checkpoints are written eagerly" not in capsys.readouterr().out

    result = train.run(ws.config("train", run_id="early", try_number=2, training=STOPS))
    out = capsys.readouterr().out
    assert "resumed from epoch 2 step 16 " in out and "early stopping after epoch 3" in out
    assert result["steps"] == 24 and result["best_epoch"] == 1 and result["stopped_early"] is True
    assert ws.read("attempts.json", run_id="early")[1]["epochs_run"] == 1
    assert_same_weights(final_weights(ws, "early"), expected)

    result = train.run(ws.config("train", run_id="early", try_number=3, training=STOPS))
    out = capsys.readouterr().out
    assert "resumed from epoch 3 step 24 " in out and "early stopping after epoch 3" in out
    assert result["steps"] == 24 and result["best_epoch"] == 1
    assert ws.read("attempts.json", run_id="early")[2]["epochs_run"] == 0
    assert_same_weights(final_weights(ws, "early"), expected)


def test_without_a_stop_the_best_epoch_by_val_accuracy_is_still_the_final_one(ws):
    """Patience longer than the run: every epoch runs, and the final weights are those of the first
    epoch with the highest val_accuracy (an equal one is no improvement), as a run of that many
    epochs leaves them."""
    prep.run(ws.config("prep", run_id="long"))
    result = train.run(ws.config("train", run_id="long", training={
        "epochs": 4, "learning_rate": 0.003, "early_stopping_patience": 10,
        "early_stopping_monitor": "val_accuracy"}))
    history = ws.read("metrics.json", run_id="long")
    scores = [h["val_accuracy"] for h in history]
    best = scores.index(max(scores)) + 1
    assert result["epochs"] == 4 and result["stopped_early"] is False
    assert result["best_epoch"] == best
    assert [h["epoch"] for h in history if h.get("best")][-1] == best
    prep.run(ws.config("prep", run_id="short"))
    train.run(ws.config("train", run_id="short", training={"epochs": best, "learning_rate": 0.003}))
    assert_same_weights(final_weights(ws, "long"), final_weights(ws, "short"))


@pytest.mark.resume
def test_mixed_precision_stops_with_the_best_epoch_s_weights(ws):
    """Under mixed_float16 the model's variables are float32 behind autocasting wrappers; the
    copies are float32 too, and a resumed try restores them from a checkpoint that also holds
    the loss scale."""
    for run_id in ("one", "early"):
        prep.run(ws.config("prep", run_id=run_id))
    mixed = {"mixed_precision": True}
    try:
        train.run(ws.config("train", run_id="one", training=dict(mixed, epochs=1)))
        train.run(ws.config("train", run_id="early", training=dict(mixed, **dict(STOPS, epochs=2))))
        result = train.run(ws.config("train", run_id="early", try_number=2, training=dict(mixed, **STOPS)))
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    assert result["resumed_from"]["step"] == 16
    assert (result["epochs"], result["best_epoch"], result["stopped_early"]) == (3, 1, True)
    assert_same_weights(final_weights(ws, "early"), final_weights(ws, "one"))


def test_off_by_default_the_checkpoint_and_the_summary_are_unchanged(ws):
    prep.run(ws.config("prep"))
    result = train.run(ws.config("train", training={"epochs": 2}))
    assert "best_epoch" not in result and "stopped_early" not in result
    assert result["epochs"] == 2
    names = checkpoint_names(tf.train.latest_checkpoint(result["checkpoint_dir"]))
    assert not [name for name in names if name.startswith("best")]
    assert not [h for h in ws.read("metrics.json") if "best" in h]


@pytest.mark.parametrize("field, value, expected", [
    ("early_stopping_patience", -1, r"training\.early_stopping_patience must be"),
    ("early_stopping_monitor", "loss", r"training\.early_stopping_monitor must be one of val_loss, val_accuracy"),
    ("early_stopping_min_delta", -0.5, r"training\.early_stopping_min_delta must be"),
])
def test_bad_early_stopping_settings_are_refused(ws, field, value, expected):
    with pytest.raises(BadInput, match=expected):
        config_mod.resolve(ws.config("train", training={field: value}))


@pytest.mark.resume
def test_early_stopping_turned_on_mid_run_resumes_from_the_old_checkpoint(ws, capsys):
    """Two epochs without early stopping, then the DAG's config turns it on and the task is
    cleared: the try restores epoch 2's checkpoint (it has no best epoch: nothing is set aside as
    corrupt), tracks from there (epoch 3 is the first best), and stops after epoch 5 with epoch 3's
    weights."""
    prep.run(ws.config("prep"))
    train.run(ws.config("train", training={"epochs": 2}))
    capsys.readouterr()
    result = train.run(ws.config("train", try_number=2, training=STOPS))
    out = capsys.readouterr().out
    assert "resumed from epoch 2 step 16 " in out
    assert "was saved without early stopping: the best epoch is tracked from epoch 2 on" in out
    assert "cannot be restored" not in out
    assert not os.path.exists(os.path.join(ws.run_dir(), "train", "checkpoints", "corrupt"))
    assert (result["epochs"], result["best_epoch"], result["stopped_early"]) == (5, 3, True)
    assert [(h["epoch"], h.get("best", False)) for h in ws.read("metrics.json")] == [
        (1, False), (2, False), (3, True), (4, False), (5, False)]


def test_turned_on_at_the_run_s_last_epoch_the_final_weights_are_the_last(ws):
    """A checkpoint without a best epoch at the target: nothing trains, and the final weights are
    the restored ones (not the empty copies)."""
    prep.run(ws.config("prep"))
    train.run(ws.config("train", training={"epochs": 2}))
    expected = final_weights(ws)
    result = train.run(ws.config("train", try_number=2, training=dict(STOPS, epochs=2)))
    assert result["epochs"] == 2 and result["best_epoch"] == 2 and result["stopped_early"] is False
    assert_same_weights(final_weights(ws), expected)
