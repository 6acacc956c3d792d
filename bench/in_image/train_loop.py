"""train_loop_ratio: the train stage's training loop / Keras ``model.fit`` at its best settings.

Both arms train the same model (``trainer.models.build_model``: the ``mlp`` on the digits CSV, or
the ``cnn`` on the synthetic images of make_images.py) on the same prepared TFRecords, batch size,
epochs, optimizer and seed, with per-epoch validation, checkpoints (model + optimizer) every
``--every`` steps and at every epoch end, and per-epoch TensorBoard scalars:

- **A**: ``trainer.train.Loop.fit`` as the train stage runs it (steps per call chosen automatically;
  NaN checks, ``metrics.json``, ``attempts.json`` included).
- **B**: ``model.fit`` over ``data.base_dataset`` (reshuffled every epoch, batched, repeated with
  ``steps_per_epoch`` given, prefetched), ``validation_data`` from the same eval split, a callback
  saving a ``tf.train.CheckpointManager`` checkpoint as A does, and ``TensorBoard(update_freq="epoch")``.
  ``steps_per_execution`` is tuned first: each value of ``--spe`` runs ``--tune-runs`` times (untimed
  for the ratio); the one with the least median CPU time is B. Each value must divide ``--every``:
  Keras runs callbacks only between executions, so a longer one would checkpoint less often than A.
  Both arms count their saves; a run where they differ fails.

The timed span of both is the training call alone; the model is built and compiled outside it,
tracing happens inside it for both. A and B alternate.
"""

import itertools
import os
import statistics
import time

import util


