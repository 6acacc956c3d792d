"""The serving module exported as a SavedModel: raw features in, probabilities and classes out.

Signature ``serving_default``:

- CSV data: one tensor of shape ``[None]`` per feature, named by the feature (characters
  outside ``[A-Za-z0-9_]`` become ``_``; the mapping is in ``metadata.json``): float32 for a
  numeric column (NaN: missing), string for a boolean one (true/false/yes/no, any case; anything
  else, ``""`` included, is missing) and for a categorical one (the raw text, stripped in the
  graph; ``""`` or a ``data.na_values`` text: missing; a value outside the vocabulary: the
  out-of-vocabulary bucket). They are stacked in the graph in schema order.
- Images: ``image_bytes``, a string tensor ``[None]`` of encoded PNG/JPEG files, decoded,
  converted to the trained channel count and resized (bilinear, antialiased) in the graph.

Outputs: ``probabilities`` float32 ``[None, num_classes]``, ``class_id`` int64 ``[None]``,
``class_name`` string ``[None]``.
"""

import re

from trainer import columns, common, contract

common.quiet_tensorflow()
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

IMAGE_INPUT = "image_bytes"


def signature_names(feature_names):
    """Map feature names to valid, unique signature input names (``[A-Za-z_][A-Za-z0-9_]*``)."""
    names, used = [], set()
    for feature in feature_names:
        name = re.sub(r"[^A-Za-z0-9_]", "_", feature)
        if not re.match(r"[A-Za-z_]", name):
            name = "f_" + name
        base, n = name, 1
        while name in used:
            n += 1
            name = "%s_%d" % (base, n)
        used.add(name)
        names.append(name)
    return names


class ServingModule(tf.Module):
    """A tf.Module wrapping the trained Keras model with the raw-input serving function."""

    def __init__(self, model, schema):
        super(ServingModule, self).__init__(name="tfpipe_serving")
        self.model = model
        self.class_names = list(schema["class_names"])
        self._names_table = tf.constant(self.class_names)
        if schema["format"] in contract.TABULAR_FORMATS:
            self.features = [f["name"] for f in schema["features"]]
            self.types = [f.get("type", "float") for f in schema["features"]]
            self.inputs = signature_names(self.features)
            self.texts = any(t == "categorical" for t in self.types)
            self._na = tf.constant(sorted(set(schema.get("na_values") or [""]) | {""}))
            self._booleans = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
                tf.constant(sorted(columns.BOOLEAN_VALUES)),
                tf.constant([columns.BOOLEAN_VALUES[k] for k in sorted(columns.BOOLEAN_VALUES)], tf.float32)),
                default_value=float("nan"))
            spec = {n: tf.TensorSpec([None], tf.float32 if t not in ("boolean", "categorical") else tf.string,
                                     name=n) for n, t in zip(self.inputs, self.types)}
            self.serve = tf.function(self._serve_features, input_signature=[spec])
        else:
            image = schema["image"]
            self.image_shape = [image["height"], image["width"], image["channels"]]
            self.features, self.inputs = [], [IMAGE_INPUT]
            spec = tf.TensorSpec([None], tf.string, name=IMAGE_INPUT)
            self.serve = tf.function(self._serve_images, input_signature=[spec])

    def _outputs(self, logits):
        probabilities = tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
        class_id = tf.argmax(probabilities, axis=-1, output_type=tf.int64)
        return {"probabilities": probabilities, "class_id": class_id,
                "class_name": tf.gather(self._names_table, class_id)}

    def _text(self, values):
        """Stripped texts; a ``data.na_values`` text becomes ``""`` (missing), as prep reads it."""
        values = tf.strings.strip(values)
        missing = tf.reduce_any(tf.equal(values[:, None], self._na[None, :]), axis=1)
        return tf.where(missing, tf.zeros_like(values), values)

    def _serve_features(self, features):
        numbers, texts = [], []
        for name, kind in zip(self.inputs, self.types):
            if kind == "categorical":
                texts.append(self._text(features[name]))
            elif kind == "boolean":
                numbers.append(self._booleans.lookup(tf.strings.lower(tf.strings.strip(features[name]))))
            else:
                numbers.append(features[name])
        batch = tf.shape(features[self.inputs[0]])[0]
        x = tf.stack(numbers, axis=1) if numbers else tf.zeros([batch, 0], tf.float32)
        if self.texts:
            x = {"features": x, "categories": tf.stack(texts, axis=1)}
        return self._outputs(self.model(x, training=False))

    def _decode(self, encoded):
        height, width, channels = self.image_shape
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        image.set_shape([None, None, channels])
        image = tf.image.resize(image, [height, width], method="bilinear", antialias=True)
        return tf.cast(tf.clip_by_value(tf.round(image), 0.0, 255.0), tf.uint8)

    def _serve_images(self, image_bytes):
        spec = tf.TensorSpec(self.image_shape, tf.uint8)
        pixels = tf.map_fn(self._decode, image_bytes, fn_output_signature=spec)
        return self._outputs(self.model(pixels, training=False))

    def raw_inputs(self, x):
        """The signature's raw form of a batch of model inputs (eval examples) as kwargs."""
        if self.features:
            return dict(zip(self.inputs, raw_values(self.types, x)))
        return {IMAGE_INPUT: encoded_images(x)}

    def describe(self):
        """The signature for metadata.json: inputs, outputs and the feature-name mapping."""
        if self.features:
            inputs = {n: {"dtype": "string" if t in ("boolean", "categorical") else "float32", "shape": [None],
                          "feature": f, "type": t, "missing": "" if t in ("boolean", "categorical") else "NaN"}
                      for n, f, t in zip(self.inputs, self.features, self.types)}
        else:
            inputs = {IMAGE_INPUT: {"dtype": "string", "shape": [None],
                                    "content": "encoded PNG or JPEG",
                                    "resized_to": self.image_shape}}
        return {"name": "serving_default", "inputs": inputs, "outputs": {
            "probabilities": {"dtype": "float32", "shape": [None, len(self.class_names)]},
            "class_id": {"dtype": "int64", "shape": [None]},
            "class_name": {"dtype": "string", "shape": [None]}},
            "class_names": self.class_names}


def raw_values(types, x):
    """A batch of table examples ``x`` (records as :mod:`trainer.data` parses them) turned back into
    the raw features a serving signature takes: one tensor per feature of ``types`` (the schema's
    feature types, in schema order), float32 for a numeric column, ``"true"``/``"false"``/``""``
    for a boolean one, the text (``""``: missing) for a categorical one."""
    if isinstance(x, dict):
        numbers, texts = np.asarray(x["features"]), np.asarray(x["categories"])
    else:
        numbers, texts = np.asarray(x), None
    raw, n, t = [], 0, 0
    for kind in types:
        if kind == "categorical":
            raw.append(tf.constant(texts[:, t]))
            t += 1
            continue
        column, n = numbers[:, n], n + 1
        if kind == "boolean":
            raw.append(tf.constant(["" if v != v else "true" if v else "false" for v in column], tf.string))
        else:
            raw.append(tf.constant(column, tf.float32))
    return raw


def encoded_images(x):
    """A batch of raw uint8 images as the PNG files the image signature takes."""
    return tf.stack([tf.io.encode_png(tf.constant(img)) for img in np.asarray(x)])
