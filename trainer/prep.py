"""The prep stage: validate raw inputs and write a fingerprinted, sharded TFRecord data set.

Output: ``<work>/datasets/<fingerprint>/`` with ``train-*.tfrecord``/``eval-*.tfrecord`` shards,
``schema.json``, ``stats.json``, ``fingerprint.json`` and a ``_SUCCESS`` marker written last. The
directory is built under ``datasets/.tmp-<random>`` and renamed into place, so a data set is
either complete or absent. The fingerprint is the sha256 of the input files (relative paths and
bytes) and of the prep-relevant config; a data set with that fingerprint is reused ("cache hit").

Record layout (``tf.train.Example``): ``label`` int64, ``key`` bytes (the split key); CSV:
``features`` float list in schema order; images: ``image`` raw uint8 bytes of shape
``[height, width, channels]``.
"""

import hashlib
import json
import math
import os

from trainer import atomic, common, sources
from trainer.common import LOG
from trainer.errors import BadInput

#: Bumped whenever the data set layout changes, so old data sets are not reused.
PREP_VERSION = 1
_CHUNK = 1 << 20


def prep_settings(data):
    """The part of the ``data`` config that changes the prepared data set."""
    settings = {k: data[k] for k in ("format", "label", "features", "key", "eval_fraction",
                                     "split_seed", "shard_size")}
    if data["format"] == "images":
        settings.update(image_size=data["image_size"], channels=data["channels"])
    settings["prep_version"] = PREP_VERSION
    return settings


def fingerprint(data, files, line_counts=None):
    """Return ``(fingerprint, inputs)``: sha256 over the settings and every input file.

    Logs progress for large inputs. ``line_counts``, a dict, receives the number of text lines
    of each file (by relative path), counted on the way for the CSV reader's progress.
    """
    total = hashlib.sha256()
    total.update(json.dumps(prep_settings(data), sort_keys=True).encode("utf-8"))
    progress = common.Progress("prep: fingerprint", sum(os.path.getsize(p) for _, p in files),
                               "MiB", scale=1 << 20)
    inputs = []
    for rel, path in files:
        one = hashlib.sha256()
        size = lines = 0
        last = b"\n"
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(_CHUNK), b""):
                one.update(chunk)
                size += len(chunk)
                if line_counts is not None:
                    lines += chunk.count(b"\n")
                    last = chunk[-1:]
                progress.add(len(chunk))
        if line_counts is not None:
            line_counts[rel] = lines + (last != b"\n")
        total.update(b"\0%s\0%d\0%s" % (rel.encode("utf-8"), size, one.hexdigest().encode()))
        inputs.append({"path": rel, "bytes": size, "sha256": one.hexdigest()})
    progress.finish()
    return total.hexdigest(), inputs


