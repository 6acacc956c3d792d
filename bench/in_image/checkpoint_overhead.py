"""checkpoint_overhead_ratio: training wall time with checkpoints / without.

Each sample runs the trainer's own :class:`trainer.train.Loop` ``fit`` (evaluation, ``metrics.json``,
``attempts.json``, TensorBoard scalars included) from scratch on the synthetic images of
make_images.py, in a new run directory on the bind-mounted bench volume (as ``/work`` is):

- **A**: as shipped: ``TrainState.save`` (model, optimizer slots and counters, with
  ``keep_checkpoints`` rotation) every ``--every`` steps and at every epoch end;
- **B**: the same with the loop's save a no-op (patched on the loop's state here, trainer/ unchanged).

The timed span is ``Loop.fit``: model build and data set-up outside it, first-step tracing inside it.
"""

import time

import util


def main():
    parser = util.arguments(__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--every", type=int, default=20, help="training.checkpoint_every_steps")
    args = parser.parse_args()

    from trainer import train

    dataset_dir, schema, stats = util.find_dataset(args.root)
    data = util.image_data_section(schema["image"]["height"], schema["image"]["channels"])
    saves = {"count": 0, "seconds": 0.0}

    def sample(i, checkpoints):
        config, strategy = util.begin_train(
            args.root, "bench_checkpoint", "%s-%d" % ("ckpt" if checkpoints else "nockpt", i), data,
            {"model": "cnn", "batch_size": args.batch_size, "epochs": args.epochs, "checkpoint_every_steps": args.every})
        loop = train.Loop(config, strategy, schema, stats, dataset_dir)
        real_save = loop.state.save

        def counted_save():
            started = time.perf_counter()
            path = real_save()
            saves["seconds"] += time.perf_counter() - started
            saves["count"] += 1
            return path

        loop.state.save = counted_save if checkpoints else (lambda: "(checkpoint disabled by bench)")
        sample.steps, sample.spe = loop.total_steps, loop.spe
        return util.fit_first_try(loop)[0]

    started = time.time()
    samples = util.interleave(args.pairs, [("A", lambda i: sample(i, True)), ("B", lambda i: sample(i, False))],
                              warmup=lambda: sample(-1, True))
    util.emit(dict(samples, unit="seconds per training run (Loop.fit)",
                   epochs=args.epochs, steps=sample.steps, steps_per_epoch=sample.spe,
                   checkpoint_every_steps=args.every, saves_per_run=saves["count"] // (args.pairs + 1),
                   ms_per_save=round(1000 * saves["seconds"] / max(1, saves["count"]), 1),
                   seconds=round(time.time() - started, 1)))


if __name__ == "__main__":
    main()
