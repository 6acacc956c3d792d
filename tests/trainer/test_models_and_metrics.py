"""Claims of the docs' "Your pipeline" page ("Your own model", "Early stopping", "Imbalanced classes") that no other test
checked where they act:

- ``mlp``: a ``Normalization`` layer initialised from the TRAINING split's statistics sits inside the
  model (so it takes raw features); ``dropout`` and ``l2`` default to 0.
- Early stopping stops "once the per-epoch evaluation has not improved on the best epoch by more than
  ``early_stopping_min_delta`` for ``early_stopping_patience`` epochs (as Keras' ``EarlyStopping``)",
  and the final weights are the best epoch's: checked against Keras' own callback, epoch by epoch.
- ``macro_precision``, ``macro_recall`` and ``macro_f1`` "average over the classes": the per-class
  precision, recall and F1 of the predictions, and their means.
"""

import numpy as np
import pytest
import tensorflow as tf

from trainer import common, data, evaluate, models, prep
from trainer import config as config_mod
from trainer.early_stopping import EarlyStopping


# --- mlp: the Normalization layer and the defaults ----------------------------------------------

def _split_features(dataset_dir, schema, split):
    """Every raw feature row of ``split`` as prep wrote it (float64)."""
    rows = [x.numpy() for x, _ in data.base_dataset(dataset_dir, schema, split, cache=False)]
    return np.array(rows, dtype=np.float64)


def test_the_mlp_normalises_raw_features_with_the_training_split_s_statistics(ws):
    prep.run(ws.config("prep"))
    config = config_mod.resolve(ws.config("train"))
    dataset_dir, schema, stats = common.load_dataset(config)
    train_x = _split_features(dataset_dir, schema, "train")
    eval_x = _split_features(dataset_dir, schema, "eval")
    assert len(train_x) == schema["counts"]["train"] and len(eval_x) == schema["counts"]["eval"] > 0

    model = models.build_model(config, schema, stats)
    (normalize,) = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.Normalization)]
    mean = np.asarray(normalize.mean).reshape(-1)
    variance = np.asarray(normalize.variance).reshape(-1)
    np.testing.assert_allclose(mean, train_x.mean(axis=0), rtol=1e-5)
    np.testing.assert_allclose(variance, train_x.var(axis=0), rtol=1e-4)
    # the training split's, not all the data's: the check can tell the two apart
    everything = np.concatenate([train_x, eval_x])
    assert np.abs(everything.mean(axis=0) - train_x.mean(axis=0)).max() > 1e-3 * np.abs(mean).max()

    # inside the model: raw training features come out of it centred and scaled
    inner = tf.keras.Model(model.inputs, normalize.output)
    normalised = inner(train_x.astype(np.float32)).numpy()
    np.testing.assert_allclose(normalised.mean(axis=0), 0.0, atol=1e-3)
    np.testing.assert_allclose(normalised.std(axis=0), 1.0, atol=1e-3)
    # the raw features are what the model takes: they are far from normalised themselves
    assert np.abs(train_x.mean(axis=0)).min() > 10


def test_the_mlp_s_dropout_and_l2_default_to_zero(ws):
    prep.run(ws.config("prep"))
    config = config_mod.resolve(ws.config("train"))
    _, schema, stats = common.load_dataset(config)
    default = models.build_model(config, schema, stats)
    assert not [layer for layer in default.layers if isinstance(layer, tf.keras.layers.Dropout)]
    assert default.losses == []  # no l2 penalty in the training loss
    # the same model with them set has both: the check can tell
    tuned = models.build_model(dict(config, training=dict(config["training"],
                                                          model_kwargs={"dropout": 0.5, "l2": 0.01})),
                               schema, stats)
    assert [layer.rate for layer in tuned.layers if isinstance(layer, tf.keras.layers.Dropout)] == [0.5, 0.5]
    assert len(tuned.losses) == 3


# --- early stopping, against Keras' EarlyStopping ----------------------------------------------

def _tiny_model():
    inputs = tf.keras.Input(shape=(2,))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(2)(inputs))


def _set_epoch_weights(model, epoch):
    """Weights that say which epoch they are from."""
    for variable in model.variables:
        variable.assign(tf.fill(variable.shape, float(epoch)))


def _ours(monitor, patience, min_delta, values):
    """(epochs trained, best epoch, final weights' epoch) of tfpipe's policy, as the train loop runs
    it: update after each epoch, and before the next one stop when it is due."""
    model = _tiny_model()
    policy = EarlyStopping({"early_stopping_patience": patience, "early_stopping_monitor": monitor,
                            "early_stopping_min_delta": min_delta}, model)
    trained = 0
    for epoch, value in enumerate(values, 1):
        if policy.due(epoch - 1):
            break
        _set_epoch_weights(model, epoch)
        policy.update(epoch, {monitor: value})
        trained = epoch
    best = policy.restore_best()
    return trained, best, float(model.variables[0].numpy().reshape(-1)[0])


