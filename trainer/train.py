"""The train stage: a custom training loop with checkpoint/resume (orbit style, no ``fit``).

State lives in ``<run_dir>/train/checkpoints`` (``tf.train.CheckpointManager``), saved every
``training.checkpoint_every_steps`` steps and at every epoch end. A retried task resumes from the
newest readable checkpoint; mid-epoch it replays the rest of that epoch's batches exactly (see
:mod:`trainer.data`). Before every save the loss and weights are checked once (one fused
``tf.function``, one scalar read back): NaN/inf raises :class:`~trainer.errors.Diverged` and
nothing is saved. SIGTERM (``docker stop``) saves a checkpoint at the end of the current loop
and exits 143.

Several steps run per compiled call (a ``tf.range`` loop over the data iterator inside one
``tf.function``), as Keras' ``steps_per_execution`` does: ``training.steps_per_loop`` steps, or,
when it is 0, as many as take about :data:`AUTO_LOOP_SECONDS` (measured as training runs: the
first call runs one step, later calls grow at most 8-fold each). A loop always ends early at a
checkpoint step and at the epoch end, so checkpoints and the NaN check still land exactly where
they did with one step per call, whatever the loop length; SIGTERM is checked after every call.
Each step function
is traced once: the iterator's element spec has an unknown batch size, so the partial last batch
reuses the trace, and the loop length is a tensor argument.

With ``training.class_weight`` ``balanced``, each example's loss is weighted by the inverse frequency
of its class in the training split (:func:`class_weights`); the evaluation is not weighted.

With ``training.early_stopping_patience`` set, training stops once the evaluation has not improved
for that many epochs, and the final weights are the best epoch's (:mod:`trainer.early_stopping`).

Outputs: ``train/tensorboard`` (scalars), ``metrics.json`` (per-epoch history of all attempts;
the best epoch so far marked ``"best": true`` with early stopping), ``attempts.json`` (one entry
per attempt) and, at the end, ``train/final/weights`` (model weights).

A sweep trial (the config's :data:`~trainer.contract.TRIAL_KEY`, its settings already in the
``training`` section) keeps all of that state in its own directory,
:func:`trainer.contract.training_dir` (``<run_dir>/trials/trial-<k>``), and its TensorBoard events
in ``train/tensorboard/trial-<k>``: trials training at once never touch each other's files, one
TensorBoard over the run shows every trial, and a retried trial resumes from its own checkpoints
by the same code as a plain train. The run's data set pointer stays the run's.
"""

import math
import os
import signal
import sys
import threading
import time

from trainer import atomic, checkpoints, common, config as config_mod, contract, data, early_stopping, models
from trainer.common import LOG
from trainer.errors import Diverged

common.quiet_tensorflow()
import tensorflow as tf  # noqa: E402


class _Stop(object):
    """Set by SIGTERM; the loop checkpoints and exits at the end of the current compiled call."""

    requested = False

    @classmethod
    def install(cls):
        cls.requested = False
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, frame):
            LOG.warning("SIGTERM received: checkpointing at the end of the current loop of steps")
            cls.requested = True
        return signal.signal(signal.SIGTERM, handler)


