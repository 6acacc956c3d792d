"""prep_rows_per_s, prep_mixed_rows_per_s: tfpipe's prep stage, in the trainer image.

The input is the digits CSV (64 integer pixel features and a label) repeated to ``--rows`` rows,
or with ``--table mixed`` a table of 20 numeric and 10 text columns (:func:`make_mixed`), as CSV
or (``--format parquet``) as Parquet.
A: ``python3 -m trainer prep`` on it (a fresh work volume each time, so never a cache hit).
B: the crude vectorised path: ``numpy.loadtxt`` of the whole file, then batches of 1,000 rows
serialised with ``tf.io.serialize_tensor`` into a TFRecord file (no validation, split, stats or
fingerprint, and the whole table in memory); with ``--b-rows N``, A's prep of the same kind of
table of N rows instead. Each side runs in its own process; A B, B A, ...
"""

import json
import os
import resource
import shutil
import subprocess
import sys
import time

from util import arguments, emit, interleave, stage_config

DIGITS = "/src/.demo/data/digits/digits.csv"


def make_table(root, rows, table="digits", fmt="csv"):
    """The ``table`` of ``rows`` data rows as a ``fmt`` file, made once per size. Parquet: the CSV typed
    by pyarrow's CSV reader, empty cells null, in row groups of 100,000 rows (a longer table has more
    row groups, not larger ones, as a writer that caps them makes)."""
    path = os.path.join(root, "tables", "%s_%d.%s" % (table, rows, fmt))
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if fmt == "parquet":
            from pyarrow import csv, parquet

            typed = csv.read_csv(make_table(root, rows, table), convert_options=csv.ConvertOptions(strings_can_be_null=True))
            parquet.write_table(typed, path + ".tmp", row_group_size=100000)
        else:
            (make_mixed if table == "mixed" else make_digits)(path + ".tmp", rows)
        os.rename(path + ".tmp", path)
    return path


def make_digits(path, rows):
    """The digits CSV repeated to ``rows`` data rows."""
    with open(DIGITS) as handle:
        header, *lines = handle.read().splitlines()
    with open(path, "w") as out:
        out.write(header + "\n")
        for start in range(0, rows, len(lines)):
            out.write("\n".join(lines[:min(len(lines), rows - start)]) + "\n")


def make_mixed(path, rows):
    """20 numeric columns, 10 text columns of 2 to 50,000 distinct values (so vocabularies, unseen
    values and hashed columns all occur), 5% of the feature cells empty, and a 0/1 label."""
    import numpy as np

    rng = np.random.default_rng(rows)
    numbers = np.array(["%.3f" % v for v in rng.normal(50, 20, 1000)], dtype=object)
    with open(path, "w") as out:
        out.write(",".join(["n%d" % i for i in range(20)] + ["t%d" % i for i in range(10)] + ["label"]) + "\n")
        for start in range(0, rows, 100000):
            n = min(100000, rows - start)
            cells = [numbers[rng.integers(0, 1000, n)] for _ in range(20)] + [
                np.char.add("v", rng.integers(0, d, n).astype(str)).astype(object)
                for d in (2, 5, 20, 100, 500, 1000, 3000, 10000, 20000, 50000)]
            for column in cells:
                column[rng.random(n) < 0.05] = ""
            cells.append(rng.integers(0, 2, n).astype(str).astype(object))
            out.write("\n".join(map(",".join, zip(*cells))) + "\n")


def fresh_volumes(root, name, table_path):
    base = os.path.join(root, "runs", name)
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(os.path.join(base, "data"))
    os.symlink(table_path, os.path.join(base, "data", "table" + os.path.splitext(table_path)[1]))
    return base


def side_a(base):
    """tfpipe prep (in this process, which the host-side runner started fresh)."""
    from trainer import prep

    name = os.listdir(os.path.join(base, "data"))[0]
    data = {"path": name, "format": "parquet" if name.endswith(".parquet") else "csv"}
    result = prep.run(stage_config(base, "prep", "bench", "prep", data))
    return {"examples": sum(result["examples"].values())}


def side_b(base):
    """numpy.loadtxt, then batched serialisation in TF."""
    import numpy as np
    import tensorflow as tf

    table = np.loadtxt(os.path.join(base, "data", "table.csv"), delimiter=",", skiprows=1, dtype=np.float32)
    os.makedirs(os.path.join(base, "work"))
    with tf.io.TFRecordWriter(os.path.join(base, "work", "table.tfrecord")) as writer:
        for start in range(0, len(table), 1000):
            writer.write(tf.io.serialize_tensor(table[start:start + 1000]).numpy())
    return {"examples": len(table)}


def main():
    parser = arguments(__doc__)
    parser.add_argument("--rows", type=int, default=1000000)
    parser.add_argument("--table", choices=("digits", "mixed"), default="digits")
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv")
    parser.add_argument("--b-rows", type=int, help="B: prep of the same table at this many rows")
    parser.add_argument("--side")
    parser.add_argument("--base")
    args = parser.parse_args()
    if args.side:  # one timed side, in its own process
        detail = (side_a if args.side == "a" else side_b)(args.base)
        for key, who in (("peak_rss_mb", resource.RUSAGE_SELF), ("workers_peak_rss_mb", resource.RUSAGE_CHILDREN)):
            detail[key] = round(resource.getrusage(who).ru_maxrss / 1024.0, 1)  # KiB on Linux
        print(json.dumps(detail))
        return
    rows = {"a": args.rows, "b": args.b_rows or args.rows}
    tables = {side: make_table(args.root, n, args.table, args.format) for side, n in rows.items()}
    details = {"a": [], "b": []}

    def arm(side):
        def run(_):
            """One side in a fresh process (its workers' CPU time counts: they are its children)."""
            base = fresh_volumes(args.root, side, tables[side])
            started = time.monotonic()
            out = subprocess.run([sys.executable, __file__, "--root", args.root, "--base", base, "--side",
                                  "a" if args.b_rows else side], stdout=subprocess.PIPE, universal_newlines=True,
                                 check=True).stdout
            details[side].append(json.loads(out.strip().splitlines()[-1]))
            return time.monotonic() - started
        return run

    result = interleave(args.pairs, [("A", arm("a")), ("B", arm("b"))])
    for side in "ab":  # the highest over its samples; workers: the largest one
        for key in ("peak_rss_mb", "workers_peak_rss_mb"):
            result["%s_%s" % (side, key)] = max(d[key] for d in details[side])
    emit(dict(result, rows=rows, unit="s per table"))


if __name__ == "__main__":
    main()
