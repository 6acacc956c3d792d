"""The model registry: built-in models by name, or a user's function.

Built-ins (``training.model``), with their ``training.model_kwargs``:

- ``mlp`` (CSV data): ``hidden_units=[64, 32]``, ``dropout=0.0``, ``l2=0.0``, ``one_hot_max=16``,
  ``embedding_dim=8``. A ``Normalization`` layer initialised from the train split's mean/variance in
  ``stats.json`` sits inside the model, so the model takes raw feature values; a missing number
  (NaN) becomes the train mean there, and each numeric column with missing train values adds a
  missing-indicator input (1.0 where missing). A categorical column is looked up in its
  vocabulary (``StringLookup``: unseen values share one bucket, the missing value has its own)
  or hashed (``Hashing``, the missing value in bucket 0), then one-hot encoded when it has at most
  ``one_hot_max`` positions, else embedded in ``embedding_dim`` dimensions.
- ``cnn`` (images): ``filters=[16, 32]``, ``dense_units=64``, ``dropout=0.0``, ``l2=0.0``;
  ``Rescaling(1/255)`` inside the model.
- ``resnet50`` (images at least 32x32): ``tf.keras.applications.ResNet50(weights=None)`` behind a
  ``Rescaling`` to [-1, 1].

``l2`` adds ``l2 * sum(kernel ** 2)`` of every kernel to the training loss (weight decay; the
train loop adds the model's losses to the global batch's mean).

A user's model: ``training.model = "package.module:function"``, importable from
``training.code_path`` (a directory added to ``sys.path``; a relative path is taken relative to
``paths.data``). The interface is::

    def function(input_spec: dict, num_classes: int, stats: dict, **model_kwargs) -> tf.keras.Model

``input_spec`` is :func:`trainer.data.input_spec`: ``{"kind": "tabular"|"image", "shape": [...],
"dtype": "float32"|"uint8", "feature_names": [...], "class_names": [...]}``, for tables also
``categorical_names`` and ``columns`` (each feature's type, missing counts, vocabulary or hash
buckets, from ``schema.json``). The model takes the RAW inputs (float32 feature vectors in schema
order, NaN where missing, or uint8 pixels ``[H, W, C]``; with categorical columns a dict of
``features`` and ``categories``, string ``[len(categorical_names)]``, ``""`` where missing) and
must return LOGITS of shape ``[batch, num_classes]`` (no softmax). ``stats`` is ``stats.json``
(per feature or per channel count/mean/std/min/max, and per table column ``missing``). Under
mixed precision a float16 output is cast to float32 by an extra layer.
"""

import importlib
import inspect
import os
import sys

from trainer import common
from trainer.errors import BadInput

common.quiet_tensorflow()
import tensorflow as tf  # noqa: E402

layers = tf.keras.layers


def _l2(l2):
    """An L2 penalty ``l2 * sum(w ** 2)`` of a layer's kernel (weight decay), or None for 0."""
    return tf.keras.regularizers.l2(float(l2)) if l2 else None


class ImputingNormalization(layers.Normalization):
    """``Normalization`` that first replaces a missing value (NaN) by its column's mean, so it
    comes out as 0. A subclass rather than a layer of its own: the model keeps the layers and
    weights it had before missing values were read, so older weights still load into it."""

    def call(self, inputs):
        inputs = tf.convert_to_tensor(inputs)
        return super(ImputingNormalization, self).call(
            tf.where(tf.math.is_nan(inputs), tf.cast(self.mean, inputs.dtype), inputs))


class MissingIndicator(layers.Layer):
    """1.0 where the columns ``columns`` of a float matrix are missing (NaN), else 0.0."""

    def __init__(self, columns, **kwargs):
        super(MissingIndicator, self).__init__(**kwargs)
        self.columns = [int(c) for c in columns]

    def call(self, inputs):
        return tf.cast(tf.math.is_nan(tf.gather(inputs, self.columns, axis=-1)), self.compute_dtype)

    def get_config(self):
        return dict(super(MissingIndicator, self).get_config(), columns=self.columns)


class TextColumn(layers.Layer):
    """Column ``index`` of a string matrix, as ``[batch, 1]``."""

    def __init__(self, index, **kwargs):
        super(TextColumn, self).__init__(**kwargs)
        self.index = int(index)

    def call(self, inputs):
        return inputs[:, self.index:self.index + 1]

    def get_config(self):
        return dict(super(TextColumn, self).get_config(), index=self.index)


