"""``make up`` runs a real MLflow tracking server beside Airflow, which tracks the stack DAGs' runs and
registers their blessed exports (after test_stack.py, whose two-runs test it reads)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from deploy.stack import _http_status
from tests.deployment.conftest import stack_cli

pytestmark = [pytest.mark.integration, pytest.mark.deployment]

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


def test_mlflow_server_runs_on_loopback_and_tracks_two_blessed_runs_and_one_unblessed(stack, rest):
    """The MLflow server answers on loopback only and ``status`` lists it; Airflow has the connection
    ``mlflow_default``. After two blessed runs of a stack DAG (the two-runs-at-once test's, which registered
    at the same moment; alone, this test makes them) and one unblessed run, MLflow's REST API holds three
    runs with their metrics, two versions of the registered model, the alias ``champion`` on the version of
    the newest blessed export, and that version's source points at the exported SavedModel; the artifacts
    lie beside the models volume and the train task links to its MLflow run."""
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
    done = [r["dag_run_id"] for r in rest.get(f"dags/{DAG_ID}/dagRuns")["dag_runs"] if r["state"] == "success"]
    blessed = [r for r in done if (rest.xcom(DAG_ID, r, "evaluate") or {}).get("blessed")][-2:]
    while len(blessed) < 2:
        run_id = rest.trigger(DAG_ID)
        assert rest.wait_for_run(DAG_ID, run_id, timeout=900)["state"] == "success"
        blessed.append(run_id)
    unblessed = rest.trigger(DAG_ID, conf={"threshold": 1.0})
    assert rest.wait_for_run(DAG_ID, unblessed, timeout=900)["state"] == "success"
    for run_id in (*blessed, unblessed):
        states = {t["task_id"]: t["state"] for t in rest.task_instances(DAG_ID, run_id)}
        assert states["register"] == "success", (run_id, states)

    client = MlflowClient(tracking_uri=stack.mlflow_url, registry_uri=stack.mlflow_url)
    experiment = client.get_experiment_by_name(DAG_ID)
    tracked = {}
    for run_id in (*blessed, unblessed):
        (found,) = client.search_runs([experiment.experiment_id], filter_string=f"tags.`airflow.run_id` = '{run_id}'")
        assert found.data.metrics and found.data.params["airflow_run_id"] == run_id, run_id
        tracked[run_id] = found
    assert [tracked[r].data.tags["tfpipe.blessed"] for r in (*blessed, unblessed)] == ["true", "true", "false"]
    versions = [v for v in client.search_model_versions(f"name = '{DAG_ID}'")
                if v.run_id in {tracked[r].info.run_id for r in (*blessed, unblessed)}]
    assert sorted(v.tags["airflow.run_id"] for v in versions) == sorted(blessed), "the unblessed run has none"
    exports = {r: rest.xcom(DAG_ID, r, "export")["version"] for r in blessed}
    newest = max(blessed, key=exports.get)
    champion = client.get_model_version_by_alias(DAG_ID, "champion")
    assert champion.tags["airflow.run_id"] == newest and champion.tags["tfpipe.export_version"] == str(exports[newest])
    host_dir = f"{stack.volumes}/models/{DAG_ID}/{exports[newest]}"
    assert champion.source == f"docker-host://127.0.0.1{host_dir}", champion.source
    assert (Path(host_dir) / "saved_model.pb").is_file()
    assert "@sha256:" in champion.tags["tfpipe.image"], champion.tags
    artifact_dir = stack.volumes / "mlflow-artifacts"
    assert artifact_dir.parent == (stack.volumes / "models").parent
    assert list(artifact_dir.rglob("report/report.html")), f"no report under {artifact_dir}"
    # the train task's "MLflow run" link leads to the logged run
    result = rest.xcom(DAG_ID, unblessed, "register")
    assert rest.xcom(DAG_ID, unblessed, "train", key="_link_MlflowRunLink") == result["run_url"]
