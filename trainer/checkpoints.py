"""Checkpointing of the training loop: optimizers, save/restore with fallback, warm start.

The training state is one ``tf.train.Checkpoint(model, optimizer, step, epoch, steps_per_epoch,
batch_size, dataset)`` (plus ``best`` with early stopping: :mod:`trainer.early_stopping`) managed
by a ``tf.train.CheckpointManager`` in ``<run_dir>/train/checkpoints`` (files ``ckpt-<step>.*``).
A checkpoint that cannot be restored (truncated data file, bad index, ...) is moved to
``checkpoints/corrupt/`` with a WARNING and the previous one is tried instead. One that reads but
does not fit the model and optimizer this try built (the run's training settings changed) stops
the try with :class:`~trainer.errors.BadInput`, every checkpoint left in place.
"""

import glob
import os
import re
import shutil

from trainer import columns, common
from trainer.common import LOG
from trainer.errors import BadInput
from trainer.sources import show_names

common.quiet_tensorflow()
import tensorflow as tf  # noqa: E402

CHECKPOINT_NAME = "ckpt"


class WarmUp(tf.keras.optimizers.schedules.LearningRateSchedule):
    """A linear warm-up: step ``k`` of the first ``warmup_steps`` trains at ``(k + 1) / warmup_steps``
    of ``rate``; from then on ``after`` (a number, or a schedule of the steps since the warm-up)."""

    def __init__(self, rate, warmup_steps, after):
        super(WarmUp, self).__init__()
        self.rate, self.warmup_steps, self.after = rate, warmup_steps, after

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warm = self.rate * (step + 1.0) / float(self.warmup_steps)
        if callable(self.after):
            later = self.after(tf.maximum(step - self.warmup_steps, 0.0))
        else:
            later = tf.constant(self.after, tf.float32)
        return tf.where(step < self.warmup_steps, warm, tf.cast(later, tf.float32))

    def get_config(self):
        after = self.after.get_config() if callable(self.after) else self.after
        return {"rate": self.rate, "warmup_steps": self.warmup_steps, "after": after}


def learning_rate(training, total_steps=None):
    """``training.learning_rate``, or with ``learning_rate_schedule`` cosine a schedule of the
    optimizer's step that reaches 0 at ``total_steps``; with ``learning_rate_warmup_epochs`` that
    many epochs' steps ramp up to it first (:class:`WarmUp`; the cosine then spans the steps after
    them). The step is the optimizer's iteration count, which the checkpoint keeps: a resumed try
    continues the curve where the killed one left it."""
    rate, schedule = training["learning_rate"], training["learning_rate_schedule"]
    warmup_epochs = training["learning_rate_warmup_epochs"]
    if schedule == "constant" and not warmup_epochs:
        return rate
    if not total_steps:
        raise ValueError("a %s learning rate schedule%s needs the run's total steps"
                         % (schedule, " with a warm-up" if warmup_epochs else ""))
    warmup_steps = warmup_epochs * total_steps // training["epochs"]
    after = rate
    if schedule == "cosine":
        after = tf.keras.optimizers.schedules.CosineDecay(rate, decay_steps=total_steps - warmup_steps)
    return WarmUp(rate, warmup_steps, after) if warmup_steps else after


