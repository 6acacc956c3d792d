"""The serving module exported as a SavedModel: raw features in, probabilities and classes out.

Signature ``serving_default``:

- CSV data: one float32 tensor of shape ``[None]`` per feature, named by the feature (characters
  outside ``[A-Za-z0-9_]`` become ``_``; the mapping is in ``metadata.json``), stacked in the
  graph in schema order.
- Images: ``image_bytes``, a string tensor ``[None]`` of encoded PNG/JPEG files, decoded,
  converted to the trained channel count and resized (bilinear, antialiased) in the graph.

Outputs: ``probabilities`` float32 ``[None, num_classes]``, ``class_id`` int64 ``[None]``,
``class_name`` string ``[None]``.
"""

import re

from trainer import common

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
        if schema["format"] == "csv":
            self.features = [f["name"] for f in schema["features"]]
            self.inputs = signature_names(self.features)
            spec = {n: tf.TensorSpec([None], tf.float32, name=n) for n in self.inputs}
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

    def _serve_features(self, features):
        x = tf.stack([features[name] for name in self.inputs], axis=1)
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
        x = np.asarray(x)
        if self.features:
            return {name: tf.constant(x[:, i], tf.float32) for i, name in enumerate(self.inputs)}
        return {IMAGE_INPUT: tf.stack([tf.io.encode_png(tf.constant(img)) for img in x])}

    def describe(self):
        """The signature for metadata.json: inputs, outputs and the feature-name mapping."""
        if self.features:
            inputs = {n: {"dtype": "float32", "shape": [None], "feature": f}
                      for n, f in zip(self.inputs, self.features)}
        else:
            inputs = {IMAGE_INPUT: {"dtype": "string", "shape": [None],
                                    "content": "encoded PNG or JPEG",
                                    "resized_to": self.image_shape}}
        return {"name": "serving_default", "inputs": inputs, "outputs": {
            "probabilities": {"dtype": "float32", "shape": [None, len(self.class_names)]},
            "class_id": {"dtype": "int64", "shape": [None]},
            "class_name": {"dtype": "string", "shape": [None]}},
            "class_names": self.class_names}