def main():
    parser = util.arguments(__doc__)
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--every", type=int, default=20, help="training.checkpoint_every_steps")
    parser.add_argument("--spe", default="1,5,10,20",
                        help="steps_per_execution values to tune B over; each must divide --every")
    parser.add_argument("--tune-runs", type=int, default=2)
    args = parser.parse_args()
    candidates = [int(v) for v in args.spe.split(",")]
    for value in candidates:
        if value < 1 or (args.every and args.every % value):
            parser.error("--spe %d: use values that divide --every %d, so that B checkpoints on the same "
                         "steps as A (Keras runs callbacks only between executions)" % (value, args.every))

    from trainer import checkpoints, data, models, prep, train
    import tensorflow as tf

    if args.model == "mlp":
        data_section = {"path": "digits/digits.csv", "format": "csv", "label": "label", "eval_fraction": 0.2}
        prep.run(util.stage_config(args.root, "prep", "bench", "prep", data_section))
    dataset_dir, schema, stats = util.find_dataset(args.root)
    if args.model == "cnn":
        data_section = util.image_data_section(schema["image"]["height"], schema["image"]["channels"])
    runs = itertools.count()

    def begin(arm):
        return util.begin_train(args.root, "bench_train_loop", "%s-%d" % (arm, next(runs)), data_section, {
            "model": args.model, "batch_size": args.batch_size, "epochs": args.epochs,
            "checkpoint_every_steps": args.every, "learning_rate": 0.002})

    def loop_sample(i):
        loop = train.Loop(*begin("loop"), schema, stats, dataset_dir)
        save, saves = loop.state.save, []
        loop.state.save = lambda *a, **kw: saves.append(1) or save(*a, **kw)
        seconds, history = util.fit_first_try(loop)
        loop_sample.steps, loop_sample.spe, loop_sample.saves = loop.total_steps, loop.spe, len(saves)
        loop_sample.val_accuracy = history[-1]["val_accuracy"]
        return seconds

    class Checkpointing(tf.keras.callbacks.Callback):
        """Checkpoints as the loop takes them: model + optimizer, every ``every`` steps and at
        epoch ends (with steps_per_execution > 1, Keras reports batches per execution, so a save
        comes at the first report at or past each multiple)."""

        def __init__(self, manager, every):
            super().__init__()
            self.manager, self.every, self.step, self.saved_at = manager, every, 0, 0
            self.epoch_start = self.saves = 0

        def save(self):
            self.manager.save(checkpoint_number=self.step)
            self.saved_at = self.step
            self.saves += 1

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch_start = self.step

        def on_train_batch_end(self, batch, logs=None):
            self.step = self.epoch_start + batch + 1
            if self.every and self.step // self.every > self.saved_at // self.every:
                self.save()

        def on_epoch_end(self, epoch, logs=None):
            if self.saved_at != self.step:
                self.save()

    def fit_sample(i, steps_per_execution):
        config, strategy = begin("fit%d" % steps_per_execution)
        training = config["training"]
        tf.random.set_seed(training["seed"])
        with strategy.scope():
            model = models.build_model(config, schema, stats)
            optimizer = checkpoints.build_optimizer(training)
            model.compile(optimizer=optimizer,
                          loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"], steps_per_execution=steps_per_execution)
        base_train = data.base_dataset(dataset_dir, schema, "train", training["cache"])
        base_eval = data.base_dataset(dataset_dir, schema, "eval", training["cache"])
        train_batches = base_train.shuffle(training["shuffle_buffer"], seed=training["seed"],
                                           reshuffle_each_iteration=True)
        # repeated, with the epoch length given: fit needs it for steps_per_execution > 1
        train_batches = train_batches.batch(args.batch_size).repeat().prefetch(data.AUTOTUNE)
        run_dir = config["paths"]["run_dir"]
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model, optimizer=optimizer),
                                             os.path.join(run_dir, "train", "checkpoints"),
                                             max_to_keep=training["keep_checkpoints"])
        checkpointing = Checkpointing(manager, args.every)
        callbacks = [checkpointing,
                     tf.keras.callbacks.TensorBoard(os.path.join(run_dir, "train", "tensorboard"),
                                                    update_freq="epoch", write_graph=False,
                                                    profile_batch=0)]
        started = time.perf_counter()
        history = model.fit(train_batches, epochs=args.epochs, verbose=0, callbacks=callbacks,
                            steps_per_epoch=data.steps_per_epoch(schema, args.batch_size),
                            validation_data=data.eval_dataset(base_eval, args.batch_size),
                            validation_steps=-(-schema["counts"]["eval"] // args.batch_size))
        seconds = time.perf_counter() - started
        fit_sample.val_accuracy, fit_sample.saves = history.history["val_accuracy"][-1], checkpointing.saves
        return seconds

    started = time.time()
    # B's steps_per_execution: the value with the least median CPU time over --tune-runs runs each
    tuned = util.interleave(args.tune_runs, [(str(spe), lambda i, spe=spe: fit_sample(-1, spe)) for spe in candidates])
    tuning = {spe: statistics.median(tuned["%d_cpu" % spe]) for spe in candidates}
    best = min(tuning, key=tuning.get)
    util.log("B uses steps_per_execution=%d", best)
    samples = util.interleave(args.pairs, [("A", loop_sample), ("B", lambda i: fit_sample(i, best))],
                              warmup=lambda: loop_sample(-1))
    if loop_sample.saves != fit_sample.saves:
        raise SystemExit("train_loop: A saved %d checkpoints and B %d: the arms did different work"
                         % (loop_sample.saves, fit_sample.saves))
    util.emit(dict(samples, unit="seconds per training run (Loop.fit / model.fit)", model=args.model,
                   epochs=args.epochs, batch_size=args.batch_size, steps=loop_sample.steps,
                   steps_per_epoch=loop_sample.spe, checkpoint_every_steps=args.every,
                   steps_per_execution=best, saves_per_run=loop_sample.saves,
                   tuning_cpu_s={str(k): round(v, 3) for k, v in sorted(tuning.items())},
                   val_accuracy_a=round(loop_sample.val_accuracy, 4),
                   val_accuracy_b=round(fit_sample.val_accuracy, 4),
                   seconds=round(time.time() - started, 1)))


if __name__ == "__main__":
    main()
