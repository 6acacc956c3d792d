"""A tfpipe DAG run by Celery workers on PostgreSQL, on every supported Airflow release.

``tests/integration/test_release_scheduler.py`` runs each release's scheduler with the
LocalExecutor on SQLite; ``make up``'s deployment (TLS engine, several workers) runs on the newest
release. Here each release's scheduler hands the tasks to an ``airflow celery worker`` of the same
release through a Redis broker of this test's own (started here on loopback, stopped by its pid),
with the metadata DB and Celery's results in PostgreSQL (started by ``make up``'s own code,
:class:`deploy.stack.Stack`, in a directory of its own on a free loopback port, the release's
schema made by its ``airflow db migrate``), as on a Celery deployment: every stage runs in a task
process that Airflow forks from a Celery pool process, so it is daemonic. The data is the digits
CSV split into 80 objects, so the stage-in downloads them in processes forked from that daemonic
process, which multiprocessing refuses unless tfpipe allows it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.airflow_servers import QUICK_BLESSED, AirflowProcess, ApiServer, release_home
from tests.conftest import DIGITS_CSV, free_port, stop_group
from tests.integration.conftest import emulator_client, gcs_emulator  # noqa: F401  (the session's emulator fixture)
from tests.integration.test_release_scheduler import _logs, _trigger, _wait_for_run, scheduler_env

pytestmark = [pytest.mark.integration, pytest.mark.compat, pytest.mark.older_releases, pytest.mark.gcs]

DAG_ID = "tfpipe_release_celery"
STAGES = ("stage_in", "prep", "validate", "train", "evaluate", "export", "publish", "cleanup")
SHARDS = 80  # a stage-in of many objects, in the daemonic Celery task process


def _redis(root: Path) -> tuple[subprocess.Popen, int]:
    """``redis-server`` on a free loopback port, answering PING; the process and the port."""
    exe = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.path.exists(exe):
        pytest.fail("redis-server is missing. Fix: sudo apt-get install -y redis-server "
                    "(or run `make up` as root on Debian, which installs it)")
    port = free_port()
    log = open(root / "redis.log", "wb")
    proc = subprocess.Popen([exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
                             "--dir", str(root)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 30
    while subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True).stdout.strip() != "PONG":
        assert proc.poll() is None and time.monotonic() < deadline, (root / "redis.log").read_text()[-2000:]
        time.sleep(0.2)
    return proc, port


@contextlib.contextmanager
def _postgres() -> Iterator[str]:
    """PostgreSQL as ``make up`` starts it, in a directory of its own on a free loopback port, stopped
    by its pid at the end; yields the metadata DB's SQLAlchemy URL."""
    from deploy.stack import Stack

    # not under pytest's tmp_path (0700): as root the server runs as the postgres user
    root = Path(tempfile.mkdtemp(prefix="tfpipe-celery-pg-"))
    root.chmod(0o755)
    stack = Stack({"TFPIPE_STACK_DIR": str(root), "TFPIPE_STACK_PG_PORT": str(free_port())})
    try:
        stack.start_postgres()  # names the package to install when PostgreSQL is missing
        yield stack.pg_url
    finally:
        stack.stop("postgres", signal.SIGINT)  # PostgreSQL's fast shutdown, as `make down` stops it
        shutil.rmtree(root, ignore_errors=True)


def _sharded_digits_bucket(emulator: str) -> tuple[object, dict[str, bytes]]:
    """A new bucket on ``emulator`` with the digits CSV split into :data:`SHARDS` CSV objects under
    ``raw/``, each with the header; the bucket and each object's bytes by name."""
    bucket = emulator_client(emulator).create_bucket(f"tfpipe-celery-{uuid.uuid4().hex[:10]}")
    header, *rows = DIGITS_CSV.read_text().splitlines(keepends=True)
    bodies = {f"raw/part-{i:03d}.csv": (header + "".join(rows[i::SHARDS])).encode() for i in range(SHARDS)}
    for name, body in bodies.items():
        bucket.blob(name).upload_from_string(body)
    return bucket, bodies


