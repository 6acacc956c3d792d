"""input_pipeline_ratio: training step time fed by trainer.data's TFRecord pipeline / by in-memory tensors.

Both arms run the compiled training loop of :class:`trainer.train.Loop` (the ``cnn`` on the synthetic
64x64 RGB images of make_images.py, CPU), ``training.steps_per_loop`` steps per call, the calls cut
at epoch ends by ``Loop.loop_length`` as in ``Loop.fit``:

- **A**: the batches as ``Loop.fit`` feeds them: ``Loop.train_iterator`` (TFRecord shards, parse,
  ``cache()``, shuffle, batch, prefetch; the epochs concatenated into one iterator) and
  ``Loop._run_loop``, whose compiled loop takes each batch with ``next(iterator)`` in the graph. The
  untimed warm-up fills the cache, so A is the steady state of epochs 2+; each sample builds its own
  iterator, as ``Loop.fit`` does every ``EPOCHS_PER_ITERATOR`` epochs, so A pays that more often.
- **B**: the same batches, held in memory as eager tensors, through a compiled function running the
  same training step once per tensor pair, as many per call: no iterator, no loop in the graph.

Every sample is ``--epochs`` epochs; the result is its seconds per step, A and B alternating.
"""

import itertools
import time

import util


def main():
    parser = util.arguments(__doc__)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per sample")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps-per-loop", type=int, default=10,
                        help="training.steps_per_loop of both arms (the automatic length is about 8 "
                             "at this step time)")
    args = parser.parse_args()

    from trainer import data
    from trainer.train import Loop
    import tensorflow as tf

    dataset_dir, schema, stats = util.find_dataset(args.root)
    config, strategy = util.begin_train(
        args.root, "bench_input", "input", util.image_data_section(schema["image"]["height"], schema["image"]["channels"]),
        {"model": "cnn", "batch_size": args.batch_size, "epochs": 1000, "steps_per_loop": args.steps_per_loop})
    training = config["training"]
    loop = Loop(config, strategy, schema, stats, dataset_dir)
    spe = loop.spe
    next_epoch = [1]  # epoch 0's order is B's batches; every sample of A trains later epochs

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
                 for x, y in data.epoch_dataset(loop.base_train, 0, training["seed"], training["batch_size"],
                                                training["shuffle_buffer"])]
    util.log("%d batches of %s %s per epoch, %s steps per call", len(in_memory),
             list(in_memory[0][0].shape), in_memory[0][0].dtype.name, calls(0, spe))

    @tf.function
    def memory_call(xs, ys):
        for x, y in zip(xs, ys):  # unrolled in the graph: one step per tensor pair
            loop._train_step(x, y)

    ends = list(itertools.accumulate(calls(0, spe)))
    memory_chunks = [([x for x, _ in in_memory[a:b]], [y for _, y in in_memory[a:b]]) for a, b in zip([0] + ends, ends)]

    def memory_sample():
        for _ in range(args.epochs):
            for xs, ys in memory_chunks:
                memory_call(xs, ys)
        return args.epochs * ends[-1]

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
