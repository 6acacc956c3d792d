"""The ``register`` task in the DAG, its link on ``train``, its skip without a connection, and the pure
builders of what goes into MLflow (no server: tests/integration/test_mlflow.py runs a real one)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from airflow.providers.common.compat.sdk import AirflowSkipException

from tfpipe import mlflow as tracking
from tfpipe.config import PipelineConfig, TfpipeConfigError
from tfpipe.dag_factory import training_pipeline
from tfpipe.links import MlflowRunLink
from tfpipe.operators.register import RegisterOperator, run_files

HOME = "/srv/ml"
BASE = {"dag_id": "tracked", "image": {"ref": "tfpipe/trainer:1f14aed53083"},
        "volumes": {"data": f"{HOME}/data", "work": f"{HOME}/work", "models": f"{HOME}/models"},
        "data": {"path": "digits/digits.csv"}, "export": {"model_name": "digits"}}


def _dag(**overrides):
    return training_pipeline(PipelineConfig.from_dict({**BASE, **overrides}))


def test_register_follows_export_and_runs_when_export_is_skipped():
    """``register`` is the last task, after ``export``, with ``none_failed``: a not-blessed run (export
    skipped) is still logged, a failed export stops it."""
    dag = _dag()
    register = dag.get_task("register")
    assert register.upstream_task_ids == {"export"} and register.downstream_task_ids == set()
    assert register.trigger_rule == "none_failed"
    assert register.retries == 2
    assert isinstance(register, RegisterOperator) and register.model_name == "digits"
    assert register.conn_id == "mlflow_default" and register.prep_task_id == "prep"
    assert register.publish_task_id is None
    assert "MLflow" in register.doc_md


def test_register_follows_publish_when_the_dag_publishes():
    """With ``publish``, ``register`` waits for it, so the version's source can be its ``gs://`` copy."""
    dag = _dag(publish_uri="gs://models-x/prod")
    register = dag.get_task("register")
    assert register.upstream_task_ids == {"publish"}
    assert register.publish_task_id == "publish"


def test_register_reads_the_merged_data_set_of_sharded_prep():
    dag = _dag(data={"path": "digits/digits.csv", "shards": 2})
    assert dag.get_task("register").prep_task_id == "prep_merge"


def test_no_register_task_on_kubernetes_or_when_disabled():
    """The task reads the run's files through a Docker engine: the Kubernetes backend has none; and
    ``mlflow.enabled: false`` leaves it out."""
    on_kubernetes = _dag(backend="kubernetes")
    assert "register" not in on_kubernetes.task_ids
    assert "register" not in _dag(mlflow={"enabled": False}).task_ids
    assert _dag(mlflow={"conn_id": "tracking"}).get_task("register").conn_id == "tracking"


def test_mlflow_section_rejects_unknown_keys_with_a_did_you_mean():
    with pytest.raises(TfpipeConfigError, match=r"mlflow.*conn_idd.*conn_id"):
        PipelineConfig.from_dict({**BASE, "mlflow": {"conn_idd": "x"}})


def test_train_has_the_mlflow_run_link():
    """``train`` offers "MLflow run" beside its report and TensorBoard links; ``register`` stores it
    under the link's own XCom key."""
    train = _dag().get_task("train")
    names = [link.name for link in train.operator_extra_links]
    assert names == ["Run report", "TensorBoard", "MLflow run"]
    assert MlflowRunLink().xcom_key == "_link_MlflowRunLink"


def test_without_the_connection_register_skips_and_says_how_to_add_it(monkeypatch):
    """No ``mlflow_default`` connection: the task skips itself before touching the engine or XCom, and
    its message names the connection and the command that adds it."""
    monkeypatch.delenv("AIRFLOW_CONN_MLFLOW_DEFAULT", raising=False)
    register = _dag().get_task("register")
    with pytest.raises(AirflowSkipException) as raised:
        register.execute(context={})
    message = str(raised.value)
    assert "no Airflow connection 'mlflow_default': nothing logged to MLflow" in message
    assert "airflow connections add mlflow_default --conn-type http --conn-host http://127.0.0.1:5000" in message


@pytest.mark.parametrize("conn,uri", [
    (dict(conn_type="http", host="http://127.0.0.1:5000", port=None, schema=None), "http://127.0.0.1:5000"),
    (dict(conn_type="http", host="https://mlflow.example.com/", port=None, schema=None), "https://mlflow.example.com"),
    (dict(conn_type="http", host="127.0.0.1", port=5000, schema=None), "http://127.0.0.1:5000"),
    (dict(conn_type="https", host="mlflow.internal", port=None, schema="tracking"), "https://mlflow.internal/tracking"),
    (dict(conn_type="http", host="http://mlflow", port=8080, schema=None), "http://mlflow:8080"),
])
def test_tracking_uri_from_the_connection(conn, uri):
    """The connection's host is the tracking URI; a connection given as a URI (host, port) works too."""
    assert tracking.tracking_uri(SimpleNamespace(conn_id="mlflow_default", **conn)) == uri


def test_a_connection_without_host_is_an_error_with_the_fix():
    with pytest.raises(ValueError, match="no host. Fix: set its host to the tracking URI"):
        tracking.tracking_uri(SimpleNamespace(conn_id="m", conn_type="http", host="", port=None, schema=None))