def current_learning_rate(optimizer):
    """The learning rate the optimizer's next step uses (its schedule at its step, if it has one)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    rate = inner.learning_rate
    if isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
        rate = rate(inner.iterations)
    return float(tf.keras.backend.get_value(rate))


def build_optimizer(training, total_steps=None):
    """The optimizer named by ``training.optimizer`` (wrapped for loss scaling if mixed), at
    :func:`learning_rate` (``total_steps``: the run's target step, for a schedule).

    ``training.gradient_clip_norm`` becomes Keras' ``global_clipnorm``, which ``apply_gradients``
    applies after summing the replicas' gradients: the norm of the global batch's gradient, as on
    one device (a clip inside each replica's step would clip each GPU's share instead).
    """
    rate = learning_rate(training, total_steps)
    name = training["optimizer"]
    clip = {"global_clipnorm": training["gradient_clip_norm"]} if training["gradient_clip_norm"] else {}
    if name == "adam":
        optimizer = tf.keras.optimizers.Adam(rate, **clip)
    elif name == "sgd":
        optimizer = tf.keras.optimizers.SGD(rate, momentum=0.9, **clip)
    elif name == "rmsprop":
        optimizer = tf.keras.optimizers.RMSprop(rate, **clip)
    else:
        raise BadInput("training.optimizer %r is not one of adam, sgd, rmsprop" % name)
    if training["mixed_precision"]:
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def create_slots(optimizer, model):
    """Create the optimizer's slot variables now, so a restore fills them immediately."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if hasattr(inner, "_create_all_weights"):
        inner._create_all_weights(model.trainable_variables)
    else:  # fallback: a zero update creates the slots, then undo the iteration count
        zeros = [tf.zeros_like(v) for v in model.trainable_variables]
        optimizer.apply_gradients(zip(zeros, model.trainable_variables))
        optimizer.iterations.assign(0)
    if inner is not optimizer:
        _ = optimizer.iterations  # the loss scale variables of the wrapper


#: Saves a run writes eagerly before it traces the write. Tracing costs about as much CPU as
#: this many eager saves (cnn on 64x64 images: 170-230 ms against 24-36 ms each; a traced save
#: then costs 12-17 ms), so a short run (or a short resumed try) never pays the trace, and a long
#: one pays at most about twice the CPU of the best choice made in hindsight.
EAGER_SAVES = 8


def _index(prefix):
    """``(name, shape)`` of every tensor of a checkpoint, from its index file alone."""
    return [(name, tuple(shape)) for name, shape in tf.train.list_variables(prefix)]


class _TracedWrite(object):
    """What the ``CheckpointManager`` writes through: ``Checkpoint.write``, traced after
    :data:`EAGER_SAVES` eager saves.

    An eager ``write`` walks the object graph and builds the save ops in Python on every save
    (about 11 ms of CPU for the digits MLP, more than the 20 steps between two of its saves);
    traced, that happens once and each save runs the compiled ops (about 3 ms). A trace freezes
    the object graph it saw, so the first traced checkpoint must hold the same variables, with
    the same shapes, as the last eager one (compared from the two index files, no data read
    back); if it does not (the loss scale of a mixed-precision optimizer, for one, is left out of
    a trace), that checkpoint is written again eagerly, and so are all later ones. A change in
    the number of variables starts over with eager saves.
    """

    def __init__(self, checkpoint, variables):
        self.checkpoint = checkpoint
        self._variables = variables
        self._traced = None
        self._count = None
        self._eager_saves = 0
        self._reference = None  # (name, shape) of every tensor in the last eager checkpoint
        self._verified = False
        self._eager = False

    @property
    def save_counter(self):
        """The checkpoint's save counter (the manager increments it)."""
        return self.checkpoint.save_counter

    def write(self, file_prefix, options=None):
        """Write the checkpoint at ``file_prefix``; return it (as ``Checkpoint.write`` does)."""
        count = len(self._variables())
        if count != self._count:
            self._count, self._traced, self._eager_saves, self._verified = count, None, 0, False
        if self._eager or self._eager_saves < EAGER_SAVES:
            path = self.checkpoint.write(file_prefix, options=options)
            self._eager_saves += 1
            if self._eager_saves == EAGER_SAVES:
                self._reference = _index(path)
            return path
        if self._traced is None:
            _ = self.checkpoint.save_counter  # created before tracing, so it is in the graph
            checkpoint = self.checkpoint
            self._traced = tf.function(lambda prefix: checkpoint.write(prefix, options=options))
        # the eager write creates the directory itself; the traced one takes the prefix as a tensor
        # and does not
        tf.io.gfile.makedirs(os.path.dirname(file_prefix))
        self._traced(tf.constant(file_prefix))
        if not self._verified:
            written = _index(file_prefix)
            if written != self._reference:
                missing = sorted(set(self._reference) - set(written))
                LOG.info("checkpoints are written eagerly: a traced write misses variables (%s)",
                         ", ".join(name for name, _ in missing[:3]) or "shapes differ")
                self._eager = True
                return self.checkpoint.write(file_prefix, options=options)
            self._verified = True
        return file_prefix


class TrainState(object):
    """The checkpointed training state and its manager."""

    def __init__(self, model, optimizer, directory, keep, best=None):
        """``best``: the :class:`trainer.early_stopping.BestEpoch` saved with the state, if any."""
        def counter(name):
            return tf.Variable(0, dtype=tf.int64, trainable=False, name=name,
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

        self.model = model
        self.optimizer = optimizer
        self.step = counter("step")
        self.epoch = counter("epoch")
        self.steps_per_epoch = counter("steps_per_epoch")
        # What the saved position means: a step counts batches of this size over this data set,
        # so a try with another batch size or other data cannot continue from it.
        self.batch_size = counter("batch_size")
        self.dataset = counter("dataset")
        self.directory = directory
        self.keep = keep
        self.best = best
        # without early stopping the checkpoint holds exactly what it held before it existed
        extra = {"best": best} if best is not None else {}
        self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=self.step,
                                              epoch=self.epoch,
                                              steps_per_epoch=self.steps_per_epoch,
                                              batch_size=self.batch_size, dataset=self.dataset,
                                              **extra)
        # decided here, inside the loop's strategy scope (a quarantine reopens the manager outside)
        self._one_replica = tf.distribute.get_strategy().num_replicas_in_sync == 1
        self.manager = self._open_manager()

    def _open_manager(self):
        # One replica: saves through a traced write. Under a multi-replica strategy the eager
        # write stays (saving mirrored variables from a function is not exercised here).
        writer = self.checkpoint
        if self._one_replica:
            writer = _TracedWrite(self.checkpoint, self._variables)
        return tf.train.CheckpointManager(writer, self.directory,
                                          max_to_keep=self.keep, checkpoint_name=CHECKPOINT_NAME)

    def _variables(self):
        best = self.best.state_variables() if self.best is not None else []
        return (list(self.model.variables) + list(self.optimizer.variables())
                + [self.step, self.epoch, self.steps_per_epoch, self.batch_size, self.dataset]
                + best)

    def candidates(self):
        """Checkpoint prefixes, newest first: the manager's list plus any stray ``ckpt-N``
        (also when the ``checkpoint`` state file is unreadable and TF ignored it)."""
        listed = list(self.manager.checkpoints)
        pattern = os.path.join(self.directory, CHECKPOINT_NAME + "-*.index")
        for index in glob.glob(pattern):
            prefix = index[:-len(".index")]
            if prefix not in listed:
                listed.append(prefix)

        def number(prefix):
            match = re.search(r"-(\d+)$", prefix)
            return int(match.group(1)) if match else -1
        return sorted(listed, key=number, reverse=True)

    def restore_newest(self):
        """Restore the newest readable checkpoint; return its path, or None (from scratch)."""
        snapshot = [v.numpy() for v in self._variables()]
        bad = []
        restored = None
        for path in self.candidates():
            try:
                without_best = self.best is not None and not _has_best(path)
                checkpoint = self._checkpoint_without_best() if without_best else self.checkpoint
                status = checkpoint.restore(path)
                status.assert_existing_objects_matched()
                restored = path
                if without_best:
                    self.best.begin_at(int(self.epoch.numpy()), self.model)
                    LOG.warning("checkpoint %s was saved without early stopping: the best epoch is "
                                "tracked from epoch %d on", path, int(self.epoch.numpy()))
                break
            except (AssertionError, ValueError) as error:
                # Read, but made of other objects or shapes: the run's training settings changed
                # since it was saved. Every older checkpoint of the run is the same, and setting
                # them aside would start the run over; a partial restore also leaves restores
                # pending that fail later with an unrelated error. Stop here, keep them all.
                raise BadInput(
                    "checkpoint %s does not fit the model and optimizer this try built (%s: %s): "
                    "the run's training settings (model, model_kwargs, optimizer, "
                    "learning_rate_schedule, learning_rate_warmup_epochs, mixed_precision) changed "
                    "since it was saved. Fix: put "
                    "back the settings this run started with, or start a new DAG run; the run's "
                    "checkpoints are left as they are" % (path, type(error).__name__,
                                                          _first_line(error)))
            except Exception as error:  # any unreadable checkpoint: fall back to the previous
                reason = _first_line(error)
                LOG.warning("checkpoint %s cannot be restored (%s: %s); falling back to the "
                            "previous checkpoint", path, type(error).__name__, reason)
                bad.append(path)
        if restored is None:
            for var, value in zip(self._variables(), snapshot):
                var.assign(value)
        if bad:
            self._quarantine(bad)
        return restored

    def _checkpoint_without_best(self):
        """The state's checkpoint less ``best``: to restore one saved before early stopping was on
        for this run (its other objects are this state's own, so restoring fills them)."""
        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer, step=self.step,
                                   epoch=self.epoch, steps_per_epoch=self.steps_per_epoch,
                                   batch_size=self.batch_size, dataset=self.dataset)

    def _quarantine(self, bad):
        """Move unreadable checkpoints to ``corrupt/`` and drop them from the manager's state."""
        target = os.path.join(self.directory, "corrupt")
        os.makedirs(target, exist_ok=True)
        for prefix in bad:
            for path in glob.glob(glob.escape(prefix) + ".*"):
                shutil.move(path, os.path.join(target, os.path.basename(path)))
        remaining = [p for p in reversed(self.candidates())
                     if p not in bad and os.path.exists(p + ".index")]  # oldest first
        state = os.path.join(self.directory, "checkpoint")
        if remaining:
            tf.compat.v1.train.update_checkpoint_state(self.directory, remaining[-1],
                                                       all_model_checkpoint_paths=remaining)
        elif os.path.exists(state):
            os.remove(state)
        self.manager = self._open_manager()

    def record_inputs(self, fingerprint, batch_size, steps_per_epoch):
        """Record the data set and batch size the steps of this state count (saved with it)."""
        self.dataset.assign(fingerprint_id(fingerprint))
        self.batch_size.assign(batch_size)
        self.steps_per_epoch.assign(steps_per_epoch)

    def check_inputs(self, path, fingerprint, batch_size):
        """Raise BadInput unless the restored state was trained on ``fingerprint`` at ``batch_size``.

        Comparing steps per epoch is not enough: 245 rows give 8 steps at batch 32 and at 31.
        """
        saved_batch = int(self.batch_size.numpy())
        if saved_batch != batch_size:
            raise BadInput("training.batch_size: checkpoint %s was taken at batch size %d, this try "
                           "asks for %d, so its step count means other batches. Fix: keep "
                           "batch_size %d for this run, or start a new DAG run"
                           % (path, saved_batch, batch_size, saved_batch))
        saved_id = int(self.dataset.numpy())
        if saved_id != fingerprint_id(fingerprint):
            raise BadInput("data: checkpoint %s was taken on data set %015x..., this try's prep chose "
                           "%s (the data or the prep settings changed since). Fix: restore the data "
                           "this run started with, or start a new DAG run"
                           % (path, saved_id, fingerprint[:15] + "..."))

    def save(self):
        """Save a checkpoint numbered by the global step; return its path."""
        return self.manager.save(checkpoint_number=int(self.step.numpy()))


