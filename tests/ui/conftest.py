"""One real tfpipe run seen where people look: the api-server's plugin, the run note, metrics, lineage.

The session fixture ``ui_run`` makes an Airflow home of its own (a copy of the migrated metadata
DB), so the settings these tests need do not leak into other tests:

* the simple auth manager with three users: ``admin`` (admin), ``mlviewer`` (viewer in team
  ``mlteam``) and ``outsider`` (viewer in team ``other``); multi-team mode with the DAG bundle
  owned by team ``mlteam``: teams are how the simple auth manager limits who may read a DAG
  (its roles alone apply to every DAG);
* OpenLineage's file transport writing every event of the run to a file;
* StatsD metrics on, sent to a UDP listener on loopback that this fixture runs;
* a GCS emulator: the run stages its raw data in from ``gs://`` and publishes the model there.

It then runs the small DAG ``tfpipe_ui`` once through ``tfpipe run`` (``dag.test``, real
containers) and starts ``airflow api-server`` on a free loopback port in its own process group,
stopped (the whole group) at the end.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import pytest

from tests.airflow_servers import PASSWORDS, ApiServer, create_teams, multi_team_settings, remove_tensorboards
from tests.conftest import DIGITS_CSV, REPO, copy_sqlite_db, run_dag, write_dag
from tests.integration.conftest import digits_bucket, gcs_emulator  # noqa: F401  (the session's emulator fixture)

DAG_ID = "tfpipe_ui"


class StatsdListener(threading.Thread):
    """A real StatsD endpoint: a UDP socket on loopback that keeps every datagram's lines."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                data, _ = self.sock.recvfrom(65536)
            except socket.timeout:
                continue
            self.lines.extend(data.decode("utf-8", "replace").splitlines())

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=2)
        self.sock.close()


@pytest.fixture(scope="session")
def ui_run(tmp_path_factory, trainer_image, request):
    """A finished, published run of ``tfpipe_ui`` and a running api-server on its metadata DB."""
    emulator = request.getfixturevalue("gcs_emulator")
    if not DIGITS_CSV.exists():
        pytest.fail(f"{DIGITS_CSV} is missing: run `make data`")
    source_db = REPO / ".airflow" / "airflow.db"
    if not source_db.exists():
        pytest.fail(f"{source_db} is missing: run `make airflow-db`")
    root = tmp_path_factory.mktemp("ui")
    airflow_home, home, dags = root / "airflow", root / "home", root / "dags"
    airflow_home.mkdir()
    copy_sqlite_db(source_db, airflow_home / "airflow.db")
    (home / "data").mkdir(parents=True)
    write_dag(dags, DAG_ID, training={"model": "mlp", "epochs": 2, "batch_size": 64},
              evaluation={"threshold": 0.5, "tolerance": 1.0}, gcs_tasks=True)
    passwords = airflow_home / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    lineage = root / "openlineage.jsonl"
    statsd = StatsdListener()
    statsd.start()
    settings = {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        **multi_team_settings(dags),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(lineage),
                                                        "append": True}),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "tfpipe-test",
        # the default 10 s for emitting an event is tight on a busy 2-core machine
        "AIRFLOW__OPENLINEAGE__EXECUTION_TIMEOUT": "60",
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
        "STORAGE_EMULATOR_HOST": emulator,
    }
    env = {k: v for k, v in os.environ.items() if k not in ("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
                                                           "GOOGLE_APPLICATION_CREDENTIALS")}
    env.update(settings)
    create_teams(env)

    bucket, conf = digits_bucket(emulator, "tfpipe-ui")
    started = time.monotonic()
    try:
        summary, log = run_dag(DAG_ID, conf, home=home, image=trainer_image, dags_folder=dags, extra_env=settings)
    finally:
        time.sleep(0.5)  # the last datagrams
        statsd.stop()
    run_seconds = time.monotonic() - started
    assert summary["state"] == "success", log[-8000:]
    assert summary["tasks"]["publish"]["state"] == "success", log[-8000:]
    server = ApiServer(env, root / "api-server.log")
    try:
        yield {"summary": summary, "log": log, "env": env, "server": server, "home": home, "dags": dags,
               "lineage": lineage, "statsd": statsd.lines, "bucket": bucket.name, "image": trainer_image,
               "run_seconds": run_seconds, "conf": conf}
    finally:
        server.stop()
        remove_tensorboards(DAG_ID, summary["run_id"])
