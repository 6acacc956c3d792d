"""The tfpipe plugin in a running api-server: the report for readers only, TensorBoard, the run note, metrics."""

from __future__ import annotations

import json
import subprocess
from urllib.parse import parse_qs, quote, unquote, urlsplit

import pytest

from tests.conftest import REPO
from tests.engine_watch import InspectOnCreate
from tests.ui.conftest import DAG_ID

pytestmark = pytest.mark.integration


def test_airflow_discovers_the_plugin_through_the_entry_point():
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "airflow"), "plugins", "--output", "json"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plugins = {p["name"]: p for p in json.loads(proc.stdout[proc.stdout.index("["):])}
    assert "tfpipe" in plugins, f"airflow plugins lists {sorted(plugins)}"
    plugin = plugins["tfpipe"]
    assert "tfpipe.plugins.listener" in str(plugin["listeners"])
    assert "'url_prefix': '/tfpipe'" in str(plugin["fastapi_apps"])
    assert "airflow-provider-tfpipe" in str(plugin["source"]), "loaded from the distribution's entry point"


def _report_path(run_id: str, name: str = "") -> str:
    return f"/tfpipe/runs/{DAG_ID}/{quote(run_id, safe='')}/report/{name}"


def test_the_report_is_served_to_users_who_may_read_the_dag_and_to_no_one_else(ui_run):
    server, run_id = ui_run["server"], ui_run["summary"]["run_id"]
    for user in ("admin", "mlviewer"):
        status, headers, body = server.get(_report_path(run_id), user=user)
        assert status == 200, body[:500]
        assert headers["content-type"].startswith("text/html")
        page = body.decode()
        assert "<html" in page.lower() and run_id in page and "data:image/png;base64," in page
        for plot in ("loss.png", "accuracy.png", "confusion_matrix.png"):
            status, headers, png = server.get(_report_path(run_id, plot), user=user)
            assert status == 200 and headers["content-type"] == "image/png"
            assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000
    # a viewer of another team may not read this DAG, so not its report either
    status, _, body = server.get(_report_path(run_id), user="outsider")
    assert status == 403, body[:500]
    status, _, _ = server.get(_report_path(run_id, "loss.png"), user="outsider")
    assert status == 403
    # and Airflow's own API agrees with the plugin about who may read the run
    assert server.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}", user="outsider")[0] == 403
    assert server.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id, safe='')}", user="mlviewer")[0] == 200
    # no credentials: 401 for an API client, the login page for a browser
    assert server.get(_report_path(run_id))[0] == 401
    status, headers, _ = server.get(_report_path(run_id), headers={"Accept": "text/html"})
    assert status in (302, 307) and "/auth/login" in headers["location"]
    # ... which sends the browser back to the report once logged in
    back = parse_qs(urlsplit(headers["location"]).query).get("next", [])
    assert [unquote(urlsplit(url).path) for url in back] == [unquote(_report_path(run_id))], headers["location"]
    # only the report's own files, only of runs that exist
    assert server.get(_report_path(run_id, "metrics.json"), user="admin")[0] == 404
    status, _, body = server.get(_report_path("manual__no_such_run"), user="admin")
    # the same answer as for a run of the Kubernetes backend, whose stages record no engine location
    assert status == 404 and "no stage task of it recorded where its files are" in body.decode()
    assert "the Kubernetes backend, whose volumes the plugin cannot read" in body.decode()


