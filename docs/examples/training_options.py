"""Airflow DAG: a churn model with the training options for long runs and imbalanced classes."""
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

dag = training_pipeline(PipelineConfig(
    dag_id="churn_tuned",
    image={"ref": None},
    volumes={"data": "/srv/ml/raw", "work": "/srv/ml/work", "models": "/srv/ml/models"},
    # --8<-- [start:classes]
    data={"path": "churn/", "label": "churned", "classes": ["stayed", "churned"]},
    # --8<-- [end:classes]
    # --8<-- [start:training]
    training={"model": "mlp", "model_kwargs": {"hidden_units": [128, 64], "dropout": 0.2, "l2": 0.0001},
              "epochs": 200, "batch_size": 256,
              "early_stopping_patience": 5,           # 0 (the default): off
              "early_stopping_monitor": "val_loss",   # or val_accuracy
              "early_stopping_min_delta": 0.0005,
              "learning_rate": 0.01, "learning_rate_schedule": "cosine",  # or constant (the default)
              "learning_rate_warmup_epochs": 2,       # 0 (the default): no warm-up
              "gradient_clip_norm": 1.0,              # 0 (the default): off
              "class_weight": "balanced"},            # none (the default) or balanced
    evaluation={"metric": "auc", "threshold": 0.8},   # or accuracy, macro_precision, macro_recall, macro_f1
    # --8<-- [end:training]
    export={"model_name": "churn"},
))
