"""Early stopping: the best epoch so far, its weights, and when to stop.

With ``training.early_stopping_patience`` N > 0, the train stage stops once N epochs in a row
have not improved ``training.early_stopping_monitor`` (``val_loss``: lower is better;
``val_accuracy``: higher) by more than ``training.early_stopping_min_delta``, as Keras'
``EarlyStopping`` callback does. The final weights are then those of the best epoch, whether
training stopped early or ran all its epochs (Keras' ``restore_best_weights``).

The best score, its epoch and a copy of the model's variables at that epoch are one more object
of the checkpoint (:class:`BestEpoch`, given to :class:`trainer.checkpoints.TrainState`), so a
resumed try continues with exactly the best epoch the restored checkpoint had seen, whichever
checkpoint it falls back to. A try that restores a state whose patience has run out trains
nothing and writes the best weights again. With patience 0 nothing is added to the checkpoint:
its files are those of a run without early stopping. A checkpoint saved before early stopping was
turned on for a run (its DAG file changed, then the task was cleared) is restored all the same,
and the best epoch is tracked from there on.
"""

import math

from trainer import common
from trainer.common import LOG

common.quiet_tensorflow()
import tensorflow as tf  # noqa: E402


class BestEpoch(tf.Module):
    """Checkpointed: the best epoch (1-based; 0 = none yet), its score and the model's variables."""

    def __init__(self, model):
        super(BestEpoch, self).__init__(name="best_epoch")
        first = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch", aggregation=first)
        # higher is better (val_loss is stored negated); -inf: any finite first score improves it
        self.score = tf.Variable(-math.inf, dtype=tf.float64, trainable=False, name="score",
                                 aggregation=first)
        # zeros, not the model's values: a variable synchronised on read (batch norm's moving
        # statistics under a multi-replica strategy) has no single value to start from here
        self.copies = [tf.Variable(tf.zeros(v.shape, dtype=v.dtype), trainable=False,
                                   name="copy_%d" % i, aggregation=first)
                       for i, v in enumerate(model.variables)]

    def begin_at(self, epoch, model):
        """Track from ``epoch`` on, as if it had been the best so far with ``model``'s weights and
        no score (a run whose checkpoint was saved before early stopping was turned on): the next
        finite score is the best, and patience counts from there."""
        self.epoch.assign(epoch)
        self.score.assign(-math.inf)
        for copy, variable in zip(self.copies, model.variables):
            copy.assign(variable)

    def state_variables(self):
        """Every variable of this object (for the checkpoint's variable list)."""
        return [self.epoch, self.score] + list(self.copies)


class EarlyStopping(object):
    """The early-stopping policy of one training attempt (inactive with patience 0)."""

    def __init__(self, training, model):
        self.patience = training["early_stopping_patience"]
        self.monitor = training["early_stopping_monitor"]
        self.min_delta = float(training["early_stopping_min_delta"])
        self.model = model
        self.best = BestEpoch(model) if self.patience else None

    @property
    def best_epoch(self):
        """The best epoch so far (1-based), 0 before any, None when early stopping is off."""
        return int(self.best.epoch.numpy()) if self.best is not None else None

    def _score(self, record):
        value = float(record[self.monitor])
        return -value if self.monitor == "val_loss" else value

    def update(self, epoch, record):
        """After epoch ``epoch`` (1-based) was evaluated: keep it if it improved on the best by
        more than ``min_delta``; return whether it did. Call before that epoch's checkpoint."""
        if self.best is None:
            return False
        score = self._score(record)
        if not (math.isfinite(score) and score > float(self.best.score.numpy()) + self.min_delta):
            return False
        self.best.epoch.assign(epoch)
        self.best.score.assign(score)
        for copy, variable in zip(self.best.copies, self.model.variables):
            copy.assign(variable)
        return True

    def due(self, epochs_done):
        """Whether training stops before epoch ``epochs_done + 1``: ``patience`` epochs have run
        since the best one (or since the start, when no epoch had a finite score)."""
        return self.best is not None and epochs_done - self.best_epoch >= self.patience

    def describe_stop(self, epochs_done):
        """The log line of a stop before epoch ``epochs_done + 1``."""
        best = self.best_epoch
        if not best:
            return ("early stopping after epoch %d: %s was not finite in any of the last %d epoch(s)"
                    % (epochs_done, self.monitor, self.patience))
        value = float(self.best.score.numpy())
        return ("early stopping after epoch %d: %s has not improved by more than %g for %d epoch(s); "
                "best epoch %d (%s %.4f)" % (epochs_done, self.monitor, self.min_delta,
                                             epochs_done - best, best, self.monitor,
                                             -value if self.monitor == "val_loss" else value))

    def restore_best(self):
        """Load the best epoch's weights into the model; return that epoch, or None (early
        stopping off, or no epoch had a finite score: the last weights stay)."""
        best = self.best_epoch
        if not best:
            return None
        for variable, copy in zip(self.model.variables, self.best.copies):
            variable.assign(copy)
        LOG.info("final weights: those of epoch %d, the best by %s", best, self.monitor)
        return best