class Attempts(object):
    """``attempts.json``: a list with one entry per training attempt, written atomically."""

    def __init__(self, directory, entry, steps_per_epoch=None):
        self.path = os.path.join(directory, contract.ATTEMPTS_FILE)
        self.entries = atomic.read_json(self.path, [])
        for old in self.entries:
            if old.get("status") == "running":
                old["status"] = "interrupted"
        if self.entries and steps_per_epoch and entry.get("resumed_from"):
            self._catch_up(self.entries[-1], entry["resumed_from"], steps_per_epoch)
        self.entry = entry
        self.entries.append(entry)
        self.save()

    @staticmethod
    def _catch_up(killed, resumed, steps_per_epoch):
        """Bring the killed try's record up to the checkpoint this try resumed from.

        A SIGKILL between writing a checkpoint and recording it leaves the record one checkpoint
        behind; the checkpoint restored says how far that try really got.
        """
        start = killed.get("start_step") or 0
        recorded = killed.get("last_checkpoint")
        recorded_step = int(recorded.rsplit("-", 1)[1]) if recorded else start
        if killed.get("status") != "interrupted" or resumed["step"] <= max(recorded_step, start):
            return
        killed.update(last_checkpoint=resumed["checkpoint"], steps_run=resumed["step"] - start,
                      epochs_run=killed.get("epochs_run", 0) + resumed["step"] // steps_per_epoch
                      - recorded_step // steps_per_epoch)

    def save(self, durable=True):
        """Write the file atomically (``durable``: fsynced, see :func:`trainer.atomic.write_json`)."""
        atomic.write_json(self.path, self.entries, durable=durable)

    def finish(self, status, **fields):
        """Record the end of this attempt."""
        self.entry.update(status=status, end_time=common.now_iso(), **fields)
        self.save()


def _append_history(directory, record):
    """Add one epoch to ``metrics.json`` in ``directory``, replacing an older record of the same epoch."""
    path = os.path.join(directory, contract.METRICS_FILE)
    history = [h for h in atomic.read_json(path, []) if h.get("epoch") != record["epoch"]]
    history.append(record)
    history.sort(key=lambda h: h["epoch"])
    atomic.write_json(path, history)
    return history


class StartupClock(object):
    """Seconds each start-up phase of this try took: what a retried try pays again before it
    trains. ``phases`` (in order) is kept in the attempt's entry of ``attempts.json`` as
    ``startup_s`` and logged once the first compiled call returned; ``process`` (interpreter
    start to the stage: Python, TensorFlow and trainer imports) only under ``python -m trainer``.
    """

    def __init__(self):
        self.started_at = common.process_started_at()
        self.phases = {}
        self._last = time.time()
        main = getattr(sys.modules.get("__main__"), "__spec__", None)
        if self.started_at is not None and getattr(main, "name", "") == "trainer.__main__":
            self.phases["process"] = round(self._last - self.started_at, 3)

    def mark(self, phase):
        """End ``phase`` now (it began when the previous one ended)."""
        now = time.time()
        self.phases[phase] = round(now - self._last, 3)
        self._last = now

    def first(self, phase, function, *args):
        """Call ``function(*args)``; the first time ``phase`` is seen, record its seconds (a
        one-off such as tracing that every try pays)."""
        if phase in self.phases:
            return function(*args)
        started = time.time()
        try:
            return function(*args)
        finally:
            self.phases[phase] = round(time.time() - started, 3)

    def describe(self):
        """``process 3.10 s, dataset 0.05 s, ...``: the phases in order, for the log."""
        return ", ".join("%s %.2f s" % item for item in self.phases.items())


#: With ``training.steps_per_loop`` 0, a compiled call runs about this long: long enough that the
#: per-call dispatch (about 0.5 ms) is noise next to it, short enough that SIGTERM, checked
#: between calls, is answered well inside ``docker stop``'s 10 s grace period.
AUTO_LOOP_SECONDS = 0.5
#: How much the automatic loop length may grow from one call to the next (timing noise of one
#: short call must not jump it to a loop that runs for seconds).
AUTO_LOOP_GROWTH = 8
MAX_STEPS_PER_LOOP = contract.SECTIONS["training"]["steps_per_loop"]["maximum"]
#: Epochs one training iterator spans (their datasets concatenated): a new iterator per epoch
#: costs about 5 ms of CPU (10% of a digits MLP epoch); a window keeps the graph small for long runs.
EPOCHS_PER_ITERATOR = 16


def class_weights(training, schema, stats):
    """The loss weight of each class id under ``training.class_weight``, or None (``none``).

    ``balanced`` (scikit-learn's): ``train examples / (classes present x examples of the class)``
    from the training split's class histogram (``stats.json``), so the weights average 1 over the
    training examples and the loss keeps its scale. A class with no training example gets 0 (no
    example carries it). Derived from the data set alone, so every try of a run gets the same.
    """
    if training["class_weight"] == "none":
        return None
    counts = stats["class_histogram"]["train"]
    if len(counts) != len(schema["class_names"]):
        raise ValueError("stats.json has %d class counts for %d classes"
                         % (len(counts), len(schema["class_names"])))
    present, total = sum(1 for count in counts if count), float(sum(counts))
    return [total / (present * count) if count else 0.0 for count in counts]


class Loop(object):
    """The training loop for one attempt; the same code runs under any tf.distribute strategy."""

    def __init__(self, config, strategy, schema, stats, dataset_dir, startup=None):
        self.config = config
        self.startup = startup or StartupClock()
        self.training = training = config["training"]
        self.strategy = strategy
        self.schema = schema
        self.run_dir = config["paths"]["run_dir"]
        self.trial = config_mod.trial_index(config)
        #: where this training keeps its state: the run dir, or the sweep trial's own dir
        self.state_dir = contract.training_dir(self.run_dir, self.trial)
        self.train_dir = os.path.join(self.state_dir, "train")
        self.spe = data.steps_per_epoch(schema, training["batch_size"])
        self.total_steps = training["epochs"] * self.spe
        with strategy.scope():
            self.model = models.build_model(config, schema, stats)
            self.optimizer = checkpoints.build_optimizer(training, self.total_steps)
            checkpoints.create_slots(self.optimizer, self.model)
            self.early = early_stopping.EarlyStopping(training, self.model)
            self.state = checkpoints.TrainState(self.model, self.optimizer,
                                                os.path.join(self.state_dir, contract.CHECKPOINTS_SUBDIR),
                                                training["keep_checkpoints"], best=self.early.best)
            self.train_loss = tf.keras.metrics.Mean("loss")
            self.train_acc = tf.keras.metrics.SparseCategoricalAccuracy("accuracy")
            self.val_loss = tf.keras.metrics.Mean("val_loss")
            self.val_acc = tf.keras.metrics.SparseCategoricalAccuracy("val_accuracy")
        self.loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
        weights = class_weights(training, schema, stats)
        self.class_weights = None if weights is None else tf.constant(weights, tf.float32)
        if weights is not None:
            LOG.info("class weights (%s): %s", training["class_weight"], ", ".join(
                "%s %.4g" % pair for pair in zip(schema["class_names"], weights)))
        self.base_train = data.base_dataset(dataset_dir, schema, "train", training["cache"])
        self.base_eval = data.base_dataset(dataset_dir, schema, "eval", training["cache"])
        # Built once: every evaluation takes the next eval_steps batches of the repeated set
        # (exactly one pass), instead of a new dataset and iterator per epoch.
        self.eval_steps = int(math.ceil(schema["counts"]["eval"] / float(training["batch_size"])))
        eval_batches = data.eval_dataset(self.base_eval, training["batch_size"]).repeat()
        self.eval_iterator = iter(strategy.experimental_distribute_dataset(eval_batches))
        # The batch dimension of this spec is unknown: one trace serves full and partial batches.
        signature = list(self.eval_iterator.element_spec)
        self.train_step = tf.function(self._train_step, input_signature=signature)
        self.train_loop = tf.function(self._train_loop)
        self.eval_loop = tf.function(self._eval_loop)
        self.all_finite = tf.function(self._all_finite)
        self.steps_per_loop = training["steps_per_loop"]
        self._auto_loop = 1  # the automatic length of the next call (steps_per_loop 0)
        self._auto_calls = 0

    # --- steps ----------------------------------------------------------------------------------
    def _replica_train(self, x, y):
        mixed = self.training["mixed_precision"]
        with tf.GradientTape() as tape:
            logits = self.model(x, training=True)
            per_example = self.loss_fn(y, logits)
            if self.class_weights is not None:
                # as Keras' class_weight: weighted examples, still divided by their count below
                per_example *= tf.cast(tf.gather(self.class_weights, y), per_example.dtype)
            # mean over the GLOBAL batch; exact for a partial last batch split over replicas,
            # and safe for a replica that got no example of it
            count = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, tf.cast(tf.shape(per_example)[0], tf.float32))
            loss = tf.reduce_sum(per_example) / tf.maximum(count, 1.0)
            if self.model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.model.losses))
            scaled = self.optimizer.get_scaled_loss(loss) if mixed else loss
        variables = self.model.trainable_variables
        grads = tape.gradient(scaled, variables)
        if mixed:
            grads = self.optimizer.get_unscaled_gradients(grads)
        self.optimizer.apply_gradients(zip(grads, variables))
        self.train_loss.update_state(per_example)
        self.train_acc.update_state(y, logits)
        return loss

    def _train_step(self, x, y):
        per_replica = self.strategy.run(self._replica_train, args=(x, y))
        self.state.step.assign_add(1)
        return self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    def _train_loop(self, iterator, steps):
        # a tf.range loop (a while loop in the graph): one Python call for ``steps`` steps
        for _ in tf.range(steps):
            x, y = next(iterator)
            self._train_step(x, y)

    def _replica_eval(self, x, y):
        logits = self.model(x, training=False)
        self.val_loss.update_state(self.loss_fn(y, logits))
        self.val_acc.update_state(y, logits)

    def _eval_loop(self, iterator, steps):
        for _ in tf.range(steps):
            x, y = next(iterator)
            self.strategy.run(self._replica_eval, args=(x, y))

    def _all_finite(self):
        ok = tf.math.is_finite(self.train_loss.result())
        for variable in self.model.trainable_variables:
            ok = tf.logical_and(ok, tf.reduce_all(tf.math.is_finite(variable)))
        return ok

    # --- checks and saves -----------------------------------------------------------------------
    def check_finite(self, epoch, step):
        """Raise Diverged if the running loss or any weight is NaN/inf (one scalar read back)."""
        if bool(self.all_finite().numpy()):
            return
        loss = float(self.train_loss.result().numpy())
        bad = [v.name for v in self.model.trainable_variables
               if not bool(tf.reduce_all(tf.math.is_finite(v)).numpy())]
        raise Diverged("training diverged at epoch %d step %d: loss is %s%s; this state "
                       "was not checkpointed (lower training.learning_rate, or clip the gradients with "
                       "training.gradient_clip_norm, e.g. 1.0?)"
                       % (epoch + 1, step, loss, ", non-finite weights in %s" % bad[0]
                          if bad else ""))

    def evaluate(self):
        """Loss and accuracy on the eval split (one pass of the eval iterator built once)."""
        self.val_loss.reset_state()
        self.val_acc.reset_state()
        self.startup.first("first_eval", self.eval_loop, self.eval_iterator,
                           tf.constant(self.eval_steps))
        return float(self.val_loss.result().numpy()), float(self.val_acc.result().numpy())

    def loop_length(self, step, epoch_end):
        """Steps of the next compiled call from ``step``: ``steps_per_loop`` (or the automatic
        length), cut short at the next checkpoint step and at the epoch end."""
        steps = min(epoch_end - step, self.steps_per_loop or self._auto_loop)
        every = self.training["checkpoint_every_steps"]
        if every:
            steps = min(steps, every - step % every)
        return steps

    def _run_loop(self, iterator, steps):
        """One compiled call of ``steps`` steps; with steps_per_loop 0, adapt the next length."""
        started = time.perf_counter()
        if self._auto_calls:
            self.train_loop(iterator, tf.constant(steps))
        else:  # the first call traces: the last phase of a try's start-up
            self.startup.first("first_call", self.train_loop, iterator,
                               tf.constant(steps))
            LOG.info("start-up of this try: %s", self.startup.describe())
        self._auto_calls += 1
        if not self.steps_per_loop and self._auto_calls > 1:  # the first call also traces
            per_step = (time.perf_counter() - started) / steps
            wanted = int(AUTO_LOOP_SECONDS / max(per_step, 1e-9))
            self._auto_loop = max(1, min(wanted, self._auto_loop * AUTO_LOOP_GROWTH,
                                         MAX_STEPS_PER_LOOP))

    def _checkpoint(self, attempts, epoch, step, first_step, stop=True, checked=False):
        """Check for divergence (unless just ``checked``), save a checkpoint, record it; exit 143
        if SIGTERM asked to."""
        if not checked:
            self.check_finite(epoch, step)
        path = self.startup.first("first_save", self.state.save)
        attempts.entry.update(steps_run=step - first_step, last_checkpoint=path)
        # Not fsynced: TensorFlow does not fsync the checkpoint files this record names either,
        # so the sync bought no safety, only a wait on the disk at every checkpoint.
        attempts.save(durable=False)
        if stop:
            self._stop_if_asked(attempts, epoch, step)
        return path

    @staticmethod
    def _stop_if_asked(attempts, epoch, step):
        if _Stop.requested:
            attempts.finish("interrupted")
            LOG.warning("stopped at epoch %d step %d after checkpoint %s", epoch + 1, step,
                        attempts.entry["last_checkpoint"])
            raise SystemExit(143)

    # --- the loop -------------------------------------------------------------------------------
    def train_iterator(self, first, end, done):
        """One iterator over the batches of epochs ``first`` to ``end - 1``: each epoch is
        :func:`trainer.data.epoch_dataset` (the first minus its ``done`` batches trained before a
        resume), concatenated, so the batches are exactly those of one iterator per epoch."""
        training = self.training

        def epoch_batches(epoch, skip=0):
            return data.epoch_dataset(self.base_train, epoch, training["seed"],
                                      training["batch_size"], training["shuffle_buffer"], skip)
        batches = epoch_batches(first, done)
        for epoch in range(first + 1, end):
            batches = batches.concatenate(epoch_batches(epoch))
        return iter(self.strategy.experimental_distribute_dataset(data.without_autotune_thread(batches)))

    def fit(self, attempts, writer):
        """Train from the current state to ``epochs * steps_per_epoch``; return the history."""
        training = self.training
        every = training["checkpoint_every_steps"]
        n_train = self.schema["counts"]["train"]
        step = int(self.state.step.numpy())
        first_step, started = step, time.time()
        history = atomic.read_json(os.path.join(self.state_dir, contract.METRICS_FILE), [])
        attempts.entry.update(startup_s=self.startup.phases,
                              process_started_at=self.startup.started_at)
        iterator, iterator_end = None, 0
        for epoch in range(int(self.state.epoch.numpy()), training["epochs"]):
            # also where a resumed try lands when its checkpoint's patience had already run out
            if self.early.due(epoch):
                LOG.info(self.early.describe_stop(epoch))
                break
            done = step - epoch * self.spe
            if epoch >= iterator_end:
                iterator_end = min(training["epochs"], epoch + EPOCHS_PER_ITERATOR)
                iterator = self.train_iterator(epoch, iterator_end, done)
            self.train_loss.reset_state()
            self.train_acc.reset_state()
            epoch_start = time.time()
            common.reset_peak_rss()
            epoch_end = (epoch + 1) * self.spe
            while step < epoch_end:
                steps = self.loop_length(step, epoch_end)
                self._run_loop(iterator, steps)
                step += steps
                if step < epoch_end and (_Stop.requested or (every and step % every == 0)):
                    self._checkpoint(attempts, epoch, step, first_step)  # (epoch end: below)
            # checked before evaluating, so a diverged model is neither evaluated nor recorded;
            # the epoch-end save below relies on this one check
            self.check_finite(epoch, step)
            seconds = time.time() - epoch_start
            examples = max(0, n_train - done * training["batch_size"])
            val_loss, val_acc = self.evaluate()
            self.state.epoch.assign(epoch + 1)
            record = {"epoch": epoch + 1, "step": step, "try_number": self.config["run"]
                      ["try_number"], "loss": float(self.train_loss.result().numpy()),
                      "accuracy": float(self.train_acc.result().numpy()),
                      "val_loss": val_loss, "val_accuracy": val_acc,
                      "learning_rate": checkpoints.current_learning_rate(self.optimizer),
                      "examples_per_sec": examples / max(seconds, 1e-9),
                      "seconds": seconds, "batches": step - epoch * self.spe - done,
                      "rss_peak_mb": common.peak_rss_mb(), "time": common.now_iso()}
            if self.early.update(epoch + 1, record):  # before the save below, which keeps it
                record["best"] = True
            history = _append_history(self.state_dir, record)
            attempts.entry["epochs_run"] += 1
            self._checkpoint(attempts, epoch, step, first_step, stop=False, checked=True)
            with writer.as_default(step=step):
                for name in ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_sec",
                             "learning_rate"):
                    tf.summary.scalar(name, record[name])
            writer.flush()
            per_step = (time.time() - started) / max(1, step - first_step)
            eta = int(per_step * (self.total_steps - step))
            LOG.info("epoch %d/%d: loss %.4f accuracy %.4f val_loss %.4f val_accuracy %.4f "
                     "(%.0f examples/s, ETA %d:%02d:%02d, peak RSS %s MiB)", epoch + 1,
                     training["epochs"], record["loss"], record["accuracy"], val_loss, val_acc,
                     record["examples_per_sec"], eta // 3600, eta // 60 % 60, eta % 60,
                     record["rss_peak_mb"])
            self._stop_if_asked(attempts, epoch, step)
        return history


