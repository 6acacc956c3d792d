"""prep_rows_per_s: tfpipe's prep stage against a crude vectorised baseline, in the trainer image.

    python3 bench/in_image/prep_speed.py --root /bench --pairs 5 --rows 1000000

The input is the digits CSV (64 integer pixel features and a label) repeated to ``--rows`` rows.
A: ``python3 -m trainer prep`` on it (a fresh work volume each time, so never a cache hit).
B: the crude vectorised path: ``numpy.loadtxt`` of the whole file, then batches of 1,000 rows
serialised with ``tf.io.serialize_tensor`` into a TFRecord file (no validation, split, stats or
fingerprint, and the whole table in memory). Each side runs in its own process; A B, B A, ...
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from util import emit, log, stage_config  # noqa: E402

DIGITS = "/src/.demo/data/digits/digits.csv"


def make_csv(root, rows):
    """The digits CSV repeated to ``rows`` data rows, made once per size."""
    path = os.path.join(root, "csv", "digits_%d.csv" % rows)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(DIGITS) as handle:
            header, *lines = handle.read().splitlines()
        with open(path + ".tmp", "w") as out:
            out.write(header + "\n")
            for start in range(0, rows, len(lines)):
                out.write("\n".join(lines[:min(len(lines), rows - start)]) + "\n")
        os.rename(path + ".tmp", path)
    return path


def fresh_volumes(root, name, csv_path):
    base = os.path.join(root, "runs", name)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(os.path.join(base, "data"))
    os.symlink(csv_path, os.path.join(base, "data", "table.csv"))
    return base


def peak_mb():
    with open("/proc/self/status") as f:
        return [int(line.split()[1]) for line in f if line.startswith("VmHWM:")][0] / 1024.0


def side_a(base):
    """tfpipe prep (in this process, which the host-side runner started fresh)."""
    from trainer import prep

    result = prep.run(stage_config(base, "prep", "bench", "prep", {"path": "table.csv"}))
    return {"examples": sum(result["examples"].values())}


def side_b(base):
    """numpy.loadtxt, then batched serialisation in TF."""
    import numpy as np
    import tensorflow as tf

    table = np.loadtxt(os.path.join(base, "data", "table.csv"), delimiter=",", skiprows=1,
                       dtype=np.float32)
    os.makedirs(os.path.join(base, "work"))
    with tf.io.TFRecordWriter(os.path.join(base, "work", "table.tfrecord")) as writer:
        for start in range(0, len(table), 1000):
            writer.write(tf.io.serialize_tensor(table[start:start + 1000]).numpy())
    return {"examples": len(table)}


def one(side, root, rows):
    """Run one side in a fresh process; ``(wall s, CPU s incl. its workers, peak RSS MiB)``."""
    base = fresh_volumes(root, side, make_csv(root, rows))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    out = subprocess.run([sys.executable, __file__, "--root", root, "--side", side, "--base", base],
                         stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    shutil.rmtree(base, ignore_errors=True)
    detail = json.loads(out.strip().splitlines()[-1])
    return wall, cpu, detail


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", required=True)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1000000)
    parser.add_argument("--side")
    parser.add_argument("--base")
    args = parser.parse_args()
    if args.side:  # one timed side, in its own process
        detail = (side_a if args.side == "a" else side_b)(args.base)
        detail["peak_rss_mb"] = round(peak_mb(), 1)
        detail["workers_peak_rss_mb"] = round(
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0, 1)
        print(json.dumps(detail))
        return
    result = {"a": [], "b": [], "a_cpu": [], "b_cpu": [], "a_rss_mb": [], "b_rss_mb": [],
              "a_workers_rss_mb": [], "rows": args.rows, "unit": "s per %d rows" % args.rows}
    make_csv(args.root, args.rows)
    for pair in range(args.pairs):
        for side in ("a", "b") if pair % 2 == 0 else ("b", "a"):
            wall, cpu, detail = one(side, args.root, args.rows)
            result[side].append(wall)
            result[side + "_cpu"].append(cpu)
            result[side + "_rss_mb"].append(detail["peak_rss_mb"])
            if side == "a":
                result["a_workers_rss_mb"].append(detail["workers_peak_rss_mb"])
            log("pair %d %s: %.1f s (%.0f rows/s), CPU %.1f s, peak RSS %.0f MiB", pair + 1, side,
                wall, args.rows / wall, cpu, detail["peak_rss_mb"])
    emit(result)


if __name__ == "__main__":
    main()
