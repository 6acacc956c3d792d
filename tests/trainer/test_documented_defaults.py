"""Defaults and bounds the docs state for training, checked where they act.

- The built-in models' sizes (``mlp`` hidden_units [64, 32]; ``cnn`` filters [16, 32], dense_units 64).
- The first 8 checkpoint writes are eager, the ninth traced.
- The automatic loop length (``training.steps_per_loop`` 0): one step in each of the first two calls,
  then as many steps as take about 0.5 s at the last call's pace, growing at most 8-fold per call
  and never over 10000; in a real training loop too (the calls run the automatic length, cut at the
  epoch end, and it grows exactly 8-fold while the steps are fast).
"""

import time
from types import SimpleNamespace

import tensorflow as tf

from trainer import checkpoints, models, prep, train


def _dense_units(model):
    return [layer.units for layer in model.layers if isinstance(layer, tf.keras.layers.Dense)]


def test_the_built_in_models_default_sizes():
    tabular = {"kind": "tabular", "shape": [3], "dtype": "float32", "feature_names": ["a", "b", "c"],
               "class_names": ["x", "y"]}
    stats = {"features": {name: {"mean": 0.0, "std": 1.0} for name in "abc"}}
    assert _dense_units(models.mlp(tabular, 2, stats)) == [64, 32, 2]
    image = {"kind": "image", "shape": [16, 16, 1], "dtype": "uint8", "feature_names": [], "class_names": ["x", "y"]}
    cnn = models.cnn(image, 2, {})
    assert [layer.filters for layer in cnn.layers if isinstance(layer, tf.keras.layers.Conv2D)] == [16, 32]
    assert _dense_units(cnn) == [64, 2]


def test_the_first_eight_checkpoint_writes_are_eager_and_the_ninth_is_traced(tmp_path):
    weights = tf.Variable([1.0, 2.0])
    writer = checkpoints._TracedWrite(tf.train.Checkpoint(weights=weights), lambda: [weights])
    for number in range(1, 10):
        weights.assign([float(number), 2.0])
        path = writer.write(str(tmp_path / "ckpt" / ("ckpt-%d" % number)))
        assert (writer._traced is None) == (number <= 8), number
    # the traced write wrote the ninth state
    reader = tf.train.load_checkpoint(path)
    assert reader.get_tensor("weights/.ATTRIBUTES/VARIABLE_VALUE").tolist() == [9.0, 2.0]


class _Startup(object):
    def first(self, _name, function, *args):
        return function(*args)

    def describe(self):
        return ""


def _lengths(seconds_per_step, calls=8):
    """The automatic length after each of ``calls`` calls of a loop whose steps take ``seconds_per_step``."""
    loop = SimpleNamespace(steps_per_loop=0, _auto_loop=1, _auto_calls=0, startup=_Startup(),
                           train_loop=lambda _iterator, steps: time.sleep(seconds_per_step * int(steps)))
    lengths = []
    for _ in range(calls):
        train.Loop._run_loop(loop, None, loop._auto_loop)
        lengths.append(loop._auto_loop)
    return lengths


def test_the_automatic_loop_length_grows_at_most_eight_fold_per_call_and_stops_at_10000():
    # steps that cost (next to) nothing: only the growth bound and the cap limit the length
    assert _lengths(0.0) == [1, 8, 64, 512, 4096, 10000, 10000, 10000]


def test_the_automatic_loop_length_follows_the_pace_of_the_last_call():
    # 0.1 s steps: about 0.5 s per call is at most 5 steps, where free steps reach 8, 64, ... (a busy
    # machine's overhead can only make a call slower, so the next one shorter)
    lengths = _lengths(0.1, calls=5)
    assert lengths[0] == 1 and all(1 <= n <= 5 for n in lengths[1:]) and lengths[-1] >= 2, lengths


def test_in_a_training_run_the_automatic_loop_length_grows_at_most_eight_fold_per_call(ws, monkeypatch):
    """A real run (batch 1: 245 steps in its one epoch): the automatic length before each call, and
    the steps each call ran."""
    prep.run(ws.config("prep"))
    lengths, calls, run_loop = [], [], train.Loop._run_loop

    def recorded(self, iterator, steps):
        lengths.append(self._auto_loop)
        calls.append(steps)
        return run_loop(self, iterator, steps)
    monkeypatch.setattr(train.Loop, "_run_loop", recorded)
    result = train.run(ws.config("train", training={"epochs": 1, "batch_size": 1, "checkpoint_every_steps": 0}))
    assert result["steps"] == 245 and sum(calls) == 245, calls
    # every call runs the automatic length, the last one cut short at the epoch end
    assert calls[:-1] == lengths[:-1] and calls[-1] == 245 - sum(calls[:-1]) <= lengths[-1], (calls, lengths)
    assert lengths[:2] == [1, 1], lengths  # the tracing call, then the timed one
    growth = [later / float(earlier) for earlier, later in zip(lengths[1:], lengths[2:])]
    assert growth and all(g <= 8 for g in growth) and max(lengths) <= 10000, lengths
    # one step of this mlp takes well under 0.5 s / 8: after the timed call, the bound decides
    assert lengths[2] == 8, lengths
