"""The production model (the blessing gate's baseline version) scored on this run's eval split.

The version's SavedModel is loaded and its ``serving_default`` signature is fed this run's eval
records turned back into raw features (:func:`trainer.serving.raw_values`), matched by feature
name, as a serving client calls it. That works whatever model builder, config or vocabulary made
the version: rebuilding it from its recorded hyperparameters and tonight's schema would depend on
tonight's code and vocabularies rebuilding the very same variables.

A version that cannot read tonight's data raises :class:`CannotScore` with the reason: a column
of its signature missing from tonight's schema or of another kind (number, yes/no, text), a table
model on images (or the reverse), a metadata.json without a signature, a SavedModel that does
not load or whose signature fails or returns other shapes. The gate then falls back to the score
recorded in the version's metadata.json.
"""

from trainer import common, contract, serving

common.quiet_tensorflow()
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

#: What a feature type reads as: a production input fits a column of tonight's data of the same kind
#: (an int column that became float is still a number to a float32 input).
_KIND = {"float": "a number", "int": "a number", "boolean": "yes/no", "categorical": "text"}


class CannotScore(Exception):
    """The production model cannot score this run's data; ``str(error)`` says why."""


def feed_plan(signature, schema):
    """``[(signature input, index of tonight's feature)]`` for a table data set, or
    ``[(image input, None)]`` for images; raise :class:`CannotScore` naming what does not fit."""
    inputs = (signature or {}).get("inputs")
    if not isinstance(inputs, dict) or not inputs:
        raise CannotScore("its metadata.json describes no serving signature")
    tonight_images = schema["format"] not in contract.TABULAR_FORMATS
    if serving.IMAGE_INPUT in inputs:
        if not tonight_images:
            raise CannotScore("it takes images, this run's data is a table")
        return [(serving.IMAGE_INPUT, None)]
    if tonight_images:
        raise CannotScore("it takes table columns, this run's data is images")
    columns = {f["name"]: (i, f.get("type", "float")) for i, f in enumerate(schema.get("features") or ())}
    plan, missing = [], []
    for name, spec in sorted(inputs.items()):
        feature, kind = spec.get("feature", name), spec.get("type", "float")
        if feature not in columns:
            missing.append(feature)
            continue
        index, tonight = columns[feature]
        if _KIND.get(kind) != _KIND.get(tonight):
            raise CannotScore("its column %r was %s (%s), tonight it is %s (%s)"
                              % (feature, _KIND.get(kind, kind), kind, _KIND.get(tonight, tonight), tonight))
        plan.append((name, index))
    if missing:
        raise CannotScore("its column(s) %s are not in this run's data" % ", ".join(map(repr, missing)))
    return plan


class Production(object):
    """A version's serving signature, fed this run's eval batches: :meth:`probabilities`."""

    def __init__(self, model_dir, metadata, schema):
        self.plan = feed_plan(metadata.get("signature"), schema)
        self.types = [f.get("type", "float") for f in schema.get("features") or ()]
        self.num_classes = len(schema["class_names"])
        try:
            self._loaded = tf.saved_model.load(model_dir)
            self._serve = self._loaded.signatures["serving_default"]
        except Exception as error:  # noqa: BLE001 -- any load error means: fall back to the recorded score
            raise CannotScore("its SavedModel in %s does not load (%s: %s)"
                              % (model_dir, type(error).__name__, _first_line(error)))
        wanted = set(self._serve.structured_input_signature[1])
        absent = sorted(set(name for name, _ in self.plan) - wanted)
        if absent:
            raise CannotScore("its SavedModel's signature has no input(s) %s that its metadata.json names"
                              % ", ".join(absent))

    def probabilities(self, x):
        """Class probabilities ``[examples, classes]`` (numpy) of one batch of eval examples."""
        if self.plan[0][1] is None:
            feed = {self.plan[0][0]: serving.encoded_images(x)}
        else:
            raw = serving.raw_values(self.types, x)
            feed = {name: raw[index] for name, index in self.plan}
        try:
            got = self._serve(**feed)["probabilities"].numpy()
        except Exception as error:  # noqa: BLE001 -- whatever the signature raises, the fallback applies
            raise CannotScore("its serving signature failed on this run's eval rows (%s: %s)"
                              % (type(error).__name__, _first_line(error)))
        if got.ndim != 2 or got.shape[1] != self.num_classes:
            raise CannotScore("its serving signature returned probabilities of shape %s for %d classes"
                              % (list(got.shape), self.num_classes))
        return got


def _first_line(error):
    return (str(error).strip().splitlines() or [""])[0][:300]


def as_logits(probabilities):
    """Logits whose softmax is ``probabilities``, for the metrics that take logits (the loss among them).

    A probability of exactly 0 (float32 underflow) becomes 1e-30, so the loss stays finite.
    """
    return np.log(np.maximum(np.asarray(probabilities, dtype=np.float64), 1e-30))
