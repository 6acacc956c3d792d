"""What one training step descends: class weights and gradient clipping.

Class weights: the balanced weights of the training split, the weighted loss of a step, what they
do for a rare class, and that a resumed try weights as the killed one did. Gradient clipping: the
step's global gradient norm. The data: two overlapping gaussian classes, ``common`` and ``rare``
(one row in ten), where an unweighted model mostly predicts ``common``.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from trainer import common, data, evaluate, export, models, prep, train
from trainer import config as config_mod
from trainer.errors import BadInput

from test_early_stopping import assert_same_weights  # noqa: E402
from test_train import final_weights, train_until_crash  # noqa: E402

BALANCED = {"class_weight": "balanced"}


def write_imbalanced_csv(path, rows=600, rare_every=10, seed=3):
    """Columns f0, f1 and label (``common``, or ``rare`` on every ``rare_every``-th row)."""
    rng = np.random.RandomState(seed)
    rare = np.arange(rows) % rare_every == 0
    x = rng.normal(size=(rows, 2)) + np.where(rare[:, None], 1.2, 0.0)
    with open(path, "w") as handle:
        handle.write("f0,f1,label\n")
        for row, is_rare in zip(x, rare):
            handle.write("%.5f,%.5f,%s\n" % (row[0], row[1], "rare" if is_rare else "common"))


@pytest.fixture
def skewed(ws):
    write_imbalanced_csv(os.path.join(ws.data, "skewed.csv"))
    return ws


def prepared(ws, run_id, **training):
    """Prep the skewed data for ``run_id``; return its resolved train config, schema and stats."""
    prep.run(ws.config("prep", run_id=run_id, data={"path": "skewed.csv"}))
    config = config_mod.resolve(ws.config("train", run_id=run_id, data={"path": "skewed.csv"},
                                          training=training))
    _, schema, stats = common.load_dataset(config)
    return config, schema, stats


def test_balanced_weights_follow_the_training_split_s_class_counts(skewed):
    config, schema, stats = prepared(skewed, "weights", **BALANCED)
    counts = stats["class_histogram"]["train"]
    assert schema["class_names"] == ["common", "rare"] and counts[1] * 5 < counts[0]
    weights = train.class_weights(config["training"], schema, stats)
    total = float(sum(counts))
    assert weights == pytest.approx([total / (2 * counts[0]), total / (2 * counts[1])])
    assert weights[1] > 4 * weights[0]
    # the weights average 1 over the training examples: the loss keeps its scale
    assert sum(c * w for c, w in zip(counts, weights)) / total == pytest.approx(1.0)
    assert train.class_weights(dict(config["training"], class_weight="none"), schema, stats) is None
    # a class with no training example: weight 0; the others balanced over the classes present
    three = {"class_names": ["a", "b", "c"]}
    assert train.class_weights(config["training"], three, {"class_histogram": {"train": [0, 5, 15]}}) == \
        pytest.approx([0.0, 2.0, 2.0 / 3])


@pytest.mark.parametrize("setting, clip, l2", [("balanced", 0, 0), ("none", 0, 0), ("balanced", 0.05, 0),
                                               ("none", 0.05, 0), ("none", 0, 0.01)])
def test_one_step_descends_the_class_weighted_mean_loss_with_its_gradient_clipped(skewed, setting, clip, l2):
    """One SGD step of the loop against the same step by hand: the gradient of
    ``sum(weight[y] * cross_entropy) / batch`` (weight 1 with ``none``) plus the mlp's ``l2``
    penalty of its kernels, scaled down to the global norm ``clip`` when it is longer (0: not
    clipped), to 1e-6."""
    config, schema, stats = prepared(skewed, "%s-%s-%s" % (setting, clip, l2), optimizer="sgd", learning_rate=0.5,
                                     class_weight=setting, gradient_clip_norm=clip, model_kwargs={"l2": l2})
    dataset_dir, _, _ = common.load_dataset(config)
    loop = train.Loop(config, common.setup_tensorflow(config["training"]), schema, stats, dataset_dir)
    x, y = next(loop.eval_iterator)
    weights = train.class_weights(config["training"], schema, stats) or [1.0, 1.0]
    per_class = tf.gather(tf.constant(weights), y)
    assert len(set(y.numpy().tolist())) == 2  # the batch has both classes
    variables = loop.model.trainable_variables
    before = [v.numpy() for v in variables]
    with tf.GradientTape() as tape:
        per_example = tf.keras.losses.sparse_categorical_crossentropy(y, loop.model(x, training=True),
                                                                      from_logits=True)
        loss = tf.reduce_sum(per_example * per_class) / tf.cast(tf.size(y), tf.float32)
        kernels = [v for v in variables if "kernel" in v.name]
        assert len(kernels) == 3  # dense_0, dense_1, logits
        penalty = l2 * tf.add_n([tf.reduce_sum(tf.square(k)) for k in kernels])
        total = loss + penalty
    grads = tape.gradient(total, variables)
    norm = float(tf.linalg.global_norm(grads))
    scale = min(1.0, clip / norm) if clip else 1.0
    if clip:
        assert norm > 4 * clip  # the clip is at work in this step

    loop.train_step(x, y)
    for variable, old, grad in zip(variables, before, grads):
        # SGD's first step with momentum: the weights minus the rate times the (clipped) gradient
        np.testing.assert_allclose(variable.numpy(), old - 0.5 * scale * grad.numpy(), rtol=0, atol=1e-6,
                                   err_msg=variable.name)
    assert float(loop.train_loss.result()) == pytest.approx(float(loss), abs=1e-6)  # the penalty is not in it
    if l2:  # the penalty moves the weights: the check can tell it from no penalty
        assert float(penalty) > 1e-3
    if setting == "balanced":  # the weighted loss is not the plain mean: the check can tell them apart
        assert abs(float(tf.reduce_mean(per_example)) - float(loss)) > 1e-3


def test_balanced_weights_find_the_rare_class(skewed, capsys):
    results = {}
    for setting in ("none", "balanced"):
        config, _, _ = prepared(skewed, setting, epochs=8, class_weight=setting)
        train.run(config)
        results[setting] = evaluate.run(skewed.config(
            "evaluate", run_id=setting, data={"path": "skewed.csv"}, training={"class_weight": setting},
            evaluation={"metric": "macro_recall", "threshold": 0.0}))
    recall = {s: {c["class_name"]: c["recall"] for c in skewed.read("evaluation.json", run_id=s)["per_class"]}
              for s in results}
    # unweighted, the rare class is mostly missed; balanced, most of it is found
    assert recall["none"]["rare"] < 0.4 < 0.6 < recall["balanced"]["rare"]
    assert results["balanced"]["metrics"]["macro_recall"] > results["none"]["metrics"]["macro_recall"]
    final = skewed.read("train", "final", "final.json", run_id="balanced")
    weights = final["class_weights"]
    assert sorted(weights) == ["common", "rare"] and weights["rare"] > 4 > 0.6 > weights["common"]
    assert "class weights (balanced): common %.4g, rare %.4g" % (weights["common"], weights["rare"]) \
        in capsys.readouterr().out
    assert "class_weights" not in skewed.read("train", "final", "final.json", run_id="none")
    exported = export.run(skewed.config("export", run_id="balanced", data={"path": "skewed.csv"},
                                        training={"class_weight": "balanced"}))
    with open(os.path.join(exported["model_dir"], "metadata.json")) as handle:
        metadata = json.load(handle)
    assert metadata["training"]["class_weights"] == weights
    assert metadata["hyperparameters"]["class_weight"] == "balanced"
    with open(results["balanced"]["report"]) as handle:
        assert "<tr><th>class_weight</th><td>balanced</td></tr>" in handle.read()


@pytest.mark.resume
def test_a_resumed_try_weights_as_the_killed_one_did(skewed, monkeypatch):
    """A crash after the checkpoint at step 10: the next try's final weights are those of a run
    that never stopped (1e-6)."""
    settings = dict(BALANCED, epochs=3, checkpoint_every_steps=5)
    straight, _, _ = prepared(skewed, "straight", **settings)
    crashy, _, _ = prepared(skewed, "crashy", **settings)
    train.run(straight)
    train_until_crash(monkeypatch, crashy, 10)
    result = train.run(dict(crashy, run=dict(crashy["run"], try_number=2)))
    assert result["resumed_from"]["step"] == 10
    assert_same_weights(final_weights(skewed, "crashy"), final_weights(skewed, "straight"))


def test_an_unknown_class_weight_and_a_negative_clip_are_refused(ws):
    with pytest.raises(BadInput, match=r"training\.class_weight must be one of none, balanced, got 'inverse'"):
        config_mod.resolve(ws.config("train", training={"class_weight": "inverse"}))
    with pytest.raises(BadInput, match=r"training\.gradient_clip_norm"):
        config_mod.resolve(ws.config("train", training={"gradient_clip_norm": -1}))


def test_mixed_precision_trains_with_class_weights_a_clip_and_a_warm_up(skewed):
    """Under mixed_float16 the loss scale wraps the optimizer that clips, and the per-example loss
    the weights multiply may be float16: a run with all three finishes with finite weights."""
    config, _, _ = prepared(skewed, "mixed", epochs=2, mixed_precision=True, gradient_clip_norm=1.0,
                            learning_rate_warmup_epochs=1, **BALANCED)
    try:
        result = train.run(config)
    finally:
        tf.keras.mixed_precision.set_global_policy("float32")
    assert result["steps"] == 2 * result["steps_per_epoch"] and result["class_weights"]["rare"] > 4
    for name, value in final_weights(skewed, "mixed").items():
        assert np.isfinite(value).all(), name


def test_the_cnn_s_l2_penalises_every_kernel():
    spec = {"kind": "image", "shape": [8, 8, 1], "dtype": "uint8", "feature_names": [], "class_names": ["a", "b"]}
    model = models.cnn(spec, 2, {}, filters=(4, 4), dense_units=8, l2=0.01)
    kernels = [v for v in model.trainable_variables if "kernel" in v.name]
    assert len(kernels) == 4 and len(model.losses) == 4  # conv_0, conv_1, dense, logits
    expected = 0.01 * sum(float(tf.reduce_sum(tf.square(k))) for k in kernels)
    assert float(tf.add_n(model.losses)) == pytest.approx(expected, rel=1e-5)
    assert not models.cnn(spec, 2, {}, filters=(4,), dense_units=8).losses  # 0: no penalty


def test_a_keyword_the_built_in_model_does_not_take_is_refused_naming_it(skewed):
    config, schema, stats = prepared(skewed, "kwargs", model_kwargs={"l3": 0.1})
    with pytest.raises(BadInput, match=r"training.model_kwargs \['l3'\] do not fit model 'mlp'.*'l3'"):
        models.build_model(config, schema, stats)


def test_with_class_weights_the_validation_loss_and_accuracy_stay_unweighted(skewed):
    """``val_loss``/``val_accuracy`` (what early stopping watches) are the plain means over the eval
    split, as Keras reports them with ``class_weight``: only the training loss is weighted."""
    config, schema, stats = prepared(skewed, "val-unweighted", **BALANCED)
    dataset_dir, _, _ = common.load_dataset(config)
    loop = train.Loop(config, common.setup_tensorflow(config["training"]), schema, stats, dataset_dir)
    val_loss, val_accuracy = loop.evaluate()
    losses, hits, labels = [], [], []
    for x, y in data.eval_dataset(loop.base_eval, 32):
        logits = loop.model(x, training=False)
        losses += tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True).numpy().tolist()
        hits += (tf.argmax(logits, axis=-1).numpy() == y.numpy()).tolist()
        labels += y.numpy().tolist()
    weights = train.class_weights(config["training"], schema, stats)
    weighted = sum(weights[c] * v for c, v in zip(labels, losses)) / len(losses)
    assert val_loss == pytest.approx(float(np.mean(losses)), abs=1e-5)
    assert val_accuracy == pytest.approx(float(np.mean(hits)), abs=1e-6)
    assert abs(weighted - float(np.mean(losses))) > 1e-3  # the check can tell the two apart