def _keras(monitor, patience, min_delta, values):
    """(epochs trained, best epoch, final weights' epoch or None when Keras leaves them) of Keras'
    EarlyStopping with restore_best_weights."""
    model = _tiny_model()
    callback = tf.keras.callbacks.EarlyStopping(monitor=monitor, patience=patience, min_delta=min_delta,
                                                mode="auto", restore_best_weights=True)
    callback.set_model(model)
    model.stop_training = False
    callback.on_train_begin()
    trained, best, best_value = 0, None, None
    for index, value in enumerate(values):
        _set_epoch_weights(model, index + 1)
        # Keras' own is_improvement, kept to know the best epoch when it does not stop
        if best_value is None or callback._is_improvement(value, best_value):
            best, best_value = index + 1, value
        callback.on_epoch_end(index, {monitor: value})
        trained = index + 1
        if model.stop_training:
            break
    restored = float(model.variables[0].numpy().reshape(-1)[0]) if model.stop_training else None
    return trained, best, restored


# 0.25 and 0.125 steps: every value and every min_delta sum exactly, so the boundary (an improvement
# of exactly min_delta) is tested, not a rounding.
BOUNDARY = [
    ("val_loss", 2, 0.25, [1.0, 0.75, 0.75, 0.5]),                      # better by exactly 0.25: not
    ("val_loss", 2, 0.25, [1.0, 0.875, 0.625, 0.5, 0.5, 0.25]),         # by 0.375: counts
    ("val_loss", 1, 0.0, [1.0, 1.0, 0.5]),                              # equal is no improvement
    ("val_accuracy", 2, 0.125, [0.5, 0.625, 0.75, 0.875, 0.875, 1.0]),  # higher is better
    ("val_accuracy", 3, 0.0, [0.5, 0.75, 0.75, 0.75, 0.5, 0.875]),
]


def _random_cases(count=60, seed=11):
    rng = np.random.RandomState(seed)
    for _ in range(count):
        monitor = ["val_loss", "val_accuracy"][rng.randint(2)]
        values = (rng.randint(0, 9, size=rng.randint(2, 12)) / 8.0).tolist()
        yield monitor, int(rng.randint(1, 4)), float(rng.choice([0.0, 0.125, 0.25])), values


def test_early_stopping_stops_and_keeps_the_weights_keras_would():
    stopped = 0
    for monitor, patience, min_delta, values in BOUNDARY + list(_random_cases()):
        case = (monitor, patience, min_delta, values)
        k_trained, k_best, k_restored = _keras(*case)
        o_trained, o_best, o_weights = _ours(*case)
        assert (o_trained, o_best) == (k_trained, k_best), case
        # the final weights are the best epoch's, whether it stopped or ran every epoch
        assert o_weights == float(o_best), case
        if k_restored is not None:  # Keras restores them only when it stops
            stopped += 1
            assert o_weights == k_restored, case
    assert stopped >= 10  # the cases do stop early (and the boundary ones pin the exact epochs)
    # the boundary cases, spelled out: (epochs trained, best epoch)
    assert [_ours(*case)[:2] for case in BOUNDARY] == [(3, 1), (5, 3), (2, 1), (5, 3), (5, 2)]


# --- the macro metrics --------------------------------------------------------------------------

def test_macro_precision_recall_and_f1_are_the_means_of_the_per_class_ones():
    rng = np.random.RandomState(5)
    names = ["a", "b", "c", "d"]
    labels = rng.choice(4, size=200, p=[0.6, 0.2, 0.12, 0.08])  # imbalanced: macro differs from micro
    logits = rng.normal(size=(200, 4)) + 1.5 * np.eye(4)[labels]  # right more often than not
    logits[:, 3] -= 10  # class d is never predicted: precision 0 (no prediction), recall 0
    result = evaluate.compute_metrics(logits.astype(np.float32), labels, names)
    predicted = logits.argmax(axis=1)
    expected = []
    for c in range(4):
        tp = np.sum((predicted == c) & (labels == c))
        precision = tp / np.sum(predicted == c) if np.sum(predicted == c) else 0.0
        recall = tp / np.sum(labels == c)
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        expected.append((precision, recall, f1))
    assert expected[3] == (0.0, 0.0, 0.0) and min(e[2] for e in expected[:3]) > 0.3
    got = [(p["precision"], p["recall"], p["f1"]) for p in result["per_class"]]
    assert got == pytest.approx(expected, abs=1e-12)
    metrics = result["metrics"]
    means = np.mean(expected, axis=0)
    assert metrics["macro_precision"] == pytest.approx(means[0], abs=1e-12)
    assert metrics["macro_recall"] == pytest.approx(means[1], abs=1e-12)
    assert metrics["macro_f1"] == pytest.approx(means[2], abs=1e-12)
    # the macro mean is not the accuracy (the micro one): the check can tell them apart
    assert abs(metrics["macro_recall"] - metrics["accuracy"]) > 0.05


def test_a_class_absent_from_the_eval_split_is_left_out_of_the_macro_means():
    rng = np.random.RandomState(6)
    labels = rng.choice(3, size=120)  # classes a, b, c; d has no example in the split
    logits = rng.normal(size=(120, 4)) + 2.0 * np.eye(4)[labels]
    logits[:5, 3] += 10  # d is predicted a few times: its precision is 0, its recall undefined
    result = evaluate.compute_metrics(logits.astype(np.float32), labels, ["a", "b", "c", "d"])
    per_class = result["per_class"]
    assert per_class[3]["support"] == 0
    for key in ("precision", "recall", "f1"):
        present = np.mean([p[key] for p in per_class[:3]])
        assert result["metrics"][f"macro_{key}"] == pytest.approx(present, abs=1e-12)
        # counting d's zeros would pull the mean down by a quarter
        assert result["metrics"][f"macro_{key}"] > np.mean([p[key] for p in per_class]) + 0.1
