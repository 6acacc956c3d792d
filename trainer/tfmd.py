"""The data gate's findings in TensorFlow Data Validation's formats: ``schema.pbtxt``, ``anomalies.pbtxt``.

TFDV, TFX's ``ExampleValidator`` and the tools around them read a ``Schema`` and an ``Anomalies``
proto of ``tensorflow_metadata`` (the 1.9 release of the TF 2.9 line), as text. The validate stage
writes both into ``<run_dir>/validation/``:

* ``schema.pbtxt``: tonight's features (type; a boolean's ``bool_domain``; a vocabulary's
  ``string_domain``), the label with its classes, and the gate's thresholds as TFDV's drift
  comparators (``jensen_shannon_divergence`` for numbers, ``infinity_norm`` for texts and the label;
  a column the validation section skips has none) and ``dataset_constraints``' row-count ratios;
* ``anomalies.pbtxt``: that schema as ``baseline`` and one ``AnomalyInfo`` per anomalous column
  (row count and format under ``dataset_anomaly_info``), each reason typed as TFDV types it.

The gate's measures are its own (see :mod:`trainer.validate`): the figures are comparable with
TFDV's, not equal to them (TFDV bins numbers its own way).
"""

import os

from trainer import atomic

#: The folder of the run directory that holds the two files.
SUBDIR = "validation"
SCHEMA_FILE, ANOMALIES_FILE = "schema.pbtxt", "anomalies.pbtxt"


def schema_proto(schema, settings):
    """A ``tensorflow_metadata`` ``Schema`` of tonight's data set, with the gate's thresholds."""
    from tensorflow_metadata.proto.v0 import schema_pb2

    proto = schema_pb2.Schema()
    overrides = settings.get("columns") or {}
    for feature in schema.get("features") or []:
        name, kind = feature["name"], feature.get("type", "float")
        own = overrides.get(name) or {}
        out = proto.feature.add(name=name)
        if kind == "categorical":
            out.type = schema_pb2.BYTES
            if feature.get("encoding") == "vocabulary":
                out.domain = name
                proto.string_domain.add(name=name, value=feature.get("vocabulary") or [])
            if not own.get("skip"):
                out.drift_comparator.infinity_norm.threshold = own.get("categorical_drift",
                                                                       settings["categorical_drift"])
        else:
            out.type = schema_pb2.FLOAT if kind == "float" else schema_pb2.INT
            if kind == "boolean":
                out.bool_domain.SetInParent()
            if not own.get("skip"):
                out.drift_comparator.jensen_shannon_divergence.threshold = own.get("numeric_drift",
                                                                                   settings["numeric_drift"])
    if schema.get("image"):
        proto.feature.add(name="image", type=schema_pb2.BYTES)
    label = proto.feature.add(name=schema.get("label") or "label", type=schema_pb2.BYTES,
                              domain="(label)")
    label.drift_comparator.infinity_norm.threshold = settings["label_drift"]
    proto.string_domain.add(name="(label)", value=schema.get("class_names") or [])
    ratios = proto.dataset_constraints.num_examples_drift_comparator
    ratios.min_fraction_threshold = settings["min_row_ratio"]
    ratios.max_fraction_threshold = settings["max_row_ratio"]
    return proto


def _reason_type(record):
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    info = anomalies_pb2.AnomalyInfo
    if record["check"] == "row_count":
        return info.COMPARATOR_LOW_NUM_EXAMPLES if record["value"] < record["threshold"][0] \
            else info.COMPARATOR_HIGH_NUM_EXAMPLES
    return {"column_missing": info.SCHEMA_MISSING_COLUMN, "column_new": info.SCHEMA_NEW_COLUMN,
            "type_changed": info.UNEXPECTED_DATA_TYPE, "format_changed": info.UNEXPECTED_DATA_TYPE,
            "missing_increase": info.FEATURE_TYPE_LOW_FRACTION_PRESENT,
            "numeric_drift": info.COMPARATOR_JENSEN_SHANNON_DIVERGENCE_HIGH,
            "categorical_drift": info.COMPARATOR_L_INFTY_HIGH,
            "label_drift": info.COMPARATOR_L_INFTY_HIGH}.get(record["check"], info.UNKNOWN_TYPE)


def anomalies_proto(schema, validation, describe):
    """An ``Anomalies`` proto of ``validation``'s anomalies against ``schema`` (the
    :func:`schema_proto`); ``describe(record)`` says one anomaly in words."""
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    proto = anomalies_pb2.Anomalies()
    proto.baseline.CopyFrom(schema)
    proto.anomaly_name_format = anomalies_pb2.Anomalies.SERIALIZED_PATH
    label = next(f.name for f in schema.feature if f.domain == "(label)")
    for record in validation.get("anomalies") or []:
        if record["column"] is None and record["check"] != "label_drift":
            info = proto.dataset_anomaly_info
        else:
            key = label if record["column"] is None else record["column"]
            info = proto.anomaly_info[key]
            if not info.path.step:
                info.path.step.append(key)
        info.severity = anomalies_pb2.AnomalyInfo.ERROR
        info.reason.add(type=_reason_type(record), short_description=record["check"],
                        description=describe(record))
    for info in list(proto.anomaly_info.values()) + ([proto.dataset_anomaly_info]
                                                     if proto.HasField("dataset_anomaly_info") else []):
        # as TFDV writes them: one reason's own texts, or "Multiple errors" and every description
        many = len(info.reason) > 1
        info.short_description = "Multiple errors" if many else info.reason[0].short_description
        info.description = " ".join(r.description for r in info.reason)
    return proto


def write(run_dir, schema, validation, describe):
    """Write ``<run_dir>/validation/schema.pbtxt`` and ``anomalies.pbtxt``; return the folder."""
    from google.protobuf import text_format

    directory = os.path.join(run_dir, SUBDIR)
    schema_pb = schema_proto(schema, validation["settings"])
    atomic.write_text(os.path.join(directory, SCHEMA_FILE), text_format.MessageToString(schema_pb))
    atomic.write_text(os.path.join(directory, ANOMALIES_FILE),
                      text_format.MessageToString(anomalies_proto(schema_pb, validation, describe)))
    return directory
