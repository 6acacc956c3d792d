"""tf.data input pipelines over the TFRecord shards written by the prep stage.

A *base* dataset (interleaved shards, parsed, optionally cached) is built once per split; the
training dataset of epoch ``e`` is ``base.shuffle(seed=seed + e).batch().skip(k).prefetch()``.
Because the shuffle order of an epoch depends only on ``seed + e``, a run that resumes from a
checkpoint taken ``k`` batches into epoch ``e`` replays exactly the batches that remain.

Caching (``training.cache``, :data:`trainer.contract.CACHE_MODES`): ``memory`` keeps the parsed
examples in RAM after the first epoch, ``file`` in a file under ``<work>/cache/tfdata/``, ``none``
parses the shards again every epoch. ``auto`` takes memory only when the data set's parsed size
fits :func:`memory_budget` (half of what the container's memory limit leaves to this process),
else a file, so a data set larger than memory trains without an out-of-memory kill. The choice
and its reason are logged. Every mode yields the same examples in the same order.
"""

import atexit
import fcntl
import math
import os
import shutil
import tempfile

from trainer import common, contract
from trainer.common import LOG, quiet_tensorflow

quiet_tensorflow()
import tensorflow as tf  # noqa: E402

AUTOTUNE = tf.data.AUTOTUNE


def split_features(schema):
    """``(numeric, categorical)``: the schema's feature entries stored as floats (numeric and
    boolean columns: the ``features`` vector) and as texts (the ``categories`` vector)."""
    features = schema["features"]
    return ([f for f in features if f.get("type") != "categorical"],
            [f for f in features if f.get("type") == "categorical"])


def input_spec(schema):
    """What a model receives: ``kind``, ``shape`` (without batch), ``dtype`` and names.

    CSV: ``float32 [len(feature_names)]`` raw values of the numeric and boolean columns (1.0/0.0)
    in schema order, NaN where a value is missing. With categorical columns the model takes a
    dict instead: ``features`` (that vector) and ``categories``, ``string [len(categorical_names)]``
    (the texts, ``""`` where missing); ``inputs`` then describes both. ``columns`` is the
    schema's entry of every feature (type, missing counts, vocabulary or hash buckets).
    Images: ``uint8 [height, width, channels]`` raw pixels.
    """
    base = {"class_names": list(schema["class_names"])}
    if schema["format"] in contract.TABULAR_FORMATS:
        numeric, categorical = split_features(schema)
        names = [f["name"] for f in numeric]
        base.update(kind="tabular", shape=[len(names)], dtype="float32", feature_names=names,
                    categorical_names=[f["name"] for f in categorical],
                    columns=[dict(f) for f in schema["features"]])
        if categorical:
            base["inputs"] = {"features": {"shape": [len(names)], "dtype": "float32"},
                              "categories": {"shape": [len(categorical)], "dtype": "string"}}
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
        texts = len(spec["categorical_names"])
        if texts:
            description["categories"] = tf.io.FixedLenFeature([texts], tf.string)

            def parse(serialized):
                parsed = tf.io.parse_single_example(serialized, description)
                return {"features": parsed["features"], "categories": parsed["categories"]}, parsed["label"]
            return parse

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


#: Bytes a cached example takes in memory besides its values: two tensors (TF's tensor buffer
#: and shape) and the cache's element vector: 520 bytes per 64-float example, measured with TF 2.9.
_CACHED_OVERHEAD = 256


def cached_bytes(schema):
    """Estimated memory that caching every split of the data set (parsed) takes."""
    spec = input_spec(schema)
    item = 4 if spec["dtype"] == "float32" else 1
    for dim in spec["shape"]:
        item *= dim
    if spec.get("categorical_names"):  # a string tensor more, its texts short: about 32 bytes each
        item += _CACHED_OVERHEAD // 2 + 32 * len(spec["categorical_names"])
    return sum(schema["counts"].values()) * (item + 8 + _CACHED_OVERHEAD)


def memory_budget():
    """``(budget, limit)`` in bytes: half of what the memory limit leaves to this process.

    The other half stays free for the model, the shuffle buffer, prefetching and TensorFlow.
    """
    limit = common.memory_limit()
    if limit is None:
        return None, None
    return max(0, limit - (common.rss_bytes() or 0)) // 2, limit


