"""Shared fixtures of the host test suite.

Airflow reads its configuration when first imported, so the environment is set here, before
any test module imports it: a project-local AIRFLOW_HOME (SQLite), this repo's dags/, no
example DAGs. `make test` sets the same values. Under pytest-xdist (``make test-host`` runs two
workers) each worker gets a copy of that Airflow home in a temporary directory, and the work is
split into units that keep shared fixtures on one worker (``pytest_xdist_make_scheduler``).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop_group(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Stop a server started with ``start_new_session=True``: SIGTERM to its whole process group,
    SIGKILL if it is still there after ``timeout`` seconds."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def wait_until_answers(url: str, proc: subprocess.Popen, log_path: Path, *, seconds: float, what: str,
                       interval: float = 0.5) -> None:
    """Return once ``GET url`` answers 200. If ``proc`` exits first, or ``seconds`` pass (its group is
    then stopped), the test fails with the end of ``log_path``."""
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop_group(proc)
            pytest.fail(f"{what} did not answer {url} within {seconds:g} s:\n{log_path.read_text()[-4000:]}")
        time.sleep(interval)


class JsonReplies(BaseHTTPRequestHandler):
    """A handler for a test's HTTP server on loopback: answers with JSON (:meth:`reply`), logs nothing."""

    def reply(self, status: int, document: dict) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def copy_sqlite_db(source: Path, target: Path) -> None:
    """Copy the SQLite DB ``source`` to ``target`` through SQLite's own backup API, never as a file.

    Airflow keeps its SQLite metadata DB in WAL mode: commits not yet checkpointed live in
    ``airflow.db-wal`` (a run's process that ends without closing its connections leaves them
    there), so a copy of ``airflow.db`` alone can miss them or catch a checkpoint half-written. And
    a process that opens and closes the DB file outside SQLite drops every POSIX lock it holds on
    it, SQLite's own included: another process may then checkpoint and remove the WAL under this
    one's open connections, whose next write damages the DB.
    """
    with contextlib.closing(sqlite3.connect(source)) as src, contextlib.closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


def _worker_airflow_home(worker: str) -> None:
    """Give this xdist worker a copy of the project's Airflow home (metadata DB included).

    Two workers running DAG runs against one SQLite file would lock each other out; each gets
    the migrated DB (Variables and all) copied, with the configuration's paths pointed at the copy.
    """
    source = Path(os.environ.get("AIRFLOW_HOME", REPO / ".airflow"))
    if not (source / "airflow.db").exists():
        raise SystemExit(f"{source / 'airflow.db'} is missing: run `make airflow-db` (make test does)")
    home = Path(tempfile.mkdtemp(prefix=f"tfpipe-{worker}-airflow-"))
    atexit.register(shutil.rmtree, home, True)
    copy_sqlite_db(source / "airflow.db", home / "airflow.db")
    for name in (".migrated", ".tfpipe_image"):
        if (source / name).exists():
            shutil.copy2(source / name, home / name)
    if (source / "airflow.cfg").exists():
        (home / "airflow.cfg").write_text((source / "airflow.cfg").read_text().replace(str(source), str(home)))
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home / 'airflow.db'}"


if os.environ.get("PYTEST_XDIST_WORKER"):
    _worker_airflow_home(os.environ["PYTEST_XDIST_WORKER"])
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow"))
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO / "dags"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
#: This process's metadata DB (a worker's copy, or the one make configured), checked after each test.
METADATA_DB = (Path(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///"))
               if os.environ.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "").startswith("sqlite:///")
               else Path(os.environ["AIRFLOW_HOME"]) / "airflow.db")
_damaged: list[str] = []

DIGITS_CSV = REPO / ".demo" / "data" / "digits" / "digits.csv"


def trainer_image_ref() -> str:
    """The trainer image `make image` built (content-tagged)."""
    ref = os.environ.get("TFPIPE_IMAGE")
    if not ref:
        marker = REPO / ".cache" / "trainer-image"
        if not marker.exists():
            pytest.fail("no trainer image: run `make image` (or `make test`, which builds it) first")
        ref = marker.read_text().strip()
    return ref


