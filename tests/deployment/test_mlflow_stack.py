"""``make up`` runs a real MLflow tracking server beside Airflow, and a stack DAG's run is registered in it."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from deploy.stack import _http_status
from tests.deployment.conftest import stack_cli

pytestmark = pytest.mark.deployment

DAG_ID = "tfpipe_stack_parallel"  # schedule=None, threshold 0.0: one triggered run is blessed


def _listening_addresses(port: int) -> set[str]:
    """The local addresses of the IPv4/IPv6 sockets listening on ``port`` (``/proc/net/tcp*``)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(address)
                if len(raw) == 4:
                    found.add(socket.inet_ntop(socket.AF_INET, raw[::-1]))
                else:
                    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
                    found.add(socket.inet_ntop(socket.AF_INET6, words))
    return found


def test_mlflow_server_runs_on_loopback_and_a_stack_run_is_registered(stack, rest):
    """The MLflow server answers on loopback only and ``status`` lists it; Airflow has the connection
    ``mlflow_default``; one run of a stack DAG is logged (params, report) with its store in PostgreSQL and
    its artifacts beside the models volume, and its blessed export is registered with ``champion``."""
    from mlflow import MlflowClient

    pid = stack.pid("mlflow")
    assert pid, "no mlflow pid under the stack's run dir"
    assert _http_status(f"{stack.mlflow_url}/health") == 200
    assert _listening_addresses(stack.port("mlflow")) == {"127.0.0.1"}
    status = stack_cli(stack.env, "status")
    assert f"mlflow         pid {pid}" in status.stdout, status.stdout
    assert f"MLflow:          {stack.mlflow_url}" in status.stdout, status.stdout
    # the store's password stays off the command line (ps shows that)
    assert stack.secret("mlflow-pg-password") not in Path(f"/proc/{pid}/cmdline").read_text()
    conn = rest.get("connections/mlflow_default")
    assert conn["host"] == stack.mlflow_url, conn

    rest.wait_for_dag(DAG_ID)
    rest.unpause(DAG_ID)
    run_id = rest.trigger(DAG_ID)
    run = rest.wait_for_run(DAG_ID, run_id, timeout=900)
    states = {t["task_id"]: t["state"] for t in rest.task_instances(DAG_ID, run_id)}
    assert run["state"] == "success" and states["register"] == "success", states
    result = rest.xcom(DAG_ID, run_id, "register")
    export = rest.xcom(DAG_ID, run_id, "export")

    client = MlflowClient(tracking_uri=stack.mlflow_url, registry_uri=stack.mlflow_url)
    logged = client.get_run(result["mlflow_run_id"])
    assert logged.data.params["airflow_run_id"] == run_id and logged.data.tags["tfpipe.blessed"] == "true"
    assert client.get_experiment(logged.info.experiment_id).name == DAG_ID
    artifact_dir = stack.volumes / "mlflow-artifacts"
    assert artifact_dir.parent == (stack.volumes / "models").parent
    assert list(artifact_dir.rglob("report/report.html")), f"no report under {artifact_dir}"
    version = client.get_model_version(DAG_ID, str(result["registered_version"]))
    host_dir = f"{stack.volumes}/models/{DAG_ID}/{export['version']}"
    assert version.source == f"docker-host://127.0.0.1{host_dir}", version.source
    assert version.tags["airflow.run_id"] == run_id and "@sha256:" in version.tags["tfpipe.image"], version.tags
    assert client.get_model_version_by_alias(DAG_ID, "champion").version == version.version
    # the train task's "MLflow run" link leads to the logged run
    assert rest.xcom(DAG_ID, run_id, "train", key="_link_MlflowRunLink") == result["run_url"]