def is_eval(key, seed, fraction):
    """Deterministic split: an example is in eval iff hash(seed, key) falls below ``fraction``.

    Depends only on the example's own key, so adding data never moves existing examples.
    """
    digest = hashlib.sha256(("%d:%s" % (seed, key)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / float(1 << 64) < fraction


def _serialize(tf, fmt, key, value, label_id):
    feature = {"label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label_id])),
               "key": tf.train.Feature(bytes_list=tf.train.BytesList(
                   value=[key.encode("utf-8")]))}
    if fmt == "csv":
        feature["features"] = tf.train.Feature(float_list=tf.train.FloatList(value=value))
    else:
        feature["image"] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.tobytes()]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_shards(out_dir, split, examples, fmt, shard_size, progress=None):
    """Write ``examples`` as ``<split>-NNNNN-of-MMMMM.tfrecord`` files; return their names.

    ``progress`` (a :class:`~trainer.common.Progress`) counts the examples written.
    """
    common.quiet_tensorflow()
    import tensorflow as tf

    count = max(1, int(math.ceil(len(examples) / float(shard_size))))
    names = []
    for shard in range(count):
        name = "%s-%05d-of-%05d.tfrecord" % (split, shard, count)
        with tf.io.TFRecordWriter(os.path.join(out_dir, name)) as writer:
            for key, value, label_id in examples[shard * shard_size:(shard + 1) * shard_size]:
                writer.write(_serialize(tf, fmt, key, value, label_id))
                if progress is not None:
                    progress.add()
        names.append(name)
    return names


def _summary(values):
    import numpy as np

    values = np.asarray(values, dtype=np.float64)
    return {"count": int(values.size), "mean": float(values.mean()), "std": float(values.std()),
            "min": float(values.min()), "max": float(values.max())}


def compute_stats(fmt, parsed, splits, num_classes):
    """Statistics of the train split (per feature, or per image channel) and class histograms."""
    import numpy as np

    train = splits["train"]
    stats = {"class_histogram": {}}
    for split, examples in splits.items():
        hist = [0] * num_classes
        for _, _, label_id in examples:
            hist[label_id] += 1
        stats["class_histogram"][split] = hist
    if fmt == "csv":
        matrix = np.array([value for _, value, _ in train], dtype=np.float64)
        stats["features"] = {name: _summary(matrix[:, i])
                             for i, name in enumerate(parsed["feature_names"])}
    else:
        pixels = np.stack([value for _, value, _ in train]).astype(np.float64)
        stats["channels"] = [_summary(pixels[..., c]) for c in range(pixels.shape[-1])]
    return stats


def _result(fp, dataset_dir, schema, cache_hit):
    return {"fingerprint": fp, "dataset_dir": dataset_dir, "cache_hit": cache_hit,
            "examples": dict(schema["counts"]), "num_classes": schema["num_classes"]}


def _use(config, fp, dataset_dir):
    atomic.write_json(os.path.join(config["paths"]["run_dir"], "dataset.json"),
                      {"fingerprint": fp, "dataset_dir": dataset_dir, "created": common.now_iso()})


def run(config):
    """Run the prep stage; return ``{fingerprint, dataset_dir, cache_hit, examples, ...}``."""
    config = common.begin(config, "prep")
    data = config["data"]
    files = sources.input_files(config)
    line_counts = {}
    fp, inputs = fingerprint(data, files, line_counts if data["format"] == "csv" else None)
    root = common.datasets_root(config)
    dataset_dir = os.path.join(root, fp)
    for name in atomic.clean_stale_temps(root):  # left by a killed prep
        LOG.info("removed stale temporary directory %s/%s", root, name)
    LOG.info("prep: %d input file(s), fingerprint %s", len(files), fp)
    if os.path.exists(os.path.join(dataset_dir, "_SUCCESS")):
        LOG.info("cache hit: data set %s already prepared, nothing to do", dataset_dir)
        _mark_used(dataset_dir)
        schema = atomic.read_json(os.path.join(dataset_dir, "schema.json"))
        _use(config, fp, dataset_dir)
        return _result(fp, dataset_dir, schema, True)

    fmt = data["format"]
    if fmt == "csv":
        reading = common.Progress("prep: read", sum(line_counts.values()), "lines")
        parsed = sources.read_csv(config, files, reading)
    else:
        reading = common.Progress("prep: read", len(files), "images")
        parsed = sources.read_images(config, reading)
    reading.finish()
    splits = {"train": [], "eval": []}
    for example in parsed["examples"]:
        held_out = is_eval(example[0], data["split_seed"], data["eval_fraction"])
        splits["eval" if held_out else "train"].append(example)
    total = len(parsed["examples"])
    for split, examples in splits.items():
        if not examples:
            raise BadInput("the %s split is empty: %d example(s) with data.eval_fraction %s; add "
                           "data or change data.eval_fraction" % (split, total,
                                                                  data["eval_fraction"]))
    class_names = parsed["class_names"]
    schema = {
        "format": fmt, "label": data["label"], "key": data["key"],
        "class_names": class_names, "num_classes": len(class_names),
        "counts": {s: len(e) for s, e in splits.items()},
        "fingerprint": fp, "prep_version": PREP_VERSION,
    }
    if fmt == "csv":
        schema["features"] = [{"name": n, "type": t} for n, t in
                              zip(parsed["feature_names"], parsed["feature_types"])]
        schema["image"] = None
    else:
        height, width = data["image_size"]
        schema["features"] = []
        schema["image"] = {"height": height, "width": width, "channels": data["channels"]}
    stats = compute_stats(fmt, parsed, splits, len(class_names))

    with atomic.temp_dir(root) as tmp:
        writing = common.Progress("prep: wrote", total, "examples")
        schema["shards"] = {s: write_shards(tmp, s, e, fmt, data["shard_size"], writing)
                            for s, e in splits.items()}
        writing.finish()
        atomic.write_json(os.path.join(tmp, "schema.json"), schema)
        atomic.write_json(os.path.join(tmp, "stats.json"), stats)
        atomic.write_json(os.path.join(tmp, "fingerprint.json"), {
            "fingerprint": fp, "settings": prep_settings(data), "inputs": inputs,
            "created": common.now_iso(), "run": config["run"]})
        with open(os.path.join(tmp, "_SUCCESS"), "w") as handle:
            handle.write(common.now_iso() + "\n")
        _publish(tmp, dataset_dir)
    LOG.info("prep: wrote %s: %d train / %d eval examples, %d classes", dataset_dir,
             schema["counts"]["train"], schema["counts"]["eval"], len(class_names))
    _use(config, fp, dataset_dir)
    return _result(fp, dataset_dir, schema, False)


def _mark_used(dataset_dir):
    """Refresh the data set's mtime: retention keeps a data set reused recently (trainer.retention)."""
    try:
        os.utime(dataset_dir, None)
    except OSError as error:  # not ours to touch: retention then only sees the pointer
        LOG.warning("could not mark %s as used (%s)", dataset_dir, error)


def _publish(tmp, dataset_dir):
    """Rename the finished temp dir into place; tolerate a concurrent identical prep."""
    try:
        atomic.publish_dir(tmp, dataset_dir)
    except FileExistsError:
        if os.path.exists(os.path.join(dataset_dir, "_SUCCESS")):
            LOG.info("data set %s was published meanwhile by another run; using it", dataset_dir)
            return
        LOG.warning("replacing incomplete data set directory %s", dataset_dir)
        atomic.replace_dir(tmp, dataset_dir)