def _first_line(error):
    """The first line of an error's text, at most 300 characters."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


def _has_best(prefix):
    """Whether the checkpoint at ``prefix`` holds early stopping's best epoch (from its index; an
    unreadable index says yes, so the full restore fails on it and names why)."""
    try:
        return any(name.startswith("best/") for name, _ in tf.train.list_variables(prefix))
    except Exception:  # noqa: BLE001 -- the restore that follows reports it
        return True


def fingerprint_id(fingerprint):
    """A data set fingerprint (sha256 hex) as a checkpointable int64: its first 60 bits."""
    return int(fingerprint[:15], 16)


def write_weights(model, prefix):
    """Write only the model's weights (``tf.train.Checkpoint(model=...)``) at ``prefix``."""
    return tf.train.Checkpoint(model=model).write(prefix)


def read_weights(model, prefix, what):
    """Read weights written by :func:`write_weights`; BadInput naming ``what`` if they don't fit."""
    if not os.path.exists(prefix + ".index"):
        raise BadInput("%s: no weights at %s" % (what, prefix))
    try:
        tf.train.Checkpoint(model=model).read(prefix).assert_existing_objects_matched()
    except (ValueError, AssertionError, tf.errors.OpError) as error:
        raise BadInput("%s: the weights at %s do not fit the model built from this config (%s)"
                       % (what, prefix, str(error).splitlines()[0][:300]))


