"""Helpers shared by the in-image bench scripts (Python 3.8+, run inside the trainer image).

The scripts import the trainer package from the working tree (``PYTHONPATH=/src:/opt/tfpipe/deps``)
and print their result as the last stdout line: ``BENCH_RESULT {json}``.
"""

import json
import os
import sys
import time

RESULT_PREFIX = "BENCH_RESULT "


def emit(result):
    """Print the result line the host runner parses."""
    sys.stdout.flush()
    sys.stdout.write(RESULT_PREFIX + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def log(message, *args):
    """A progress line on stderr (the host keeps it in the figure's log)."""
    sys.stderr.write("[%s] %s\n" % (time.strftime("%H:%M:%S"), message % args if args else message))
    sys.stderr.flush()


def image_data_section(size, channels):
    """The ``data`` config section of the synthetic image data set (see make_images.py)."""
    return {"path": "images", "format": "images", "image_size": [size, size],
            "channels": channels, "eval_fraction": 0.2, "shard_size": 250}


def stage_config(root, stage, dag_id, run_id, data, training=None, try_number=1):
    """A complete stage config (the contract's envelope) with the volumes under ``root``."""
    from trainer import contract

    work = os.path.join(root, "work")
    config = {
        "schema_version": contract.SCHEMA_VERSION,
        "stage": stage,
        "run": {"dag_id": dag_id, "run_id": run_id, "task_id": stage, "try_number": try_number,
                "image": os.environ.get("TFPIPE_IMAGE_ID", "bench")},
        "paths": {"data": os.path.join(root, "data"), "work": work,
                  "models": os.path.join(root, "models"),
                  "run_dir": "%s/runs/%s/%s" % (work, contract.safe_name(dag_id),
                                                contract.safe_name(run_id, 120))},
        "data": data,
        "training": dict(training or {}),
        "evaluation": {},
        "export": {"model_name": "bench"},
    }
    return contract.validate_stage_config(config)


def find_dataset(root):
    """``(dataset_dir, schema, stats)`` of the one prepared data set under ``root/work``."""
    datasets = os.path.join(root, "work", "datasets")
    names = sorted(n for n in os.listdir(datasets)
                   if os.path.exists(os.path.join(datasets, n, "_SUCCESS")))
    if len(names) != 1:
        raise SystemExit("expected exactly one prepared data set in %s, found %r" % (datasets, names))
    dataset_dir = os.path.join(datasets, names[0])
    with open(os.path.join(dataset_dir, "schema.json")) as handle:
        schema = json.load(handle)
    with open(os.path.join(dataset_dir, "stats.json")) as handle:
        stats = json.load(handle)
    return dataset_dir, schema, stats


def cpu_s():
    """CPU seconds of this process and of the children it has waited for."""
    return time.process_time() + sum(os.times()[2:4])


def interleave(pairs, arms, warmup=None):
    """Run ``warmup`` (untimed), then the arms in turn, ``pairs`` rounds, the order alternating: A B, B A, ...

    ``arms`` is a list of ``(name, fn)``; ``fn(i)`` returns the sample's value (seconds), or
    None to use the seconds the call took. Returns ``{"a": [...], "b": [...], ...}`` keyed by
    the lower-case arm names, plus ``"a_cpu"``, ... with the process CPU seconds (all threads,
    and the child processes it waited for) of each call: unlike wall time, hardly inflated by
    other processes on a shared machine.
    """
    if warmup:
        warmup()
    out = {name.lower() + suffix: [] for name, _ in arms for suffix in ("", "_cpu")}
    for i in range(pairs):
        for name, fn in arms if i % 2 == 0 else arms[::-1]:
            started, cpu = time.perf_counter(), cpu_s()
            value = fn(i)
            cpu = cpu_s() - cpu
            value = time.perf_counter() - started if value is None else value
            out[name.lower()].append(value)
            out[name.lower() + "_cpu"].append(cpu)
            log("round %d/%d %s: %.4f (cpu %.2f s)", i + 1, pairs, name, value, cpu)
    return out


def first_try(loop, train, common):
    """The attempt record and TensorBoard writer a first try of ``loop`` starts with: ``loop.fit(*first_try(...))``."""
    import tensorflow as tf

    attempts = train.Attempts(loop.run_dir, {
        "try_number": 1, "resumed_from": None, "warm_start": None,
        "start_time": common.now_iso(), "end_time": None, "status": "running",
        "start_step": 0, "epochs_run": 0, "steps_run": 0, "target_steps": loop.total_steps})
    return attempts, tf.summary.create_file_writer(os.path.join(loop.train_dir, "tensorboard"))
