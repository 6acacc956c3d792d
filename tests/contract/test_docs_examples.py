"""The docs' example DAG files (docs/examples/*.py, included into the pages as printed) parse in
Airflow's DagBag and make the DAGs their text says, with the settings the pages describe."""

from __future__ import annotations

import pytest

from tests.conftest import REPO

EXAMPLES = REPO / "docs" / "examples"

#: Each example file and the one DAG it makes.
DAG_IDS = {
    "alerts.py": "digits_with_alerts",
    "churn_model.py": "churn_model",
    "churn_table.py": "churn_table",
    "custom_model.py": "churn_wide",
    "data_gate.py": "orders_nightly",
    "gcs.py": "churn_from_gcs",
    "gpus.py": "images_on_gpus",
    "scheduling.py": "churn_nightly",
    "sharded.py": "clicks_sharded",
    "training_options.py": "churn_tuned",
}


@pytest.fixture(scope="module")
def dags():
    from tfpipe.compat import DagBag

    bag = DagBag(dag_folder=str(EXAMPLES))
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags


def test_every_example_file_is_listed_and_makes_its_dag(dags):
    """No example file goes unchecked, and each makes exactly the DAG named here."""
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(DAG_IDS)
    assert sorted(dags) == sorted(DAG_IDS.values())
    for name, dag_id in DAG_IDS.items():
        assert dags[dag_id].fileloc == str(EXAMPLES / name)


def _config(dag, task="train") -> dict:
    return dag.get_task(task).spec.config


def test_alerts_reach_every_task_and_the_dag(dags):
    """docs: monitoring: ``default_args`` reach every task the pipeline makes; the DAG gets its own callback."""
    dag = dags["digits_with_alerts"]
    assert dag.on_failure_callback
    for task in dag.tasks:
        assert task.owner == "ml-platform" and task.on_failure_callback, task.task_id


def test_training_options_reach_the_train_stage(dags):
    """docs: your pipeline: early stopping, the cosine schedule with warm-up, the clip, balanced
    class weights, the declared classes and the auc gate are what the stages get."""
    dag = dags["churn_tuned"]
    training = _config(dag)["training"]
    assert {k: training[k] for k in ("epochs", "early_stopping_patience", "early_stopping_monitor",
                                     "learning_rate_schedule", "learning_rate_warmup_epochs",
                                     "gradient_clip_norm", "class_weight")} == {
        "epochs": 200, "early_stopping_patience": 5, "early_stopping_monitor": "val_loss",
        "learning_rate_schedule": "cosine", "learning_rate_warmup_epochs": 2,
        "gradient_clip_norm": 1.0, "class_weight": "balanced"}
    assert list(_config(dag, "prep")["data"]["classes"]) == ["stayed", "churned"]
    assert _config(dag, "evaluate")["evaluation"]["metric"] == "auc"


def test_custom_model_names_its_builder_and_code_path(dags):
    """docs: your pipeline: a model of your own is ``package.module:function`` on ``code_path``."""
    training = _config(dags["churn_wide"])["training"]
    assert training["model"] == "churn_models.wide:build"
    assert training["code_path"] == "code" and dict(training["model_kwargs"]) == {"units": 256}


def test_gpus_example_asks_for_two_gpus_with_cpu_fallback_in_the_gpu_pool(dags):
    """docs: GPUs: a count of 2 on train and evaluate only, ``gpu_fallback="cpu"``, train in pool ``gpu``."""
    dag = dags["images_on_gpus"]
    train = dag.get_task("train")
    assert train.spec.gpus.count == 2 and train.spec.gpu_fallback == "cpu"
    assert dag.get_task("evaluate").spec.gpus.count == 2
    assert dag.get_task("prep").spec.gpus is None and dag.get_task("export").spec.gpus is None
    assert train.pool == "gpu"


def test_scheduling_example_runs_on_cron_or_data_and_warm_starts(dags):
    """docs: scheduling: a cron schedule and a data Asset together, export emits the model Asset,
    training warm-starts."""
    from tfpipe import compat

    dag = dags["churn_nightly"]
    # as the scheduler reads it back: both triggers, not either one
    timetable = compat.DagSerialization.from_dict(compat.DagSerialization.to_dict(dag)).timetable
    assert timetable.summary == "Asset or 0 3 * * *"
    assert "s3://raw/churn" in repr(timetable.asset_condition)
    assert {a.uri for a in dag.get_task("export").outlets} == {"tfpipe://models/churn"}
    assert _config(dag)["training"]["warm_start"] is True


def test_gcs_example_has_stage_in_and_publish(dags):
    """docs: Cloud Storage: ``data_uri`` adds ``stage_in`` before prep, ``publish_uri`` adds ``publish``."""
    dag = dags["churn_from_gcs"]
    assert {"stage_in", "publish"} <= set(dag.task_ids)
    assert "stage_in" in dag.get_task("prep").upstream_task_ids
    assert "export" in dag.get_task("publish").upstream_task_ids


def test_sharded_example_maps_prep_over_four_shards(dags):
    """docs: data at scale: ``data.shards: 4`` replaces ``prep`` with ``prep_shard`` (mapped) and ``prep_merge``."""
    dag = dags["clicks_sharded"]
    assert {"prep_shard", "prep_merge"} <= set(dag.task_ids) and "prep" not in dag.task_ids
    assert "prep_merge" in dag.get_task("validate").upstream_task_ids
    assert "validate" in dag.get_task("train").upstream_task_ids


def test_churn_table_example_types_its_columns_and_missing_values_for_prep(dags):
    """docs: your data: the column types, NA texts, dropped label-less rows and vocabulary settings
    of ``data`` reach the prep stage as written."""
    data = _config(dags["churn_table"], "prep")["data"]
    assert dict(data["columns"]) == {"customer_id": "ignore", "zip": "categorical", "autopay": "boolean"}
    assert list(data["na_values"]) == ["", "NA", "n/a"] and data["drop_missing_labels"] is True
    assert (data["max_vocabulary"], data["min_frequency"], data["hash_threshold"], data["hash_bins"]) == (
        500, 5, 20000, 4096)


def test_data_gate_example_sets_thresholds_and_per_column_overrides_for_validate(dags):
    """docs: the data gate: the example's ``validation`` section (fail on an anomaly, tighter missing and
    row bounds, a looser column and a skipped one) reaches the validate stage as written, and validate
    runs between prep and train."""
    dag = dags["orders_nightly"]
    assert dag.get_task("validate").upstream_task_ids == {"prep"}
    assert dag.get_task("train").upstream_task_ids == {"validate"}
    gate = _config(dag, "validate")["validation"]
    assert (gate["on_anomaly"], gate["numeric_drift"], gate["categorical_drift"], gate["missing_increase"]) == (
        "fail", 0.1, 0.1, 0.05)
    assert (gate["min_row_ratio"], gate["max_row_ratio"]) == (0.8, 1.5)
    assert dict(gate["columns"]) == {"discount": {"numeric_drift": 0.3}, "note": {"skip": True}}
