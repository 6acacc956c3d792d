"""The train stage: a custom training loop with checkpoint/resume (orbit style, no ``fit``).

State lives in ``<run_dir>/train/checkpoints`` (``tf.train.CheckpointManager``), saved every
``training.checkpoint_every_steps`` steps and at every epoch end. A retried task resumes from the
newest readable checkpoint; mid-epoch it replays the rest of that epoch's batches exactly (see
:mod:`trainer.data`). Before any save and at every epoch end the loss and weights are checked:
NaN/inf raises :class:`~trainer.errors.Diverged` and nothing is saved. SIGTERM (``docker stop``)
saves a checkpoint at the current step and exits 143.

Outputs: ``train/tensorboard`` (scalars), ``metrics.json`` (per-epoch history of all attempts),
``attempts.json`` (one entry per attempt) and, at the end, ``train/final/weights`` (model weights).
"""

import math
import os
import signal
import threading
import time

from trainer import atomic, checkpoints, common, contract, data, models
from trainer.common import LOG
from trainer.errors import BadInput, Diverged

common.quiet_tensorflow()
import tensorflow as tf  # noqa: E402


class _Stop(object):
    """Set by SIGTERM; the loop checkpoints and exits at the next step boundary."""

    requested = False

    @classmethod
    def install(cls):
        cls.requested = False
        if threading.current_thread() is not threading.main_thread():
            return None

        def handler(signum, frame):
            LOG.warning("SIGTERM received: checkpointing at the end of the current step")
            cls.requested = True
        return signal.signal(signal.SIGTERM, handler)


class Attempts(object):
    """``attempts.json``: a list with one entry per training attempt, written atomically."""

    def __init__(self, run_dir, entry):
        self.path = os.path.join(run_dir, contract.ATTEMPTS_FILE)
        self.entries = atomic.read_json(self.path, [])
        for old in self.entries:
            if old.get("status") == "running":
                old["status"] = "interrupted"
        self.entry = entry
        self.entries.append(entry)
        self.save()

    def save(self):
        """Write the file atomically."""
        atomic.write_json(self.path, self.entries)

    def finish(self, status, **fields):
        """Record the end of this attempt."""
        self.entry.update(status=status, end_time=common.now_iso(), **fields)
        self.save()


def _append_history(run_dir, record):
    """Add one epoch to ``metrics.json``, replacing an older record of the same epoch."""
    path = os.path.join(run_dir, contract.METRICS_FILE)
    history = [h for h in atomic.read_json(path, []) if h.get("epoch") != record["epoch"]]
    history.append(record)
    history.sort(key=lambda h: h["epoch"])
    atomic.write_json(path, history)
    return history


def _finite(value):
    return not (math.isnan(value) or math.isinf(value))