def cache_mode(cache, schema):
    """``(mode, reason)``: how ``training.cache`` (or True/False) applies to this data set."""
    if cache is True or cache is False:  # stages that read one pass pass False
        return ("memory" if cache else "none"), "requested"
    if cache not in contract.CACHE_MODES:
        raise ValueError("cache must be one of %s. Received: cache=%r"
                         % (", ".join(contract.CACHE_MODES), cache))
    if cache != "auto":
        return cache, "training.cache is %s" % cache
    need = cached_bytes(schema)
    budget, limit = memory_budget()
    mib = float(1 << 20)
    if budget is None:
        return "memory", "no memory limit could be read"
    where = "memory" if need <= budget else "file"
    return where, ("about %.0f MiB parsed, %s the budget of %.0f MiB (half of what the %.0f MiB "
                   "memory limit leaves)" % (need / mib, "within" if where == "memory" else "above",
                                             budget / mib, limit / mib))


def cache_root(dataset_dir):
    """``<work>/cache/tfdata``: file caches, on the volume that holds ``<work>/datasets``."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(dataset_dir))),
                        "cache", "tfdata")


_LOCK = ".owner.lock"


def _clean_abandoned(root):
    """Remove file caches whose process is gone: nobody holds their lock any more."""
    for name in os.listdir(root):
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, _LOCK), "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held by a live process (or not ours to touch)
        shutil.rmtree(path, ignore_errors=True)


def cache_file(dataset_dir, split):
    """A fresh file-cache prefix for ``split``, owned by this process until it exits.

    Each process gets its own directory (TF refuses two writers of one cache), locked with
    ``flock`` for as long as the process lives and removed at exit; a directory left by a killed
    process has no lock holder any more and is removed by the next process that caches.
    """
    root = cache_root(dataset_dir)
    os.makedirs(root, exist_ok=True)
    _clean_abandoned(root)
    path = tempfile.mkdtemp(prefix="%s-%s-" % (os.path.basename(dataset_dir), split), dir=root)
    handle = open(os.path.join(path, _LOCK), "a")
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    atexit.register(_release, handle, path)
    return os.path.join(path, split)


def _release(handle, path):
    shutil.rmtree(path, ignore_errors=True)
    handle.close()


def base_dataset(dataset_dir, schema, split, cache=True):
    """Interleaved, parsed (and optionally cached) examples of ``split``, in a fixed order.

    ``cache``: a ``training.cache`` mode (see :func:`cache_mode`), or True/False for memory/none.
    """
    paths = shard_paths(dataset_dir, schema, split)
    files = tf.data.Dataset.from_tensor_slices(paths)
    dataset = files.interleave(tf.data.TFRecordDataset, cycle_length=min(len(paths), 4),
                               num_parallel_calls=AUTOTUNE, deterministic=True)
    dataset = dataset.map(parse_fn(schema), num_parallel_calls=AUTOTUNE, deterministic=True)
    mode, reason = cache_mode(cache, schema)
    if mode == "memory":
        dataset, what = dataset.cache(), "cached in memory"
    elif mode == "file":
        target = cache_file(dataset_dir, split)
        dataset, what = dataset.cache(target), "cached in a file, " + target
    else:
        what = "not cached, the shards are parsed again every epoch"
    if reason != "requested":
        LOG.info("data: %s split: %s (%s)", split, what, reason)
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
    return without_autotune_thread(base.batch(batch_size).prefetch(AUTOTUNE))


def without_autotune_thread(dataset):
    """``dataset`` for iterating, with tf.data's autotuning model thread off.

    In TF 2.9 that thread sleeps between optimizations for a period that doubles up to 60 s, and
    deleting the iterator sometimes waits for the sleep to end: train stages sat idle for 15-41 s
    after their last epoch, every thread waiting, the main thread in the root iterator's destructor
    joining the model thread (a native backtrace showed it). Without the model thread, AUTOTUNE
    parallelism stays at the core count and prefetch buffers keep their own (legacy) tuning.
    """
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