def chromium_path() -> str:
    """Chromium's executable; fails (does not skip) when there is none: `make test` installs it
    (scripts/ensure-chromium.sh) or stops saying why, so a missing one is a broken set-up."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.fail("no chromium on PATH: run scripts/ensure-chromium.sh (installs Debian's as root)")
    return chromium


#: What Chromium aborts a load with when the host's network interfaces change under it. The Docker
#: engine adds and removes a veth for each container that other tests start meanwhile, and
#: Chromium aborts even a load from loopback then (seen in CI, on a goto to the api-server).
NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"
#: Loads of one page before a network change fails the test.
LOAD_TRIES = 3


def goto(page, url: str, **kwargs):
    """``page.goto(url, **kwargs)``, loaded again when Chromium aborted it for a network change
    (``NETWORK_CHANGED``), up to ``LOAD_TRIES`` times; any other error is raised at once."""
    from playwright.sync_api import Error

    for attempt in range(1, LOAD_TRIES + 1):
        try:
            return page.goto(url, **kwargs)
        except Error as error:
            if attempt == LOAD_TRIES or NETWORK_CHANGED not in str(error):
                raise
            # a warning, not a print: the run's summary shows every retry, passing tests' included
            warnings.warn(f"Chromium: {NETWORK_CHANGED} loading {url} on try {attempt}; loading it again", stacklevel=2)


@pytest.fixture(autouse=True)
def metadata_db_intact(request):
    """After each test, this process's metadata DB still passes SQLite's ``quick_check``.

    A worker's tests share that DB. A test that damaged it would otherwise show only as failures of
    later, unrelated tests ("database disk image is malformed", once, several tests on); this names
    the test during which it happened, once.
    """
    yield
    if _damaged or not METADATA_DB.exists():
        return
    try:
        # read-write, as Airflow opens it: a killed run's hot journal is rolled back first, not a fault
        with contextlib.closing(sqlite3.connect(METADATA_DB, timeout=30)) as db:
            verdict = [row[0] for row in db.execute("PRAGMA quick_check(5)")]
    except sqlite3.OperationalError as err:
        if "locked" in str(err):  # a run's process still writing after 30 s: no verdict, not damage
            return
        verdict = [str(err)]
    except sqlite3.DatabaseError as err:
        verdict = [str(err)]
    if verdict != ["ok"]:
        _damaged.append(request.node.nodeid)
        pytest.fail(f"the metadata DB {METADATA_DB} was damaged during {request.node.nodeid}: {verdict}",
                    pytrace=False)


@pytest.fixture(scope="session")
def trainer_image() -> str:
    """The trainer image reference; fails (does not skip) when it is missing."""
    ref = trainer_image_ref()
    if subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode != 0:
        pytest.fail(f"trainer image {ref} is not in the Docker engine: run `make image`")
    return ref


@pytest.fixture(scope="session")
def docker_client():
    """A docker-py client of the local engine (the real one; `make test` starts it)."""
    import docker

    client = docker.from_env()
    client.ping()
    return client


@pytest.fixture
def tfpipe_home(tmp_path: Path) -> Path:
    """A fresh data/work/models tree holding the digits CSV."""
    if not DIGITS_CSV.exists():
        pytest.fail(f"{DIGITS_CSV} is missing: run `make data`")
    home = tmp_path / "home"
    (home / "data" / "digits").mkdir(parents=True)
    shutil.copy(DIGITS_CSV, home / "data" / "digits" / "digits.csv")
    yield home
    # Stage containers write as uid 1000; the tmp tree is removed by pytest as root.


def dag_command(dag_id: str, conf: dict | None, *, home: Path, image: str, extra_env: dict | None = None,
                dags_folder: Path | None = None, rerun: str | None = None,
                rerun_tasks: list[str] | None = None, only_failed: bool = False) -> tuple[list[str], dict]:
    """The `tfpipe run` command line and environment for one DAG run (or re-run)."""
    # DAG files that name no image read the Airflow Variable tfpipe_image; Airflow also takes a
    # Variable from AIRFLOW_VAR_<NAME>, which keeps each test independent of the DB's Variables.
    env = {**os.environ, "TFPIPE_HOME": str(home), "TFPIPE_IMAGE": image, "AIRFLOW_VAR_TFPIPE_IMAGE": image,
           "TFPIPE_RETRY_DELAY": "1",
           "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    # --verbose: the tests read Airflow's task log (the containers' lines) from the command's output
    cmd = [sys.executable, "-m", "tfpipe.cli", "run", dag_id, "--verbose", "--conf", json.dumps(conf or {})]
    if dags_folder:  # dag.test() syncs the configured bundle, so point Airflow at it too
        cmd += ["--dags-folder", str(dags_folder)]
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
    if rerun:
        cmd += ["--rerun", rerun]
    for task_id in rerun_tasks or []:
        cmd += ["--task", task_id]
    if only_failed:
        cmd += ["--only-failed"]
    return cmd, env


def parse_summary(stdout: str, stderr: str = "", returncode: int | None = None) -> dict:
    """The JSON summary line `tfpipe run` prints last."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"tfpipe run printed no summary (exit {returncode}):\n"
                             f"{stdout[-3000:]}\n{stderr[-6000:]}")
    return json.loads(lines[-1])


