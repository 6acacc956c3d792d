"""input_pipeline_ratio: training step time fed by trainer.data's TFRecord pipeline / fed by
in-memory tensors of the same shape.

Both arms call the same compiled training step of the trainer's own :class:`trainer.train.Loop`
(the small ``cnn`` model on the synthetic 64x64 RGB data set of make_images.py, CPU):

- **A**: one training epoch exactly as ``Loop.fit`` feeds it: ``data.epoch_dataset`` over
  ``data.base_dataset`` (interleaved TFRecord shards, parse, ``cache()``, shuffle, batch,
  prefetch) through ``strategy.experimental_distribute_dataset``. The untimed warm-up epoch
  fills the cache, so A is the steady state of epochs 2+ (``--uncached`` adds an arm C that
  re-reads and parses the TFRecords every epoch, as with ``training.cache: false``; C/B is
  reported as a detail).
- **B**: the same batches, materialised once as eager tensors in memory, fed to the same step.

A and B alternate (A, B[, C], A, B[, C], ...); every sample is ``--epochs`` epochs; the result is the
per-step seconds of each sample.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import util  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default="/bench")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per sample")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--uncached", action="store_true",
                        help="also time arm C: the pipeline with training.cache false")
    args = parser.parse_args()

    from trainer import common, config as config_mod, data
    from trainer.train import Loop
    import tensorflow as tf

    dataset_dir, schema, stats = util.find_dataset(args.root)
    size = schema["image"]["height"]
    config = config_mod.resolve(util.stage_config(
        args.root, "train", dag_id="bench_input", run_id="input",
        data=util.image_data_section(size, schema["image"]["channels"]),
        training={"model": "cnn", "batch_size": args.batch_size, "epochs": 1000}))
    training = config["training"]
    strategy = common.setup_tensorflow(training)
    loop = Loop(config, strategy, schema, stats, dataset_dir)
    uncached = data.base_dataset(dataset_dir, schema, "train", cache=False) if args.uncached else None
    batch, seed, buffer = training["batch_size"], training["seed"], training["shuffle_buffer"]
    epoch_counter = [0]

    def pipeline_epoch(base):
        epoch_counter[0] += 1
        dataset = data.epoch_dataset(base, epoch_counter[0], seed, batch, buffer)
        steps = 0
        for x, y in strategy.experimental_distribute_dataset(dataset):
            loop.train_step(x, y)
            steps += 1
        return steps

    # The in-memory batches: the pipeline's own batches of one epoch, as eager tensors.
    in_memory = [(tf.identity(x), tf.identity(y))
                 for x, y in data.epoch_dataset(loop.base_train, 0, seed, batch, buffer)]
    util.log("%d batches of %s %s per epoch", len(in_memory), list(in_memory[0][0].shape),
             in_memory[0][0].dtype.name)

    def memory_epoch():
        for x, y in in_memory:
            loop.train_step(x, y)
        return len(in_memory)

    def timed(epoch_fn):
        def run(_):
            started = time.perf_counter()
            steps = sum(epoch_fn() for _ in range(args.epochs))
            _ = float(loop.train_loss.result().numpy())  # wait for the last step
            return (time.perf_counter() - started) / steps
        return run

    def warmup():
        pipeline_epoch(loop.base_train)  # traces the step, fills the cache
        memory_epoch()
        if uncached is not None:
            pipeline_epoch(uncached)

    def pipeline_alone():
        """Seconds per batch of the pipeline with no training step (what it costs by itself)."""
        started, batches = time.perf_counter(), 0
        for _ in range(args.epochs):
            epoch_counter[0] += 1
            for _batch in data.epoch_dataset(loop.base_train, epoch_counter[0], seed, batch, buffer):
                batches += 1
        return (time.perf_counter() - started) / batches

    started = time.time()
    arms = [("A", timed(lambda: pipeline_epoch(loop.base_train))), ("B", timed(memory_epoch))]
    if uncached is not None:
        arms.append(("C", timed(lambda: pipeline_epoch(uncached))))
    samples = util.interleave(args.pairs, arms, warmup=warmup)
    alone = sorted(pipeline_alone() for _ in range(3))[1]
    util.emit(dict(samples, unit="seconds per step", pipeline_alone_s_per_batch=alone, steps_per_epoch=len(in_memory),
                   epochs_per_sample=args.epochs, batch_size=batch,
                   image_shape=list(in_memory[0][0].shape[1:]),
                   train_examples=schema["counts"]["train"],
                   seconds=round(time.time() - started, 1)))


if __name__ == "__main__":
    main()
