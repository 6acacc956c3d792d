"""tf.data input pipelines over the TFRecord shards written by the prep stage.

A *base* dataset (interleaved shards, parsed, optionally cached) is built once per split; the
training dataset of epoch ``e`` is ``base.shuffle(seed=seed + e).batch().skip(k).prefetch()``.
Because the shuffle order of an epoch depends only on ``seed + e``, a run that resumes from a
checkpoint taken ``k`` batches into epoch ``e`` replays exactly the batches that remain.
"""

import math
import os

from trainer.common import quiet_tensorflow

quiet_tensorflow()
import tensorflow as tf  # noqa: E402

AUTOTUNE = tf.data.AUTOTUNE


def input_spec(schema):
    """What a model receives: ``kind``, ``shape`` (without batch), ``dtype`` and names.

    CSV: ``float32 [num_features]`` raw feature values in schema order. Images: ``uint8
    [height, width, channels]`` raw pixels.
    """
    base = {"class_names": list(schema["class_names"])}
    if schema["format"] == "csv":
        names = [f["name"] for f in schema["features"]]
        base.update(kind="tabular", shape=[len(names)], dtype="float32", feature_names=names)
    else:
        image = schema["image"]
        base.update(kind="image", shape=[image["height"], image["width"], image["channels"]],
                    dtype="uint8", feature_names=[])
    return base


def parse_fn(schema):
    """A function mapping one serialized ``tf.train.Example`` to ``(inputs, label)``."""
    spec = input_spec(schema)
    if spec["kind"] == "tabular":
        width = spec["shape"][0]
        description = {"features": tf.io.FixedLenFeature([width], tf.float32),
                       "label": tf.io.FixedLenFeature([], tf.int64)}

        def parse(serialized):
            parsed = tf.io.parse_single_example(serialized, description)
            return parsed["features"], parsed["label"]
    else:
        shape = spec["shape"]
        description = {"image": tf.io.FixedLenFeature([], tf.string),
                       "label": tf.io.FixedLenFeature([], tf.int64)}

        def parse(serialized):
            parsed = tf.io.parse_single_example(serialized, description)
            pixels = tf.reshape(tf.io.decode_raw(parsed["image"], tf.uint8), shape)
            return pixels, parsed["label"]
    return parse


def shard_paths(dataset_dir, schema, split):
    """Absolute paths of one split's shards; raises if one is missing."""
    paths = [os.path.join(dataset_dir, name) for name in schema["shards"][split]]
    for path in paths:
        if not os.path.exists(path):
            raise FileNotFoundError("TFRecord shard %s listed in schema.json is missing" % path)
    return paths


def base_dataset(dataset_dir, schema, split, cache=True):
    """Interleaved, parsed (and optionally cached) examples of ``split``, in a fixed order."""
    paths = shard_paths(dataset_dir, schema, split)
    files = tf.data.Dataset.from_tensor_slices(paths)
    dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=min(len(paths), 4),
                               num_parallel_calls=AUTOTUNE, deterministic=True)
    dataset = dataset.map(parse_fn(schema), num_parallel_calls=AUTOTUNE, deterministic=True)
    if cache:
        dataset = dataset.cache()
    return dataset


def steps_per_epoch(schema, batch_size):
    """Number of batches in one training epoch (the last batch may be partial)."""
    return int(math.ceil(schema["counts"]["train"] / float(batch_size)))


def epoch_dataset(base, epoch, seed, batch_size, shuffle_buffer, skip_batches=0):
    """The training batches of ``epoch`` (shuffled with seed ``seed + epoch``), minus the first
    ``skip_batches`` ones already trained on before a resume."""
    dataset = base.shuffle(shuffle_buffer, seed=seed + epoch, reshuffle_each_iteration=False)
    dataset = dataset.batch(batch_size)
    if skip_batches:
        dataset = dataset.skip(skip_batches)
    return dataset.prefetch(AUTOTUNE)


def eval_dataset(base, batch_size):
    """The evaluation batches, in the fixed order of the shards."""
    return base.batch(batch_size).prefetch(AUTOTUNE)
