"""The training loop under a two-replica ``MirroredStrategy``, on the CPU.

No GPU here; TensorFlow can split the CPU into two logical devices, and ``MirroredStrategy`` over
them runs the multi-replica code paths a two-GPU host takes (per-replica steps, the global-batch
loss, mirrored and first-replica variables, the eager checkpoint write, cross-replica reads).
That split must happen before TensorFlow starts its runtime, which this pytest process already
did: each case runs in a fresh interpreter. The strategy is handed to the stage where
``common.setup_tensorflow`` would pick it for two visible GPUs.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import write_blobs_csv  # noqa: E402

PROBE = r"""
import json, sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
sys.path.insert(0, sys.argv[1])
from conftest import Workspace
from trainer import common, prep, train
if sys.argv[4] == "2":
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    setup = common.setup_tensorflow
    def two_replicas(training):
        setup(training)
        return strategy
    common.setup_tensorflow = two_replicas
else:  # the stage's own choice on a host without GPUs: the default strategy, one device
    strategy = tf.distribute.get_strategy()
ws = Workspace(sys.argv[2])
settings = json.loads(sys.argv[3])
results = []
for try_number, training in enumerate(settings, 1):
    if try_number == 1:
        prep.run(ws.config("prep"))
    result = train.run(ws.config("train", try_number=try_number, training=training))
    results.append({k: result.get(k) for k in ("epochs", "steps", "best_epoch", "stopped_early",
                                               "resumed_from", "final_val_loss")})
reader = tf.train.load_checkpoint(ws.run_dir() + "/train/final/weights")
weights = {n: reader.get_tensor(n).tolist() for n in reader.get_variable_to_shape_map() if "model/" in n}
print("RESULT " + json.dumps({"replicas": strategy.num_replicas_in_sync, "results": results,
                              "weights": weights}))
"""


def run_two_replicas(tmp_path, name, *tries, replicas=2, imbalanced=False):
    """Prep, then each try of ``tries`` (training settings) under two replicas (or ``replicas``
    1: one device), in a fresh interpreter; return its result line (the tries' results and the
    final weights). ``imbalanced``: only every fourth row of classes 0 and 1 is kept (25 each
    against 100), so balanced class weights are far from 1."""
    base = tmp_path / name
    os.makedirs(str(base / "data"))
    csv = str(base / "data" / "blobs.csv")
    write_blobs_csv(csv)
    if imbalanced:
        with open(csv) as handle:
            header, *rows = handle.read().splitlines()
        rows = [row for i, row in enumerate(rows) if row.endswith(",2") or i % 12 < 3]
        with open(csv, "w") as handle:
            handle.write("\n".join([header, *rows]) + "\n")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", PROBE, here, str(base), json.dumps(list(tries)), str(replicas)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True,
                          timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-6000:]
    return json.loads(lines[-1][len("RESULT "):])


def same_weights(got, expected):
    import numpy as np

    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(np.array(got[name]), np.array(expected[name]), rtol=0, atol=1e-5,
                                   err_msg=name)


@pytest.mark.resume
def test_early_stopping_and_a_resume_under_two_replicas(tmp_path):
    """Two replicas with early stopping: a run whose first try ends at epoch 2 and whose next try
    resumes stops where a run in one try does (after epoch 3, best epoch 1), with the same final
    weights: the best epoch's copies and the counters go through the checkpoint as mirrored and
    first-replica variables."""
    stops = {"epochs": 10, "early_stopping_patience": 2, "early_stopping_min_delta": 100}
    straight = run_two_replicas(tmp_path, "straight", stops)
    resumed = run_two_replicas(tmp_path, "resumed", dict(stops, epochs=2), stops)
    assert straight["replicas"] == resumed["replicas"] == 2
    (alone,), (first, second) = straight["results"], resumed["results"]
    assert (alone["epochs"], alone["best_epoch"], alone["stopped_early"]) == (3, 1, True)
    assert (first["epochs"], first["best_epoch"], first["stopped_early"]) == (2, 1, False)
    assert second["resumed_from"]["step"] == 16
    assert (second["epochs"], second["best_epoch"], second["stopped_early"]) == (3, 1, True)
    assert second["final_val_loss"] == pytest.approx(alone["final_val_loss"], abs=1e-6)
    same_weights(resumed["weights"], straight["weights"])


def test_class_weights_and_the_gradient_clip_see_the_global_batch_under_two_replicas(tmp_path):
    """Each replica gets half of every batch; the class-weighted loss is still the global batch's
    mean, and the gradient is clipped after the replicas' gradients are summed: the norm of the
    global batch's gradient, as on one device. On imbalanced classes (balanced weights about 2, 2
    and 0.5), an epoch without a clip and one with the clip at work in every step each give the
    same final weights on two replicas as on one device (1e-5). Without the clip, a loss divided
    by each replica's half instead of the global batch would train other weights; with it, a clip
    of each replica's share would (the clip normalises the gradient's length, not its direction)."""
    import numpy as np

    unclipped = {"epochs": 1, "class_weight": "balanced"}
    clipped = dict(unclipped, gradient_clip_norm=0.01)
    runs = {(setting, replicas): run_two_replicas(tmp_path, f"{setting}-{replicas}", training, replicas=replicas,
                                                  imbalanced=True)
            for setting, training in (("unclipped", unclipped), ("clipped", clipped)) for replicas in (1, 2)}
    for setting in ("unclipped", "clipped"):
        one, two = runs[setting, 1], runs[setting, 2]
        assert (one["replicas"], two["replicas"]) == (1, 2)
        assert one["results"][0]["steps"] == two["results"][0]["steps"] == 4, setting
        same_weights(two["weights"], one["weights"])
    # the clip was at work: it changed what one device trained
    differences = [np.abs(np.array(runs["clipped", 1]["weights"][name]) -
                          np.array(runs["unclipped", 1]["weights"][name])).max() for name in runs["clipped", 1]["weights"]]
    assert max(differences) > 1e-3, differences