def run_dag(dag_id: str, conf: dict | None, *, timeout: int = 900, **kwargs) -> tuple[dict, str]:
    """Run one DAG run through `tfpipe run` in a fresh interpreter; return (summary, log)."""
    cmd, env = dag_command(dag_id, conf, **kwargs)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return parse_summary(proc.stdout, proc.stderr, proc.returncode), proc.stdout + proc.stderr


def write_dag(folder: Path, dag_id: str, **config) -> Path:
    """Write a test DAG file: the digits pipeline with ``config`` overrides."""
    folder.mkdir(parents=True, exist_ok=True)
    settings = {
        "data": {"path": "digits/digits.csv"},
        "training": {"model": "mlp", "epochs": 15, "batch_size": 32, "learning_rate": 0.002},
        "evaluation": {"threshold": 0.5, "tolerance": 0.5},  # tests exercise mechanics, not quality
        "export": {"model_name": dag_id},
        "retry_delay_seconds": 1,
        **config,
    }
    path = folder / f"{dag_id}.py"
    path.write_text(f'''"""Airflow DAG written by a test."""
import os
from tfpipe import PipelineConfig, training_pipeline

HOME = os.environ["TFPIPE_HOME"]
dag = training_pipeline(PipelineConfig.from_dict({{
    "dag_id": {dag_id!r},
    "image": {{"ref": os.environ["TFPIPE_IMAGE"]}},
    "volumes": {{"data": f"{{HOME}}/data", "work": f"{{HOME}}/work", "models": f"{{HOME}}/models"}},
    **{settings!r},
}}))
''')
    return path


#: Work that stays on one xdist worker (``make test`` runs the host suite on two), in the order the
#: workers take it: the deployment tests share one stack and end with ``make down``; the soak is one
#: long test; the UI tests share one run and api-server. Every other module is a unit of its own (its
#: module-scoped fixtures are built once).
_UNITS_FIRST = ("tests/deployment/", "tests/reliability/test_soak.py", "tests/ui/")
#: Then the modules that run whole DAGs or many containers, roughly longest first on the 2-core
#: VM (a few minutes each), then the other modules that start containers, then the rest, which take
#: seconds. Handing the short units out last keeps one worker from finishing minutes before the
#: other. A stale order costs time only: every unit still runs, on one worker.
_LONG_MODULES = ("tests/integration/test_resume.py", "tests/integration/test_retention.py",
                 "tests/reliability/test_faults.py", "tests/integration/test_sharded_prep.py",
                 "tests/integration/test_pipeline.py", "tests/integration/test_gcs_pipeline.py",
                 "tests/provider/test_cli_run.py", "tests/integration/test_outside_client.py")
_CONTAINER_DIRS = ("tests/integration/", "tests/reliability/")


def _work_unit(nodeid: str) -> str:
    for prefix in _UNITS_FIRST:
        if nodeid.startswith(prefix):
            return prefix.rstrip("/")
    return nodeid.split("::", 1)[0]


def _unit_rank(unit: str) -> int:
    """Where a work unit goes in the queue (lower first; equal ranks keep file order)."""
    order = [u.rstrip("/") for u in _UNITS_FIRST] + list(_LONG_MODULES)
    if unit in order:
        return order.index(unit)
    return len(order) + (0 if unit.startswith(_CONTAINER_DIRS) else 1)


def pytest_collection_modifyitems(config, items):
    """Under xdist: the units in :func:`_unit_rank` order (each worker collects, so each sorts alike)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: _unit_rank(_work_unit(item.nodeid)))  # stable: file order kept


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` by :func:`_work_unit` rather than by module or class.

    xdist's own ``loadgroup`` marks do not take under pytest 9 (it renames the node id attribute
    they rewrite), so the units are drawn here, where xdist asks for them.
    """
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

        def _reschedule(self, node) -> None:
            # xdist queues the next unit on a worker while it still has two tests to run; one of
            # them can be a minutes-long DAG run, and the queued unit then waits behind it while the
            # other worker runs out of work. A worker gets its next unit when it is on its last test
            # (it needs one test queued behind the running one to start it).
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) <= 1:
                self._assign_work_unit(node)

    return WorkUnitScheduling(config, log)