class Loop(object):
    """The training loop for one attempt; the same code runs under any tf.distribute strategy."""

    def __init__(self, config, strategy, schema, stats, dataset_dir):
        self.config = config
        self.training = training = config["training"]
        self.strategy = strategy
        self.schema = schema
        self.run_dir = config["paths"]["run_dir"]
        self.train_dir = os.path.join(self.run_dir, "train")
        self.spe = data.steps_per_epoch(schema, training["batch_size"])
        self.total_steps = training["epochs"] * self.spe
        with strategy.scope():
            self.model = models.build_model(config, schema, stats)
            self.optimizer = checkpoints.build_optimizer(training)
            checkpoints.create_slots(self.optimizer, self.model)
            self.state = checkpoints.TrainState(self.model, self.optimizer,
                                                os.path.join(self.run_dir, contract.CHECKPOINTS_SUBDIR),
                                                training["keep_checkpoints"])
            self.train_loss = tf.keras.metrics.Mean("loss")
            self.train_acc = tf.keras.metrics.SparseCategoricalAccuracy("accuracy")
            self.val_loss = tf.keras.metrics.Mean("val_loss")
            self.val_acc = tf.keras.metrics.SparseCategoricalAccuracy("val_accuracy")
        self.loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
        self.base_train = data.base_dataset(dataset_dir, schema, "train", training["cache"])
        self.base_eval = data.base_dataset(dataset_dir, schema, "eval", training["cache"])
        self.train_step = tf.function(self._train_step)
        self.eval_step = tf.function(self._eval_step)

    # --- steps ----------------------------------------------------------------------------------
    def _replica_train(self, x, y):
        mixed = self.training["mixed_precision"]
        with tf.GradientTape() as tape:
            logits = self.model(x, training=True)
            per_example = self.loss_fn(y, logits)
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

    def _replica_eval(self, x, y):
        logits = self.model(x, training=False)
        self.val_loss.update_state(self.loss_fn(y, logits))
        self.val_acc.update_state(y, logits)

    def _eval_step(self, x, y):
        self.strategy.run(self._replica_eval, args=(x, y))

    # --- checks and saves -----------------------------------------------------------------------
    def check_finite(self, epoch, step):
        """Raise Diverged if the running loss or any weight is NaN/inf."""
        loss = float(self.train_loss.result().numpy())
        bad = [v.name for v in self.model.trainable_variables
               if not bool(tf.reduce_all(tf.math.is_finite(v)).numpy())]
        if not _finite(loss) or bad:
            raise Diverged("training diverged at epoch %d step %d: loss is %s%s; this state "
                           "was not checkpointed (lower training.learning_rate?)"
                           % (epoch + 1, step, loss, ", non-finite weights in %s" % bad[0]
                              if bad else ""))

    def evaluate(self):
        """Loss and accuracy on the eval split."""
        self.val_loss.reset_state()
        self.val_acc.reset_state()
        dataset = data.eval_dataset(self.base_eval, self.training["batch_size"])
        for x, y in self.strategy.experimental_distribute_dataset(dataset):
            self.eval_step(x, y)
        return float(self.val_loss.result().numpy()), float(self.val_acc.result().numpy())

    def _checkpoint(self, attempts, epoch, step, first_step, stop=True):
        """Check for divergence, save a checkpoint, record it; exit 143 if SIGTERM asked to."""
        self.check_finite(epoch, step)
        path = self.state.save()
        attempts.entry.update(steps_run=step - first_step, last_checkpoint=path)
        attempts.save()
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
    def fit(self, attempts, writer):
        """Train from the current state to ``epochs * steps_per_epoch``; return the history."""
        training = self.training
        every = training["checkpoint_every_steps"]
        n_train = self.schema["counts"]["train"]
        step = int(self.state.step.numpy())
        first_step, started = step, time.time()
        history = atomic.read_json(os.path.join(self.run_dir, contract.METRICS_FILE), [])
        for epoch in range(int(self.state.epoch.numpy()), training["epochs"]):
            done = step - epoch * self.spe
            dataset = data.epoch_dataset(self.base_train, epoch, training["seed"],
                                         training["batch_size"], training["shuffle_buffer"], done)
            self.train_loss.reset_state()
            self.train_acc.reset_state()
            epoch_start = time.time()
            for x, y in self.strategy.experimental_distribute_dataset(dataset):
                self.train_step(x, y)
                step += 1
                if step % self.spe and (_Stop.requested or (every and step % every == 0)):
                    self._checkpoint(attempts, epoch, step, first_step)  # (epoch end: below)
            self.check_finite(epoch, step)
            seconds = time.time() - epoch_start
            examples = max(0, n_train - done * training["batch_size"])
            val_loss, val_acc = self.evaluate()
            self.state.epoch.assign(epoch + 1)
            record = {"epoch": epoch + 1, "step": step, "try_number": self.config["run"]
                      ["try_number"], "loss": float(self.train_loss.result().numpy()),
                      "accuracy": float(self.train_acc.result().numpy()),
                      "val_loss": val_loss, "val_accuracy": val_acc,
                      "examples_per_sec": examples / max(seconds, 1e-9),
                      "seconds": seconds, "batches": step - epoch * self.spe - done,
                      "time": common.now_iso()}
            history = _append_history(self.run_dir, record)
            attempts.entry["epochs_run"] += 1
            self._checkpoint(attempts, epoch, step, first_step, stop=False)
            with writer.as_default(step=step):
                for name in ("loss", "accuracy", "val_loss", "val_accuracy", "examples_per_sec"):
                    tf.summary.scalar(name, record[name])
            writer.flush()
            per_step = (time.time() - started) / max(1, step - first_step)
            eta = int(per_step * (self.total_steps - step))
            LOG.info("epoch %d/%d: loss %.4f accuracy %.4f val_loss %.4f val_accuracy %.4f "
                     "(%.0f examples/s, ETA %d:%02d:%02d)", epoch + 1, training["epochs"],
                     record["loss"], record["accuracy"], val_loss, val_acc,
                     record["examples_per_sec"], eta // 3600, eta // 60 % 60, eta % 60)
            self._stop_if_asked(attempts, epoch, step)
        return history


def _write_final(loop, summary):
    """Write the final weights atomically to ``train/final`` (``weights.*`` + ``final.json``)."""
    tmp = atomic.make_temp_dir(loop.train_dir)
    checkpoints.write_weights(loop.model, os.path.join(tmp, "weights"))
    atomic.write_json(os.path.join(tmp, "final.json"), summary)
    final = os.path.join(loop.run_dir, contract.FINAL_SUBDIR)
    atomic.replace_dir(tmp, final)
    return final


def run(config):
    """Run the train stage; return ``{epochs, steps, resumed_from, final_loss, ...}``."""
    config = common.begin(config, "train")
    training, run_info = config["training"], config["run"]
    dataset_dir, schema, stats = common.load_dataset(config)
    strategy = common.setup_tensorflow(training)
    loop = Loop(config, strategy, schema, stats, dataset_dir)
    final = os.path.join(loop.run_dir, contract.FINAL_SUBDIR)
    if os.path.exists(final):
        atomic.remove_dir(final)  # stale until this attempt reaches the target
    atomic.clean_stale_temps(loop.train_dir, max_age_s=0)  # one attempt at a time per run

    restored = loop.state.restore_newest()
    resumed_from, warm = None, None
    if restored:
        epoch, step = int(loop.state.epoch.numpy()), int(loop.state.step.numpy())
        saved_spe = int(loop.state.steps_per_epoch.numpy())
        if saved_spe != loop.spe:
            raise BadInput("checkpoint %s was taken with %d steps per epoch, this config gives %d"
                           " (training.batch_size or the data set changed): use a new run"
                           % (restored, saved_spe, loop.spe))
        resumed_from = {"epoch": epoch, "step": step, "checkpoint": restored}
        LOG.info("resumed from epoch %d step %d (checkpoint %s)", epoch, step, restored)
    else:
        loop.state.steps_per_epoch.assign(loop.spe)
        LOG.info("starting from scratch")
        if training["warm_start"]:
            warm = checkpoints.warm_start(loop.model, common.model_root(config))
            if warm:
                LOG.info("warm start: model weights initialised from version %d (%s)",
                         warm["version"], warm["path"])
            else:
                LOG.info("warm start: no exported version of %r with weights under %s; "
                         "random initialisation", config["export"]["model_name"],
                         common.model_root(config))
    LOG.info("training %d epoch(s) x %d steps (batch %d, %d train / %d eval examples)",
             training["epochs"], loop.spe, training["batch_size"], schema["counts"]["train"],
             schema["counts"]["eval"])

    attempts = Attempts(loop.run_dir, {
        "try_number": run_info["try_number"], "resumed_from": resumed_from, "warm_start": warm,
        "start_time": common.now_iso(), "end_time": None, "status": "running",
        "start_step": int(loop.state.step.numpy()), "epochs_run": 0, "steps_run": 0,
        "target_steps": loop.total_steps})
    writer = tf.summary.create_file_writer(os.path.join(loop.run_dir, contract.TENSORBOARD_SUBDIR))
    previous = _Stop.install()
    try:
        history = loop.fit(attempts, writer)
        step, epoch = int(loop.state.step.numpy()), int(loop.state.epoch.numpy())
        loop.check_finite(max(0, epoch - 1), step)
        last = history[-1] if history else {}
        summary = {"epochs": epoch, "steps": step, "steps_per_epoch": loop.spe,
                   "final_loss": last.get("loss"), "final_accuracy": last.get("accuracy"),
                   "final_val_loss": last.get("val_loss"),
                   "final_val_accuracy": last.get("val_accuracy"),
                   "try_number": run_info["try_number"], "time": common.now_iso()}
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
    return result
