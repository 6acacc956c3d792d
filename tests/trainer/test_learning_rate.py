"""The learning-rate schedule: the cosine curve and the warm-up by step, their record per epoch, and
their resume."""

import glob
import math
import os

import pytest
import tensorflow as tf

from trainer import config as config_mod
from trainer import checkpoints, prep, train
from trainer.errors import BadInput

from test_early_stopping import assert_same_weights  # noqa: E402
from test_train import final_weights, train_until_crash  # noqa: E402

RATE = 0.01


def cosine(step, total):
    return RATE * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))


def warmed(step, warmup, total, schedule):
    """The rate of ``step`` with ``warmup`` warm-up steps: (step + 1) / warmup of RATE during them,
    then RATE, or the cosine over the steps after them."""
    if step < warmup:
        return RATE * (step + 1) / warmup
    return cosine(step - warmup, total - warmup) if schedule == "cosine" else RATE


def tensorboard_values(run_dir, tag):
    values = []
    for path in sorted(glob.glob(os.path.join(run_dir, "train", "tensorboard", "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == tag:
                    values.append((event.step, float(tf.make_ndarray(value.tensor))))
    return values


def test_cosine_decays_to_zero_at_the_last_step_and_each_epoch_records_its_rate(ws):
    for run_id in ("constant", "cosine"):
        prep.run(ws.config("prep", run_id=run_id))
    train.run(ws.config("train", run_id="constant", training={"epochs": 4, "learning_rate": RATE}))
    assert [h["learning_rate"] for h in ws.read("metrics.json", run_id="constant")] == pytest.approx([RATE] * 4)

    result = train.run(ws.config("train", run_id="cosine", training={
        "epochs": 4, "learning_rate": RATE, "learning_rate_schedule": "cosine"}))
    assert result["steps"] == 32  # 8 steps per epoch
    history = ws.read("metrics.json", run_id="cosine")
    # the rate of the step after each epoch's last: 0.0085, 0.005, 0.0015, 0
    expected = [cosine(8 * epoch, 32) for epoch in (1, 2, 3, 4)]
    assert [h["learning_rate"] for h in history] == pytest.approx(expected, abs=1e-7)
    assert history[-1]["learning_rate"] == pytest.approx(0.0, abs=1e-9)
    assert [v for _, v in tensorboard_values(ws.run_dir("cosine"), "learning_rate")] == pytest.approx(expected,
                                                                                                      abs=1e-7)
    # it is not the constant run's training: different weights
    differ = [name for name, value in final_weights(ws, "cosine").items()
              if abs(value - final_weights(ws, "constant")[name]).max() > 1e-4]
    assert differ


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_a_warm_up_ramps_each_step_to_the_rate_then_the_schedule_follows(schedule):
    """4 epochs of 8 steps, one of them warm-up: steps 0-7 at 1/8 to 8/8 of the rate, then the
    constant rate or the cosine over the 24 steps after them."""
    training = {"learning_rate": RATE, "learning_rate_schedule": schedule, "learning_rate_warmup_epochs": 1,
                "epochs": 4}
    rate = checkpoints.learning_rate(training, 32)
    got = [float(rate(tf.constant(step, tf.int64))) for step in range(34)]
    assert got == pytest.approx([warmed(step, 8, 32, schedule) for step in range(34)], abs=1e-8)
    assert got[0] == pytest.approx(RATE / 8) and got[7] == got[8] == pytest.approx(RATE)
    # without a warm-up, the schedule alone (a constant is the number itself)
    alone = checkpoints.learning_rate(dict(training, learning_rate_warmup_epochs=0), 32)
    if schedule == "cosine":
        assert float(alone(tf.constant(8, tf.int64))) == pytest.approx(cosine(8, 32), abs=1e-9)
    else:
        assert alone == RATE


@pytest.mark.resume
@pytest.mark.parametrize("warmup, crash", [(0, 10), (2, 5)])
def test_a_resumed_try_continues_the_curve_from_the_checkpointed_step(ws, monkeypatch, warmup, crash):
    """A crash after a checkpoint (step 10, mid-epoch 2; or step 5, in a two-epoch warm-up): the
    next try's steps follow the same curve (the schedule reads the optimizer's step, which the
    checkpoint restores), so its final weights and its recorded rates are those of a run that
    never stopped."""
    settings = {"epochs": 3, "learning_rate": RATE, "learning_rate_schedule": "cosine",
                "checkpoint_every_steps": 5, "learning_rate_warmup_epochs": warmup}
    for run_id in ("straight", "crashy"):
        prep.run(ws.config("prep", run_id=run_id))
    train.run(ws.config("train", run_id="straight", training=settings))
    train_until_crash(monkeypatch, ws.config("train", run_id="crashy", training=settings), crash)
    result = train.run(ws.config("train", run_id="crashy", try_number=2, training=settings))
    assert result["resumed_from"]["step"] == crash and result["steps"] == 24
    assert_same_weights(final_weights(ws, "crashy"), final_weights(ws, "straight"))
    rates = {run_id: [h["learning_rate"] for h in ws.read("metrics.json", run_id=run_id)]
             for run_id in ("straight", "crashy")}
    assert rates["crashy"] == pytest.approx(rates["straight"], abs=1e-9)
    assert rates["straight"] == pytest.approx([warmed(8 * e, 8 * warmup, 24, "cosine") for e in (1, 2, 3)],
                                              abs=1e-7)
    if warmup:  # epoch 1 ended mid-warm-up: 9/16 of the rate for the step after it
        assert rates["straight"][0] == pytest.approx(RATE * 9 / 16, abs=1e-9)


def test_a_warm_up_of_every_epoch_is_refused_naming_the_fix(ws):
    with pytest.raises(BadInput, match=r"training\.learning_rate_warmup_epochs must be fewer than "
                                       r"training\.epochs \(3\): lower the warm-up or train more epochs, got 3"):
        config_mod.resolve(ws.config("train", training={"epochs": 3, "learning_rate_warmup_epochs": 3}))


def test_an_unknown_schedule_is_refused_with_the_choices(ws):
    with pytest.raises(BadInput, match=r"training\.learning_rate_schedule must be one of constant, cosine, "
                                       r"got 'linear'"):
        config_mod.resolve(ws.config("train", training={"learning_rate_schedule": "linear"}))