def test_params_are_the_resolved_sections_and_the_airflow_run_id():
    params = tracking.run_params({"training": {"epochs": 3, "model": "mlp", "hidden_units": [64, 32]},
                                  "evaluation": {"threshold": 0.9}}, "manual__1")
    assert params == {"training.epochs": "3", "training.model": "mlp", "training.hidden_units": "[64, 32]",
                      "evaluation.threshold": "0.9", "airflow_run_id": "manual__1"}
    assert len(tracking.run_params({"training": {"x": "y" * 9000}}, "r")["training.x"]) == tracking.PARAM_VALUE_MAX


def test_epoch_metrics_take_the_measured_fields_with_the_epoch_as_step():
    history = [{"epoch": 1, "step": 10, "try_number": 1, "loss": 0.9, "accuracy": 0.5, "best": True,
                "time": "2026-12-07T00:00:00Z", "batches": 10},
               {"epoch": 2, "step": 20, "try_number": 2, "loss": 0.4, "val_accuracy": 0.8}]
    assert tracking.epoch_metrics(history) == [("accuracy", 0.5, 1), ("loss", 0.9, 1), ("loss", 0.4, 2),
                                               ("val_accuracy", 0.8, 2)]


def test_evaluation_metrics_and_blessing_tags():
    evaluation = {"blessed": False, "metric": "accuracy", "threshold": 1.0, "reason": "accuracy 0.93 < 1.0",
                  "metrics": {"accuracy": 0.93, "loss": 0.2}}
    assert tracking.evaluation_metrics(evaluation) == {"eval_accuracy": 0.93, "eval_loss": 0.2}
    assert tracking.evaluation_tags(evaluation) == {
        "tfpipe.blessed": "false", "tfpipe.blessing.metric": "accuracy", "tfpipe.blessing.threshold": "1.0",
        "tfpipe.blessing.reason": "accuracy 0.93 < 1.0"}


@pytest.mark.parametrize("docker_url,source", [
    ("unix://var/run/docker.sock", "docker-host://localhost/srv/ml/models/digits/3"),
    ("tcp://gpu-host.internal:2376", "docker-host://gpu-host.internal/srv/ml/models/digits/3"),
])
def test_version_source_names_the_engine_host_and_the_path(docker_url, source):
    """A version on the models volume is named by the engine's host and its path there (the tracking
    server refuses a bare local path that is not under the run's artifacts)."""
    assert tracking.engine_source(docker_url, "/srv/ml/models/digits/3") == source


def test_version_tags_prefer_the_versions_own_metadata():
    metadata = {"data": {"fingerprint": "abc123"},
                "image": {"reference": "reg/trainer@sha256:1", "id": "sha256:2", "repo_digest": "reg/trainer@sha256:1"}}
    tags = tracking.version_tags(dag_id="d", run_id="r", metadata=metadata, image="tfpipe/trainer:x",
                                 fingerprint="other", host_path="/srv/ml/models/digits/3", export_version=3)
    assert tags == {"airflow.dag_id": "d", "airflow.run_id": "r", "tfpipe.export_version": "3",
                    "tfpipe.data_fingerprint": "abc123", "tfpipe.image": "reg/trainer@sha256:1",
                    "tfpipe.image_id": "sha256:2", "tfpipe.image_digest": "reg/trainer@sha256:1",
                    "tfpipe.host_path": "/srv/ml/models/digits/3"}
    bare = tracking.version_tags(dag_id="d", run_id="r", metadata=None, image="tfpipe/trainer:x",
                                 fingerprint="f0", host_path=None, export_version=1)
    assert bare["tfpipe.image"] == "tfpipe/trainer:x" and bare["tfpipe.data_fingerprint"] == "f0"
    assert "tfpipe.image_id" not in bare


def test_ui_urls():
    assert tracking.run_url("http://127.0.0.1:5000/", "3", "ab12") == "http://127.0.0.1:5000/#/experiments/3/runs/ab12"
    assert tracking.version_url("http://m", "digits", 2) == "http://m/#/models/digits/versions/2"


def test_run_files_are_under_the_run_dir():
    files = run_files("tracked", "manual__1")
    assert files["metrics"] == "/work/runs/tracked/manual__1/metrics.json"
    assert files["config/train"] == "/work/runs/tracked/manual__1/config/train.json"
    assert files["report/report.html"] == "/work/runs/tracked/manual__1/report.html"


def test_a_tracking_server_that_does_not_answer_is_named_and_an_http_error_is_left_to_the_client():
    """No server on the port: :func:`check_answers` raises, naming the server, the connection, that the export
    is untouched and the fix (a plain exception: Airflow retries the task). A server that answers, even with
    an HTTP error, passes: MLflow's client then says what is wrong."""
    import http.server
    import threading

    from tests.conftest import free_port
    from tfpipe.mlflow import TrackingServerDown, check_answers

    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TrackingServerDown) as err:
        check_answers(down, "mlflow_default", timeout=2)
    assert str(err.value).startswith(f"the MLflow tracking server {down} (Airflow connection 'mlflow_default') "
                                     "does not answer")
    assert "the exported model is untouched" in str(err.value) and "Fix:" in str(err.value)

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_answers(f"http://127.0.0.1:{server.server_address[1]}", "mlflow_default", timeout=2)
    finally:
        server.shutdown()
    check_answers("databricks", "mlflow_default")  # not an HTTP server URI: nothing to probe
