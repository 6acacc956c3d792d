"""checkpoint_overhead_ratio: training wall time with checkpoints / without.

Each sample trains a fresh run of the trainer's own :class:`trainer.train.Loop` (``fit``: the
real loop with its per-N-step and per-epoch checkpoints, evaluation, ``metrics.json``,
``attempts.json`` and TensorBoard scalars) on the synthetic image data set of make_images.py,
in a new run directory on the bind-mounted bench volume (as ``/work`` is in production):

- **A**: as shipped: ``TrainState.save`` (a ``tf.train.CheckpointManager`` save of model,
  optimizer slots and counters, with ``keep_checkpoints`` rotation) every
  ``--every`` steps and at every epoch end;
- **B**: the same, with the loop's checkpoint save replaced by a no-op (monkeypatched on the
  loop's state here; trainer/ is unchanged). Everything else, divergence checks included, runs.

A and B alternate; the timed span is ``Loop.fit`` (model build and data set set-up are outside
it, the first-step tracing inside it, in both arms).
"""

import argparse
import logging
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import util  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default="/bench")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--every", type=int, default=20, help="training.checkpoint_every_steps")
    args = parser.parse_args()

    from trainer import common, train
    import tensorflow as tf

    dataset_dir, schema, stats = util.find_dataset(args.root)
    size, channels = schema["image"]["height"], schema["image"]["channels"]
    saves = {"count": 0, "seconds": 0.0}

    def sample(i, checkpoints):
        run_id = "%s-%d-%d" % ("ckpt" if checkpoints else "nockpt", os.getpid(), i)
        config = common.begin(util.stage_config(
            args.root, "train", dag_id="bench_checkpoint", run_id=run_id,
            data=util.image_data_section(size, channels),
            training={"model": "cnn", "batch_size": args.batch_size, "epochs": args.epochs,
                      "checkpoint_every_steps": args.every}), "train")
        logging.getLogger("tfpipe").setLevel(logging.WARNING)  # no per-epoch lines
        tf.keras.backend.clear_session()
        strategy = common.setup_tensorflow(config["training"])
        loop = train.Loop(config, strategy, schema, stats, dataset_dir)
        loop.state.steps_per_epoch.assign(loop.spe)
        real_save = loop.state.save
        if checkpoints:
            def counted_save():
                started = time.perf_counter()
                path = real_save()
                saves["seconds"] += time.perf_counter() - started
                saves["count"] += 1
                return path
            loop.state.save = counted_save
        else:
            loop.state.save = lambda: "(checkpoint disabled by bench)"
        attempts, writer = util.first_try(loop, train, common)
        started = time.perf_counter()
        loop.fit(attempts, writer)
        seconds = time.perf_counter() - started
        writer.close()
        sample.steps, sample.spe = loop.total_steps, loop.spe
        return seconds

    started = time.time()
    samples = util.interleave(args.pairs, [("A", lambda i: sample(i, True)),
                                           ("B", lambda i: sample(i, False))],
                              warmup=lambda: sample(-1, True))
    warm_saves = saves["count"] // (args.pairs + 1)
    util.emit(dict(samples, unit="seconds per training run (Loop.fit)",
                   epochs=args.epochs, steps=sample.steps, steps_per_epoch=sample.spe,
                   checkpoint_every_steps=args.every, saves_per_run=warm_saves,
                   ms_per_save=round(1000 * saves["seconds"] / max(1, saves["count"]), 1),
                   seconds=round(time.time() - started, 1)))


if __name__ == "__main__":
    main()
