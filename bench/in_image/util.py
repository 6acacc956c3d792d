"""Helpers shared by the in-image bench scripts (Python 3.8+, run inside the trainer image).

The scripts import the trainer package from the working tree (``PYTHONPATH=/src:/opt/tfpipe/deps``)
and print their result as the last stdout line: ``BENCH_RESULT {json}``.
"""

import argparse
import json
import logging
import os
import sys
import time

RESULT_PREFIX = "BENCH_RESULT "


def arguments(doc):
    """The parser of a script's options, with the two every script takes: the bench volume and the pairs."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--root", default="/bench")
    parser.add_argument("--pairs", type=int, default=5)
    return parser


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


def stage_config(root, stage, dag_id, run_id, data, training=None):
    """A complete stage config (the contract's envelope) with the volumes under ``root``."""
    from trainer import contract

    work = os.path.join(root, "work")
    config = {
        "schema_version": contract.SCHEMA_VERSION,
        "stage": stage,
        "run": {"dag_id": dag_id, "run_id": run_id, "task_id": stage, "try_number": 1,
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
    """``(dataset_dir, schema, stats)`` of the data set prep made for the run ``bench/prep`` under ``root``."""
    from trainer import common

    work = os.path.join(root, "work")
    return common.load_dataset({"paths": {"work": work, "run_dir": os.path.join(work, "runs", "bench", "prep")}})


def cpu_s():
    """CPU seconds of this process and of the children it has waited for."""
    return time.process_time() + sum(os.times()[2:4])


def interleave(pairs, arms, warmup=None):
    """Run ``warmup`` (untimed), then ``pairs`` rounds of the ``(name, fn)`` arms, the order alternating.

    ``fn(i)`` returns the sample's seconds, or None for the seconds the call took. Returns the values
    by lower-case arm name (``"a"``, ...) and the process CPU seconds of each call (``"a_cpu"``, ...):
    unlike wall time, hardly inflated by other processes on a shared machine.
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


def begin_train(root, dag_id, run_id, data, training):
    """A new train run under ``root`` as the stage begins one: its resolved config and a fresh strategy."""
    import tensorflow as tf
    from trainer import common

    config = common.begin(stage_config(root, "train", dag_id, run_id, data, training), "train")
    logging.getLogger("tfpipe").setLevel(logging.WARNING)  # begin set it to INFO: no per-epoch lines
    tf.keras.backend.clear_session()
    return config, common.setup_tensorflow(config["training"])


def fit_first_try(loop):
    """``loop.fit`` as a first try of the train stage runs it; the seconds of the fit alone and its history."""
    import tensorflow as tf
    from trainer import common, train

    loop.state.record_inputs(loop.schema["fingerprint"], loop.training["batch_size"], loop.spe)
    attempts = train.Attempts(loop.run_dir, {
        "try_number": 1, "resumed_from": None, "warm_start": None,
        "start_time": common.now_iso(), "end_time": None, "status": "running",
        "start_step": 0, "epochs_run": 0, "steps_run": 0, "target_steps": loop.total_steps})
    writer = tf.summary.create_file_writer(os.path.join(loop.train_dir, "tensorboard"))
    started = time.perf_counter()
    history = loop.fit(attempts, writer)
    seconds = time.perf_counter() - started
    writer.close()
    return seconds, history