@pytest.fixture(scope="module")
def celery_run(tmp_path_factory, trainer_image, gcs_emulator):  # noqa: F811  (the fixture)
    """One run of a small tfpipe DAG, triggered through the REST API and run by a Celery worker."""
    import airflow

    root = tmp_path_factory.mktemp("release-celery")
    home, dags, settings = release_home(root, DAG_ID, "admin:admin", **QUICK_BLESSED, gcs_tasks=True,
                                        local_data=False, data={"path": "digits"})
    bucket, bodies = _sharded_digits_bucket(gcs_emulator)
    with _postgres() as pg_url:
        redis, port = _redis(root)
        env = scheduler_env(settings, home, trainer_image, gcs_emulator,
                            AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=pg_url,
                            AIRFLOW__CORE__EXECUTOR="airflow.providers.celery.executors.celery_executor.CeleryExecutor",
                            AIRFLOW__CELERY__BROKER_URL=f"redis://127.0.0.1:{port}/0",
                            AIRFLOW__CELERY__RESULT_BACKEND=f"db+{pg_url}",
                            AIRFLOW__CELERY__WORKER_CONCURRENCY="2")
        components = []
        try:
            migrate = subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env,
                                     capture_output=True, text=True, timeout=600)
            assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
            server = ApiServer(env, root / "api-server.log")
            components.append(server)
            env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"{server.url}/execution/"
            worker_log = root / "celery-worker.log"
            components += [AirflowProcess(["celery", "worker", "--skip-serve-logs", "--concurrency", "2",
                                           "--celery-hostname", f"tfpipe-compat-{port}@%h"], env, worker_log),
                           AirflowProcess(["dag-processor"], env, root / "dag-processor.log"),
                           AirflowProcess(["scheduler"], env, root / "scheduler.log")]
            path = _trigger(server, root, DAG_ID, {"data_uri": f"gs://{bucket.name}/raw/",
                                                   "publish_uri": f"gs://{bucket.name}/models"})
            _wait_for_run(server, root, path, seconds=600, components=components)  # the tests judge its end state
            status, _, body = server.get(path + "/taskInstances", user="admin")
            tasks = {ti["task_id"]: ti for ti in json.loads(body)["task_instances"]}
            yield {"run": json.loads(server.get(path, user="admin")[2]), "tasks": tasks, "home": home,
                   "airflow_home": Path(settings["AIRFLOW_HOME"]), "bucket": bucket, "bodies": bodies,
                   "worker_log": worker_log, "release": airflow.__version__, "logs": lambda: _logs(root),
                   "pg_url": pg_url}
        finally:
            for component in reversed(components):
                component.stop()
            stop_group(redis, timeout=10)


def test_a_celery_worker_runs_every_stage(celery_run):
    run, tasks = celery_run["run"], celery_run["tasks"]
    states = {task: ti["state"] for task, ti in tasks.items()}
    assert run["state"] == "success", f"{celery_run['release']}: {states}\n{celery_run['logs']()}"
    assert states == {**dict.fromkeys(STAGES, "success"), "register": "skipped"}, states  # no MLflow connection
    # each task went through the broker to the worker (its "succeeded" line may come after the run ends)
    worker_log = celery_run["worker_log"].read_text(errors="replace")
    executed = re.findall(r"Executing workload in Celery: .*?task_id='(\w+)'", worker_log)
    assert sorted(executed) == sorted(STAGES + ("register",)), worker_log[-4000:]
    model = celery_run["home"] / "models" / DAG_ID / "1"
    assert json.loads((model / "metadata.json").read_text())["run_id"] == run["dag_run_id"]
    published = {b.name for b in celery_run["bucket"].client.list_blobs(celery_run["bucket"].name,
                                                                       prefix=f"models/{DAG_ID}/1/")}
    assert f"models/{DAG_ID}/1/saved_model.pb" in published, sorted(published)
    note = run["note"]
    assert note and note.startswith("tfpipe: blessed, accuracy "), f"{celery_run['release']}: {note!r}"


def test_the_run_and_its_results_are_in_postgresql(celery_run):
    """The metadata DB is PostgreSQL: the run, its tasks and its XComs are rows there, and so are
    Celery's task results."""
    import psycopg2

    dsn = celery_run["pg_url"].replace("postgresql+psycopg2://", "postgresql://")
    with contextlib.closing(psycopg2.connect(dsn)) as db, db.cursor() as cur:
        cur.execute("SELECT r.state, n.content FROM dag_run r LEFT JOIN dag_run_note n ON n.dag_run_id = r.id "
                    "WHERE r.dag_id = %s", (DAG_ID,))
        assert cur.fetchall() == [("success", celery_run["run"]["note"])]
        cur.execute("SELECT task_id, state FROM task_instance WHERE dag_id = %s", (DAG_ID,))
        assert dict(cur.fetchall()) == {**dict.fromkeys(STAGES, "success"), "register": "skipped"}
        cur.execute("SELECT DISTINCT task_id FROM xcom WHERE dag_id = %s AND key = 'return_value'", (DAG_ID,))
        assert {"prep", "train", "evaluate", "export"} <= {task for (task,) in cur.fetchall()}
        # one result per task; the last one's may be stored a moment after the run ended
        deadline = time.monotonic() + 60
        while True:
            cur.execute("SELECT count(*) FROM celery_taskmeta WHERE status = 'SUCCESS'")
            stored = cur.fetchone()[0]
            db.commit()  # a new snapshot for the next count
            if stored >= len(STAGES) + 1 or time.monotonic() > deadline:  # + register, which skipped
                break
            time.sleep(1)
        assert stored == len(STAGES) + 1, f"{celery_run['release']}: {stored} Celery results in PostgreSQL"


def test_the_stage_in_downloads_in_the_daemonic_celery_task_process(celery_run):
    """The task process Airflow forks from a Celery pool process is daemonic; the stage-in
    downloads its 80 objects there (in threads), and every file arrives intact."""
    logs = sorted((celery_run["airflow_home"] / "logs").rglob("*.log"))
    stage_in = "".join(p.read_text(errors="replace") for p in logs if "task_id=stage_in" in str(p))
    assert stage_in, f"no stage_in task log under {celery_run['airflow_home'] / 'logs'}: {logs}"
    assert re.search(r"downloading 80 object\(s\), [\d.]+ MB, in \d+ threads", stage_in), stage_in[-4000:]
    assert "daemonic processes are not allowed" not in stage_in
    target = celery_run["home"] / "data" / "digits"
    staged = {p.name: p.read_bytes() for p in target.glob("*.csv")}
    assert staged == {name[len("raw/"):]: body for name, body in celery_run["bodies"].items()}