def encode_categorical(texts, position, column, one_hot_max, embedding_dim):
    """The float encoding ``[batch, n]`` of categorical column ``column`` (a schema entry), the
    ``position``-th of the string matrix ``texts``; see the module docstring."""
    x = TextColumn(position, name="text_%d" % position)(texts)
    if column.get("encoding") == "hash":
        depth = int(column["hash_bins"]) + 1
        x = layers.Hashing(num_bins=depth, mask_value="", name="hash_%d" % position)(x)
    else:
        # index 0 (num_oov_indices=1) takes unseen values, the "" entry (index 1) missing ones
        vocabulary = [""] + list(column.get("vocabulary") or [])
        depth = len(vocabulary) + 1
        x = layers.StringLookup(vocabulary=vocabulary, num_oov_indices=1, name="lookup_%d" % position)(x)
    if depth <= one_hot_max:
        return layers.CategoryEncoding(num_tokens=depth, output_mode="one_hot", name="one_hot_%d" % position)(x)
    x = layers.Embedding(depth, int(embedding_dim), name="embed_%d" % position)(x)
    return layers.Flatten(name="flat_%d" % position)(x)


def mlp(input_spec, num_classes, stats, hidden_units=(64, 32), dropout=0.0, l2=0.0, one_hot_max=16,
        embedding_dim=8):
    """A multi-layer perceptron over normalised tabular features and encoded categorical ones
    (``l2``: the kernels' penalty)."""
    if input_spec["kind"] != "tabular":
        raise BadInput("training.model mlp needs a table (data.format csv or parquet); use cnn or resnet50 "
                       "for images")
    names = input_spec["feature_names"]
    columns = {c["name"]: c for c in input_spec.get("columns") or []}
    categorical = input_spec.get("categorical_names") or []
    mean = [stats["features"][n]["mean"] for n in names]
    variance = [stats["features"][n]["std"] ** 2 or 1.0 for n in names]
    inputs = tf.keras.Input(shape=input_spec["shape"], dtype="float32", name="features")
    parts = []
    if names:
        parts.append(ImputingNormalization(axis=-1, mean=mean, variance=variance, name="normalize")(inputs))
        missing = [i for i, n in enumerate(names) if (columns.get(n, {}).get("missing") or {}).get("train")]
        if missing:
            parts.append(MissingIndicator(missing, name="missing")(inputs))
    if categorical:
        texts = tf.keras.Input(shape=[len(categorical)], dtype="string", name="categories")
        parts += [encode_categorical(texts, i, columns[n], one_hot_max, embedding_dim)
                  for i, n in enumerate(categorical)]
        inputs = {"features": inputs, "categories": texts}
    x = parts[0] if len(parts) == 1 else layers.Concatenate(name="inputs")(parts)
    for i, units in enumerate(hidden_units):
        x = layers.Dense(int(units), activation="relu", name="dense_%d" % i,
                         kernel_regularizer=_l2(l2))(x)
        if dropout:
            x = layers.Dropout(float(dropout), name="dropout_%d" % i)(x)
    logits = layers.Dense(num_classes, name="logits", dtype="float32", kernel_regularizer=_l2(l2))(x)
    return tf.keras.Model(inputs, logits, name="mlp")


def _image_input(input_spec, model):
    if input_spec["kind"] != "image":
        raise BadInput("training.model %s needs image data (data.format images); use mlp for "
                       "CSV data" % model)
    return tf.keras.Input(shape=input_spec["shape"], dtype="uint8", name="image")


def cnn(input_spec, num_classes, stats, filters=(16, 32), dense_units=64, dropout=0.0, l2=0.0):
    """A small convolutional network for images (``l2``: the kernels' penalty)."""
    inputs = _image_input(input_spec, "cnn")
    x = layers.Rescaling(1.0 / 255, name="rescale")(inputs)
    for i, count in enumerate(filters):
        x = layers.Conv2D(int(count), 3, padding="same", activation="relu", name="conv_%d" % i,
                          kernel_regularizer=_l2(l2))(x)
        if x.shape[1] >= 2 and x.shape[2] >= 2:
            x = layers.MaxPooling2D(name="pool_%d" % i)(x)
    x = layers.Flatten(name="flatten")(x)
    x = layers.Dense(int(dense_units), activation="relu", name="dense", kernel_regularizer=_l2(l2))(x)
    if dropout:
        x = layers.Dropout(float(dropout), name="dropout")(x)
    logits = layers.Dense(num_classes, name="logits", dtype="float32", kernel_regularizer=_l2(l2))(x)
    return tf.keras.Model(inputs, logits, name="cnn")


