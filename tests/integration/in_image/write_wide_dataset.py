"""Write a wide synthetic data set straight in prep's output layout (run inside the trainer image).

    python3 write_wide_dataset.py WORK RUN_DIR FEATURES TRAIN_EXAMPLES EVAL_EXAMPLES

Two learnable classes of ``FEATURES`` float features, written as ``WORK/datasets/<name>/`` with
the shards, ``schema.json``, ``stats.json`` and ``_SUCCESS`` that prep writes, and the run's
``dataset.json`` pointer: a data set of any parsed size in seconds, without a CSV of that size.
"""

import hashlib
import json
import os
import sys

import numpy as np

from trainer import atomic, prep, records
from trainer.common import quiet_tensorflow

quiet_tensorflow()
import tensorflow as tf  # noqa: E402

PER_SHARD = 5000


def main(work, run_dir, features, n_train, n_eval):
    # a fingerprint is hex (checkpoints record part of it as an integer)
    name = hashlib.sha256(b"wide %d %d %d" % (features, n_train, n_eval)).hexdigest()
    out = os.path.join(work, "datasets", name)
    os.makedirs(out)
    rng = np.random.RandomState(0)
    centers = rng.normal(size=(2, features)).astype("<f4")
    noise = rng.normal(size=(512, features)).astype("<f4")
    encoder = records.ExampleEncoder("floats")
    shards, counts = {}, {"train": n_train, "eval": n_eval}
    for split, count in counts.items():
        total = -(-count // PER_SHARD)
        shards[split] = []
        for shard in range(total):
            shard_name = "%s-%05d-of-%05d.tfrecord" % (split, shard, total)
            with tf.io.TFRecordWriter(os.path.join(out, shard_name)) as writer:
                for i in range(shard * PER_SHARD, min(count, (shard + 1) * PER_SHARD)):
                    label = i % 2
                    values = (centers[label] + noise[i % len(noise)]).tobytes()
                    writer.write(encoder.encode(values, label, "%s-%d" % (split, i)))
            shards[split].append(shard_name)
    names = ["f%d" % i for i in range(features)]
    atomic.write_json(os.path.join(out, "schema.json"), {
        "format": "csv", "label": "label", "key": None, "class_names": ["0", "1"],
        "num_classes": 2, "counts": counts, "fingerprint": name, "prep_version": prep.PREP_VERSION,
        "features": [{"name": n, "type": "float"} for n in names], "image": None,
        "shards": shards})
    atomic.write_json(os.path.join(out, "stats.json"), {
        "class_histogram": {s: [c // 2, c - c // 2] for s, c in counts.items()},
        "features": {n: {"count": n_train, "mean": 0.0, "std": 1.0, "min": -5.0, "max": 5.0}
                     for n in names}})
    with open(os.path.join(out, "_SUCCESS"), "w") as handle:
        handle.write("synthetic\n")
    atomic.write_json(os.path.join(run_dir, "dataset.json"),
                      {"fingerprint": name, "dataset_dir": out, "created": "synthetic"})
    print(json.dumps({"dataset_dir": out, "bytes": sum(
        os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(v) for v in sys.argv[3:6]))