def _write_final(loop, summary):
    """Write the final weights atomically to ``train/final`` (``weights.*`` + ``final.json``)."""
    tmp = atomic.make_temp_dir(loop.train_dir)
    checkpoints.write_weights(loop.model, os.path.join(tmp, "weights"))
    atomic.write_json(os.path.join(tmp, "final.json"), summary)
    final = os.path.join(loop.state_dir, contract.FINAL_SUBDIR)
    atomic.replace_dir(tmp, final)
    return final


def run(config):
    """Run the train stage; return ``{epochs, steps, resumed_from, final_loss, ...}``."""
    config = common.begin(config, "train")
    clock = StartupClock()
    training, run_info = config["training"], config["run"]
    dataset_dir, schema, stats = common.load_dataset(config)
    strategy = common.setup_tensorflow(training)
    clock.mark("dataset")
    loop = Loop(config, strategy, schema, stats, dataset_dir, startup=clock)
    clock.mark("model")
    final = os.path.join(loop.state_dir, contract.FINAL_SUBDIR)
    if os.path.exists(final):
        atomic.remove_dir(final)  # stale until this attempt reaches the target
    atomic.clean_stale_temps(loop.train_dir, max_age_s=0)  # one attempt at a time per run (or trial)
    if loop.trial is not None:
        LOG.info("sweep trial %d: %s; its state in %s", loop.trial,
                 common.describe_params(config[contract.TRIAL_KEY]["params"]), loop.state_dir)

    restored = loop.state.restore_newest()
    clock.mark("restore")
    resumed_from, warm = None, None
    if restored:
        epoch, step = int(loop.state.epoch.numpy()), int(loop.state.step.numpy())
        loop.state.check_inputs(restored, schema["fingerprint"], training["batch_size"])
        resumed_from = {"epoch": epoch, "step": step, "checkpoint": restored}
        LOG.info("resumed from epoch %d step %d (checkpoint %s)", epoch, step, restored)
    else:
        loop.state.record_inputs(schema["fingerprint"], training["batch_size"], loop.spe)
        LOG.info("starting from scratch")
        if training["warm_start"]:
            warm = checkpoints.warm_start(loop.model, common.model_root(config), schema["class_names"],
                                          schema["features"] if schema["format"] in contract.TABULAR_FORMATS else None)
            if warm:
                LOG.info("warm start: model weights initialised from version %d (%s)",
                         warm["version"], warm["path"])
    LOG.info("training %d epoch(s) x %d steps (batch %d, %d train / %d eval examples)",
             training["epochs"], loop.spe, training["batch_size"], schema["counts"]["train"],
             schema["counts"]["eval"])

    attempts = Attempts(loop.state_dir, {
        "try_number": run_info["try_number"], "resumed_from": resumed_from, "warm_start": warm,
        "start_time": common.now_iso(), "end_time": None, "status": "running",
        "start_step": int(loop.state.step.numpy()), "epochs_run": 0, "steps_run": 0,
        "target_steps": loop.total_steps}, steps_per_epoch=loop.spe)
    writer = tf.summary.create_file_writer(contract.tensorboard_dir(loop.run_dir, loop.trial))
    previous = _Stop.install()
    try:
        history = loop.fit(attempts, writer)
        # no check here: these weights are those of a checkpoint, checked before its save
        step, epoch = int(loop.state.step.numpy()), int(loop.state.epoch.numpy())
        best = loop.early.restore_best()
        by_epoch = {h.get("epoch"): h for h in history}
        last = by_epoch.get(best, {}) if best else (history[-1] if history else {})
        summary = {"epochs": epoch, "steps": step, "steps_per_epoch": loop.spe,
                   "final_loss": last.get("loss"), "final_accuracy": last.get("accuracy"),
                   "final_val_loss": last.get("val_loss"),
                   "final_val_accuracy": last.get("val_accuracy"),
                   "try_number": run_info["try_number"], "time": common.now_iso()}
        if loop.class_weights is not None:
            summary["class_weights"] = dict(zip(schema["class_names"],
                                                loop.class_weights.numpy().tolist()))
        if loop.early.best is not None:
            # the final_* figures above are then the best epoch's, whose weights these are
            summary.update(best_epoch=best, stopped_early=epoch < training["epochs"])
        final = _write_final(loop, summary)
    except Diverged as error:
        attempts.finish("diverged", error=str(error))
        raise
    except SystemExit:
        raise
    except BaseException as error:
        attempts.finish("failed", error="%s: %s" % (type(error).__name__, error))
        raise
    finally:
        writer.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    attempts.finish("completed", end_step=step)
    LOG.info("training done: %d epochs, %d steps, final weights in %s", epoch, step, final)
    result = dict(summary, resumed_from=resumed_from, warm_start=warm,
                  checkpoint_dir=loop.state.directory, final_dir=final)
    if loop.trial is not None:
        result["trial"] = config[contract.TRIAL_KEY]
    return result