def warm_start(model, models_root, class_names, features=None):
    """Load the weights of the newest exported version that has them; return its info or None.

    None too when that version was trained on other classes than ``class_names`` (the data set's):
    its output ``i`` means another class, or there are more or fewer outputs. Training then starts
    from scratch, with a warning that names both lists; ``data.classes`` keeps the list fixed.
    Likewise when the version's table columns (``features``, the schema's) differ in what the
    model's inputs mean (:func:`trainer.columns.input_layout`): a changed vocabulary moves the
    rows of one-hot and embedding weights to other values, which no shape check would notice.
    """
    for version in reversed(common.list_versions(models_root)):
        prefix = os.path.join(models_root, str(version), "variables_ckpt", "model")
        if os.path.exists(prefix + ".index"):
            metadata = common.read_version_metadata(models_root, version)
            trained_on = common.version_class_names(metadata)
            if trained_on is not None and trained_on != list(class_names):
                LOG.warning("warm start: version %d was trained on the classes [%s], this data set has [%s], so "
                            "its outputs mean other classes; random initialisation instead. Fix: list the "
                            "classes in data.classes so every night numbers them alike",
                            version, show_names(trained_on), show_names(list(class_names)))
                return None
            old = ((metadata or {}).get("data") or {}).get("features")
            if features is not None and old is not None:
                changed = [a[0] for a, b in zip(columns.input_layout(features), columns.input_layout(old)) if a != b]
                if changed or len(features) != len(old):
                    LOG.warning("warm start: version %d was trained on other table columns than this data set's "
                                "(%s: type, vocabulary, hash buckets or missing values differ), so its input "
                                "weights would stand for other values; random initialisation instead. Fix: pin "
                                "the columns with data.columns, data.max_vocabulary and data.min_frequency so "
                                "nights share a vocabulary, or accept a fresh start",
                                version, show_names(changed or ["the column list"]))
                    return None
            read_weights(model, prefix, "warm start from version %d" % version)
            return {"version": version, "path": prefix}
    LOG.info("warm start: no exported version with weights under %s; random initialisation", models_root)
    return None
