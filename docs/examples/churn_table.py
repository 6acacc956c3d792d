"""Airflow DAG: a churn model on a real table: text, yes/no and numeric columns with empty cells."""
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

dag = training_pipeline(PipelineConfig(
    dag_id="churn_table",
    image={"ref": None},
    volumes={"data": "/srv/ml/raw", "work": "/srv/ml/work", "models": "/srv/ml/models"},
    # --8<-- [start:data]
    data={"path": "churn/", "label": "churned",
          "columns": {"customer_id": "ignore",       # an id: not a feature
                      "zip": "categorical",          # digits, but a place, not a quantity
                      "autopay": "boolean"},         # yes/no (inferred anyway; declared, a typo fails prep)
          "na_values": ["", "NA", "n/a"],            # cell texts that mean "missing"
          "drop_missing_labels": True,               # leave out (and count) rows without a label
          "max_vocabulary": 500, "min_frequency": 5,  # per text column: the 500 most frequent, 5+ times each
          "hash_threshold": 20000, "hash_bins": 4096},  # above 20,000 distinct values: hashed
    # --8<-- [end:data]
    training={"model": "mlp", "epochs": 30, "batch_size": 256},
    export={"model_name": "churn"},
))
