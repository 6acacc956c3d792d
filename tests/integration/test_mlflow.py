"""MLflow tracking and registry through Airflow against a real MLflow tracking server (nothing mocked).

The server is the one ``make up`` runs, from its own venv (scripts/ensure-mlflow-server.sh), here with a
SQLite backend store and an artifact root in the test's temp dir, on a loopback port. Three DAG runs of one
pipeline: a blessed one, one whose threshold no candidate reaches, and a blessed one whose connection
names a server that does not answer.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO, free_port, run_dag, stop_group, wait_until_answers, write_dag

pytestmark = pytest.mark.integration

ENSURE_SCRIPT = REPO / "scripts" / "ensure-mlflow-server.sh"
DAG_ID = "mlflow_digits"


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory) -> str:
    """``http://127.0.0.1:PORT`` of a real MLflow tracking server, stopped by its pid at the end."""
    built = subprocess.run([str(ENSURE_SCRIPT)], capture_output=True, text=True, timeout=900)
    if built.returncode:
        pytest.fail(f"{ENSURE_SCRIPT.name} could not build the server venv:\n{built.stderr[-3000:]}")
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log_path = root / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(REPO / ".cache" / "mlflow-server" / "bin" / "mlflow"), "server", "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
             "--artifacts-destination", str(root / "artifacts")],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_answers(f"{url}/health", proc, log_path, seconds=120, what="the MLflow server")
        yield url
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def two_runs(mlflow_server: str, tmp_path_factory, trainer_image: str) -> dict:
    """One blessed run and one not blessed (threshold 1.0) of a one-epoch pipeline, tracked in MLflow."""
    import shutil

    from tests.conftest import DIGITS_CSV

    home = tmp_path_factory.mktemp("home")
    (home / "data" / "digits").mkdir(parents=True)
    shutil.copy(DIGITS_CSV, home / "data" / "digits" / "digits.csv")
    dags = tmp_path_factory.mktemp("dags")
    write_dag(dags, DAG_ID, training={"model": "mlp", "epochs": 1, "batch_size": 32, "learning_rate": 0.01},
              evaluation={"threshold": 0.1, "tolerance": 1.0})
    env = {"AIRFLOW_CONN_MLFLOW_DEFAULT": mlflow_server}
    runs = {}
    for name, conf in (("blessed", {}), ("unblessed", {"threshold": 1.0})):
        summary, log = run_dag(DAG_ID, conf, home=home, image=trainer_image, dags_folder=dags, extra_env=env)
        assert summary["state"] == "success", log[-8000:]
        assert summary["tasks"]["register"]["state"] == "success", log[-8000:]
        runs[name] = (summary, log)
    # the server down: the connection names a loopback port where nothing listens
    down = f"http://127.0.0.1:{free_port()}"
    runs["server_down"] = run_dag(DAG_ID, {}, home=home, image=trainer_image, dags_folder=dags,
                                  extra_env={"AIRFLOW_CONN_MLFLOW_DEFAULT": down})
    return {"url": mlflow_server, "home": home, "down_url": down, **runs}


def _client(url: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=url, registry_uri=url)


def _mlflow_run(client, summary: dict):
    experiment = client.get_experiment_by_name(DAG_ID)
    found = client.search_runs([experiment.experiment_id],
                               filter_string=f"tags.`airflow.run_id` = '{summary['run_id']}'")
    assert len(found) == 1, [r.info.run_id for r in found]
    return found[0]


def test_each_run_is_logged_with_params_epoch_metrics_evaluation_and_report(two_runs):
    """Both runs land in the experiment named after the DAG: the resolved training and evaluation settings
    and the Airflow run id as params, one value per epoch of the training metrics, the evaluation metrics,
    the blessing decision as a tag and the run report as an artifact."""
    client = _client(two_runs["url"])
    for name, blessed, threshold in (("blessed", "true", 0.1), ("unblessed", "false", 1.0)):
        summary, _ = two_runs[name]
        run = _mlflow_run(client, summary)
        assert run.info.status == "FINISHED"
        params = run.data.params
        assert params["airflow_run_id"] == summary["run_id"]
        assert params["training.epochs"] == "1" and params["training.model"] == "mlp"
        assert float(params["evaluation.threshold"]) == threshold
        history = client.get_metric_history(run.info.run_id, "val_accuracy")
        assert [m.step for m in history] == [1]
        assert "loss" in run.data.metrics and "eval_accuracy" in run.data.metrics
        assert run.data.tags["tfpipe.blessed"] == blessed
        assert run.data.tags["airflow.dag_id"] == DAG_ID
        assert "report/report.html" in [a.path for a in client.list_artifacts(run.info.run_id, "report")]