def test_each_report_read_binds_the_work_volume_read_only_and_leaves_no_container(ui_run, docker_client):
    """The report reader is a helper of the trainer image with ``tfpipe.role=report-reader`` that
    binds the engine host's work volume read-only, and is removed after each request."""
    import docker

    from tfpipe.plugins.run_access import REPORT_READER_ROLE

    server, run_id = ui_run["server"], ui_run["summary"]["run_id"]
    # the plugin removes each helper within its request: inspect it the moment the engine creates it
    watcher = InspectOnCreate(docker_client, f"tfpipe.role={REPORT_READER_ROLE}", f"tfpipe.dag_id={DAG_ID}",
                              f"tfpipe.run_id={run_id}")
    watcher.start()
    try:
        for _ in range(3):
            for name in ("", "loss.png"):
                status, _, body = server.get(_report_path(run_id, name), user="mlviewer")
                assert status == 200, body[:500]
    finally:
        watcher.stop()
    assert len(watcher.created) == 6, f"one helper per request, got {watcher.created}"
    for container_id in watcher.created:
        with pytest.raises(docker.errors.NotFound):
            docker_client.api.inspect_container(container_id)
    assert docker_client.api.containers(all=True, filters={"label": [
        f"tfpipe.role={REPORT_READER_ROLE}", f"tfpipe.run_id={run_id}"]}) == []
    # seen while it existed (a busy engine may remove one before the watcher looks, not all six)
    assert watcher.inspected, "no report reader could be inspected while it existed"
    work = str(ui_run["home"] / "work")
    for info in watcher.inspected.values():
        assert info["Config"]["Image"] == ui_run["image"]
        # never started: a created container's start time is Docker's zero time; the watcher may see
        # it created or already being removed (the plugin removes it within the request)
        assert info["State"]["Status"] in ("created", "removing"), info["State"]
        assert info["State"]["StartedAt"] == "0001-01-01T00:00:00Z", "started: %s" % info["State"]
        (mount,) = [m for m in info["Mounts"] if m["Destination"] == "/work"]
        assert (mount["Type"], mount["Source"], mount["RW"]) == ("bind", work, False)
        assert info["HostConfig"]["Binds"] == [f"{work}:/work:ro"]


def test_tensorboard_is_started_on_demand_through_the_engine(ui_run, docker_client):
    server, run_id = ui_run["server"], ui_run["summary"]["run_id"]
    base = f"/tfpipe/runs/{DAG_ID}/{quote(run_id, safe='')}/tensorboard/"
    assert server.get(base, user="outsider")[0] == 403
    status, headers, body = server.get(base, user="mlviewer")
    assert status == 200, body[:1000]
    assert headers["content-type"].startswith("text/html") and b"TensorBoard" in body
    status, _, body = server.get(base + "data/runs", user="mlviewer")
    assert status == 200
    assert json.loads(body), "TensorBoard found the run's event files"
    status, _, body = server.get(base + "data/plugins_listing", user="mlviewer")
    assert status == 200 and json.loads(body)["scalars"]["enabled"] is True
    # one container for the run, with no network: the engine API is the only way in
    from tfpipe.plugins.run_access import TENSORBOARD_ROLE

    found = docker_client.api.containers(filters={"label": [f"tfpipe.role={TENSORBOARD_ROLE}",
                                                            f"tfpipe.tensorboard={DAG_ID}/{run_id}"]})
    assert len(found) == 1
    assert docker_client.api.inspect_container(found[0]["Id"])["HostConfig"]["NetworkMode"] == "none"


def test_the_run_note_summarises_the_run(ui_run):
    server, summary = ui_run["server"], ui_run["summary"]
    status, _, body = server.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{quote(summary['run_id'], safe='')}", user="admin")
    assert status == 200
    note = json.loads(body)["note"]
    accuracy = summary["metrics"]["accuracy"]
    assert note.startswith(f"tfpipe: blessed, accuracy {accuracy:.4f} >= threshold 0.5000 (no baseline); "), note
    assert f"model {DAG_ID} v1" in note and "train 1 try" in note and "\n" not in note


def test_training_metrics_reach_statsd_under_tfpipe(ui_run):
    gauges = {}
    for line in ui_run["statsd"]:
        name, _, rest = line.partition(":")
        if rest.endswith("|g"):
            gauges[name] = float(rest[:-2])
    prefix = f"airflow.tfpipe.{DAG_ID}"  # Airflow puts [metrics] statsd_prefix ("airflow") before every name
    summary = ui_run["summary"]
    assert gauges[f"{prefix}.train.epochs"] == 2
    assert gauges[f"{prefix}.train.final_loss"] > 0 and gauges[f"{prefix}.train.final_val_loss"] > 0
    assert 0 < gauges[f"{prefix}.train.final_val_accuracy"] <= 1
    assert gauges[f"{prefix}.evaluate.accuracy"] == pytest.approx(summary["metrics"]["accuracy"], abs=1e-6)
    assert gauges[f"{prefix}.evaluate.blessed"] == 1
    assert gauges[f"{prefix}.export.version"] == 1
    assert gauges[f"{prefix}.prep.examples"] == 1797
