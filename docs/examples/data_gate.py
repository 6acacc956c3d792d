"""Airflow DAG: nightly retraining behind the data gate, with thresholds tuned for one noisy column."""
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

dag = training_pipeline(PipelineConfig(
    dag_id="orders_nightly",
    image={"ref": None},
    volumes={"data": "/srv/ml/raw", "work": "/srv/ml/work", "models": "/srv/ml/models"},
    data={"path": "orders/", "label": "returned", "key": "order_id"},
    schedule="0 3 * * *",
    # --8<-- [start:validation]
    validation={
        "on_anomaly": "fail",                         # stop the night before training ("warn": report, go on)
        "numeric_drift": 0.1,                         # Jensen-Shannon divergence of a numeric column, 0..1
        "categorical_drift": 0.1,                     # largest change of a text value's share of the rows
        "missing_increase": 0.05,                     # largest rise of a column's share of empty cells
        "min_row_ratio": 0.8, "max_row_ratio": 1.5,   # rows tonight / rows the production model saw
        "columns": {"discount": {"numeric_drift": 0.3},   # a promotion column moves every week
                    "note": {"skip": True}},              # free text: no drift check
    },
    # --8<-- [end:validation]
    training={"model": "mlp", "epochs": 20},
    export={"model_name": "orders"},
))
