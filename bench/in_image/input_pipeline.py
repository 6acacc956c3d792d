"""input_pipeline_ratio: training step time fed by trainer.data's TFRecord pipeline / fed by
in-memory tensors of the same shape.

Both arms run the trainer's own compiled training loop of :class:`trainer.train.Loop` (the small
``cnn`` model on the synthetic 64x64 RGB data set of make_images.py, CPU), ``training.steps_per_loop``
steps per call, the calls cut at the epoch ends by ``Loop.loop_length`` as in ``Loop.fit``:

- **A**: the batches exactly as ``Loop.fit`` feeds them: ``Loop.train_iterator`` (the epochs'
  ``data.epoch_dataset``s over ``data.base_dataset`` -- interleaved TFRecord shards, parse,
  ``cache()``, shuffle, batch, prefetch -- concatenated into one iterator, without tf.data's
  autotuning thread) and ``Loop._run_loop``, which calls the compiled loop that takes each
  batch with ``next(iterator)`` inside the graph. The untimed warm-up fills the cache, so A is
  the steady state of epochs 2+. Each sample builds its own iterator, as ``Loop.fit``
  does every ``EPOCHS_PER_ITERATOR`` epochs, so A pays that set-up more often than training does.
- **B**: the same batches, materialised once as eager tensors in memory, handed to a compiled
  function that runs the same training step once per tensor pair, with the same number of steps
  per call: no iterator, no loop in the graph.

A and B alternate (A, B, A, B, ...); every sample is ``--epochs`` epochs; the result is the
per-step seconds of each sample.
"""

import argparse
import itertools
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
    parser.add_argument("--steps-per-loop", type=int, default=10,
                        help="training.steps_per_loop of both arms (the automatic length is about 8 "
                             "at this step time)")
    args = parser.parse_args()

    from trainer import common, config as config_mod, data
    from trainer.train import Loop
    import tensorflow as tf

    dataset_dir, schema, stats = util.find_dataset(args.root)
    size = schema["image"]["height"]
    config = config_mod.resolve(util.stage_config(
        args.root, "train", dag_id="bench_input", run_id="input",
        data=util.image_data_section(size, schema["image"]["channels"]),
        training={"model": "cnn", "batch_size": args.batch_size, "epochs": 1000,
                  "steps_per_loop": args.steps_per_loop}))
    training = config["training"]
    strategy = common.setup_tensorflow(training)
    loop = Loop(config, strategy, schema, stats, dataset_dir)
    cached = loop.base_train
    spe = loop.spe
    next_epoch = [1]  # epoch 0's order is B's batches; every sample of A or C trains later epochs

    def calls(first_step, last_step):
        """The steps of each compiled call from ``first_step`` to ``last_step``, as Loop.fit cuts them."""
        lengths, step = [], first_step
        while step < last_step:
            epoch_end = (step // spe + 1) * spe
            lengths.append(loop.loop_length(step, epoch_end))
            step += lengths[-1]
        return lengths

    def pipeline_sample():
        """``args.epochs`` epochs fed as Loop.fit feeds them; returns the steps trained."""
        first = next_epoch[0]
        next_epoch[0] += args.epochs
        iterator = loop.train_iterator(first, first + args.epochs, 0)
        lengths = calls(first * spe, (first + args.epochs) * spe)
        for steps in lengths:
            loop._run_loop(iterator, steps)
        return sum(lengths)

    # The in-memory batches: epoch 0's batches of the same pipeline, as eager tensors.
    in_memory = [(tf.identity(x), tf.identity(y))
                 for x, y in data.epoch_dataset(cached, 0, training["seed"], training["batch_size"],
                                                training["shuffle_buffer"])]
    util.log("%d batches of %s %s per epoch, %s steps per call", len(in_memory),
             list(in_memory[0][0].shape), in_memory[0][0].dtype.name, calls(0, spe))

    def _memory_call(xs, ys):
        for x, y in zip(xs, ys):  # unrolled in the graph: one step per tensor pair
            loop._train_step(x, y)

    memory_call = tf.function(_memory_call)
    ends = list(itertools.accumulate(calls(0, spe)))
    memory_chunks = [([x for x, _ in in_memory[a:b]], [y for _, y in in_memory[a:b]]) for a, b in zip([0] + ends, ends)]

    def memory_sample():
        steps = 0
        for _ in range(args.epochs):
            for xs, ys in memory_chunks:
                memory_call(xs, ys)
                steps += len(xs)
        return steps

    def timed(sample):
        def run(_):
            started = time.perf_counter()
            steps = sample()
            _ = float(loop.train_loss.result().numpy())  # wait for the last step
            return (time.perf_counter() - started) / steps
        return run

    def warmup():
        pipeline_sample()  # traces the loop, fills the cache
        memory_sample()  # traces each chunk's shape once

    started = time.time()
    samples = util.interleave(args.pairs, [("A", timed(pipeline_sample)), ("B", timed(memory_sample))], warmup=warmup)
    util.emit(dict(samples, unit="seconds per step", steps_per_epoch=spe,
                   epochs_per_sample=args.epochs, batch_size=training["batch_size"],
                   steps_per_loop=args.steps_per_loop, calls_per_epoch=len(calls(0, spe)),
                   image_shape=list(in_memory[0][0].shape[1:]),
                   train_examples=schema["counts"]["train"],
                   seconds=round(time.time() - started, 1)))


if __name__ == "__main__":
    main()