def test_blessed_export_is_registered_with_source_lineage_and_champion_alias(two_runs):
    """The blessed run's export is version 1 of the registered model: its source is the version's
    directory on the engine's host, its tags the run's lineage (data fingerprint, image, dag and run id),
    and the ``champion`` alias points at it."""
    client = _client(two_runs["url"])
    summary, _ = two_runs["blessed"]
    run = _mlflow_run(client, summary)
    versions = client.search_model_versions(f"name = '{DAG_ID}'")
    assert [v.run_id for v in versions] == [run.info.run_id]
    version = versions[0]
    host_dir = summary["model_dir"]
    assert host_dir == f"{two_runs['home']}/models/{DAG_ID}/{version.tags['tfpipe.export_version']}"
    assert version.source == f"docker-host://localhost{host_dir}"
    assert version.tags["tfpipe.host_path"] == host_dir
    assert version.tags["airflow.dag_id"] == DAG_ID and version.tags["airflow.run_id"] == summary["run_id"]
    assert len(version.tags["tfpipe.data_fingerprint"]) >= 16
    assert version.tags["tfpipe.image"] and version.tags["tfpipe.image_id"].startswith("sha256:")
    assert client.get_model_version_by_alias(DAG_ID, "champion").version == version.version


def test_unblessed_run_is_logged_but_not_registered(two_runs):
    """The candidate below the threshold has its MLflow run, and no model version: the champion stays
    on the blessed version."""
    client = _client(two_runs["url"])
    summary, log = two_runs["unblessed"]
    assert summary["tasks"]["export"]["state"] == "skipped"
    run = _mlflow_run(client, summary)
    assert client.search_model_versions(f"run_id = '{run.info.run_id}'") == []
    assert len(client.search_model_versions(f"name = '{DAG_ID}'")) == 1
    assert "not registered: the candidate was not blessed" in log


def test_train_links_to_the_mlflow_run(two_runs):
    """``register`` stores the "MLflow run" link of ``train``: the UI page of the run it logged."""
    import json

    import airflow  # noqa: F401  (the test's Airflow home, as `tfpipe run` used it)
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from tfpipe.compat import xcom_query
    from tfpipe.links import MlflowRunLink

    client = _client(two_runs["url"])
    summary, _ = two_runs["blessed"]
    run = _mlflow_run(client, summary)
    with create_session() as session:
        rows = {(r.task_id, r.key): XComModel.deserialize_value(r)
                for r in session.scalars(xcom_query(session, run_id=summary["run_id"], dag_id=DAG_ID))}
    url = rows[("train", MlflowRunLink().xcom_key)]
    assert url == f"{two_runs['url']}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}", json.dumps(
        {f"{k[0]}:{k[1]}": str(v) for k, v in rows.items()})



def test_with_the_server_down_register_fails_after_its_retries_naming_it_and_the_export_is_intact(two_runs):
    """The tracking server does not answer: ``register`` fails on each of its tries (it is retried), its
    error names the server and says the export is untouched; the blessed export itself succeeded and its
    version is complete on the models volume; nothing new reached the registry."""
    summary, log = two_runs["server_down"]
    assert summary["state"] == "failed", log[-6000:]
    assert summary["tasks"]["export"]["state"] == "success"
    assert summary["tasks"]["register"] == {"state": "failed", "try_number": 3}, summary["tasks"]
    assert f"the MLflow tracking server {two_runs['down_url']}" in log and "does not answer" in log
    assert "the exported model is untouched" in log
    model_dir = two_runs["home"] / "models" / DAG_ID / "2"  # the first run exported 1, the second nothing
    assert (model_dir / "saved_model.pb").is_file() and (model_dir / "metadata.json").is_file()
    client = _client(two_runs["url"])
    assert [v.version for v in client.search_model_versions(f"name = '{DAG_ID}'")] == ["1"]


def test_the_champion_never_moves_back_to_an_older_export(mlflow_server):
    """Two runs register at once, or a late retry registers after a newer run: the ``champion`` alias stays on
    the version of the newest export (its ``tfpipe.export_version``), against the real server."""
    import logging

    from tfpipe.mlflow import register_version

    client, name = _client(mlflow_server), "champion_order"
    run_id = client.create_run(client.create_experiment("champion_order")).info.run_id

    def register(export: int):
        return register_version(client, model_name=name, source=f"docker-host://127.0.0.1/models/{name}/{export}",
                                mlflow_run_id=run_id, tags={"tfpipe.export_version": str(export)},
                                alias="champion", log=logging.getLogger("test"))

    newer, older = register(5), register(4)
    assert client.get_model_version_by_alias(name, "champion").version == newer.version != older.version
    assert register(6).version == client.get_model_version_by_alias(name, "champion").version
