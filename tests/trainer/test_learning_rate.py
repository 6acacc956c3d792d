"""The learning-rate schedule: the cosine curve by step, its record per epoch, and its resume."""

import glob
import math
import os

import pytest
import tensorflow as tf

from trainer import config as config_mod
from trainer import prep, train
from trainer.errors import BadInput

from test_early_stopping import assert_same_weights  # noqa: E402
from test_train import final_weights, train_until_crash  # noqa: E402

RATE = 0.01


def cosine(step, total):
    return RATE * 0.5 * (1 + math.cos(math.pi * min(step, total) / total))


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


@pytest.mark.resume
def test_a_resumed_try_continues_the_curve_from_the_checkpointed_step(ws, monkeypatch):
    """A crash after the checkpoint at step 10 (mid-epoch 2): the next try's steps follow the same
    curve (the schedule reads the optimizer's step, which the checkpoint restores), so its final
    weights and its recorded rates are those of a run that never stopped."""
    settings = {"epochs": 3, "learning_rate": RATE, "learning_rate_schedule": "cosine",
                "checkpoint_every_steps": 5}
    for run_id in ("straight", "crashy"):
        prep.run(ws.config("prep", run_id=run_id))
    train.run(ws.config("train", run_id="straight", training=settings))
    train_until_crash(monkeypatch, ws.config("train", run_id="crashy", training=settings), 10)
    result = train.run(ws.config("train", run_id="crashy", try_number=2, training=settings))
    assert result["resumed_from"]["step"] == 10 and result["steps"] == 24
    assert_same_weights(final_weights(ws, "crashy"), final_weights(ws, "straight"))
    rates = {run_id: [h["learning_rate"] for h in ws.read("metrics.json", run_id=run_id)]
             for run_id in ("straight", "crashy")}
    assert rates["crashy"] == pytest.approx(rates["straight"], abs=1e-9)
    assert rates["straight"] == pytest.approx([cosine(8 * e, 24) for e in (1, 2, 3)], abs=1e-7)


def test_an_unknown_schedule_is_refused_with_the_choices(ws):
    with pytest.raises(BadInput, match=r"training\.learning_rate_schedule must be one of constant, cosine, "
                                       r"got 'linear'"):
        config_mod.resolve(ws.config("train", training={"learning_rate_schedule": "linear"}))