def resnet50(input_spec, num_classes, stats):
    """ResNet-50 from random initialisation (no downloaded weights)."""
    inputs = _image_input(input_spec, "resnet50")
    height, width, channels = input_spec["shape"]
    if height < 32 or width < 32:
        raise BadInput("training.model resnet50 needs data.image_size of at least [32, 32], got "
                       "[%d, %d]" % (height, width))
    x = layers.Rescaling(1.0 / 127.5, offset=-1.0, name="rescale")(inputs)
    backbone = tf.keras.applications.ResNet50(weights=None, input_shape=(height, width, channels),
                                              classes=num_classes, classifier_activation=None)
    return tf.keras.Model(inputs, backbone(x), name="resnet50")


BUILTINS = {"mlp": mlp, "cnn": cnn, "resnet50": resnet50}


def _user_function(name, code_path, data_root):
    module_name, _, func_name = name.partition(":")
    if not module_name or not func_name:
        raise BadInput("training.model %r: expected a built-in name (%s) or 'package.module:"
                       "function'" % (name, ", ".join(sorted(BUILTINS))))
    if code_path:
        path = os.path.join(data_root, code_path)
        if not os.path.isdir(path):
            raise BadInput("training.code_path %r is not a directory (looked for %s)"
                           % (code_path, path))
        if path not in sys.path:
            sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, SyntaxError, or anything the import raises
        raise BadInput("training.model %r: cannot import module %r (training.code_path %r): "
                       "%s: %s" % (name, module_name, code_path, type(error).__name__, error))
    function = getattr(module, func_name, None)
    if not callable(function):
        raise BadInput("training.model %r: module %r has no function %r"
                       % (name, module_name, func_name))
    return function


def _as_float32(model, name):
    """Append a float32 cast when the model's output is not float32 (mixed precision)."""
    output = getattr(model, "outputs", None)
    if output and len(output) == 1 and output[0].dtype != tf.float32:
        cast = layers.Activation("linear", dtype="float32", name="float32_logits")(output[0])
        # model.input keeps a dict of inputs a dict (the tables with text columns)
        return tf.keras.Model(model.inputs if len(model.inputs) == 1 else model.input, cast, name=model.name)
    if not output:
        raise BadInput("training.model %r must return a functional tf.keras.Model with one "
                       "output (built with tf.keras.Input)" % name)
    return model


def build_model(config, schema, stats):
    """Build the model named by ``training.model`` for this data set; returns a Keras model
    whose output is float32 logits ``[batch, num_classes]``."""
    from trainer.data import input_spec as make_spec

    training = config["training"]
    name = training["model"]
    if name in BUILTINS:
        function = BUILTINS[name]
    elif ":" in name:
        function = _user_function(name, training["code_path"], config["paths"]["data"])
    else:
        raise BadInput("training.model %r is unknown: valid names are %s, or "
                       "'package.module:function' with training.code_path"
                       % (name, ", ".join(sorted(BUILTINS))))
    spec = make_spec(schema)
    num_classes = schema["num_classes"]
    kwargs = training["model_kwargs"]
    try:
        inspect.signature(function).bind(spec, num_classes, stats, **kwargs)
    except TypeError as error:
        raise BadInput("training.model_kwargs %s do not fit model %r: %s"
                       % (sorted(kwargs), name, error))
    model = function(spec, num_classes, stats, **kwargs)
    if not isinstance(model, tf.keras.Model):
        raise BadInput("training.model %r returned %s, expected a tf.keras.Model"
                       % (name, type(model).__name__))
    model = _as_float32(model, name)
    shape = model.outputs[0].shape
    if shape.rank != 2 or shape[-1] != num_classes:
        raise BadInput("training.model %r outputs shape %s, expected [batch, %d] logits"
                       % (name, shape, num_classes))
    return model
