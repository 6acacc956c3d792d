"""Fixtures for the deployment tests: ``make up``'s stack, once for the whole session.

What a deployment test can use:

- ``stack`` (session): brings the stack up once (``deploy/stack.py up --fresh`` on free loopback
  ports, its own bridge, state in ``.cache/stack-test``) and down at the end of the session. It is
  a :class:`deploy.stack.Stack` (``pid(name)``, ``stop(name, sig)``, ``start_engine()``,
  ``start_worker(n)``, ``engine_docker(...)``, ``volumes``, ``logs``) with ``rest`` added.
  ``STACK_TEST_ENV`` holds the Airflow settings the session starts it with (short heartbeat
  timeouts, so a killed worker's task is noticed in seconds); edit it in a conftest that runs first
  if a test needs others.
- ``rest`` (session): an :class:`AirflowRest` client of the stack's REST API v2, logged in as admin.
- :func:`AirflowRest.trigger`, :func:`AirflowRest.wait_for_run`, :func:`AirflowRest.wait_for_task`,
  :func:`AirflowRest.task_instances`, :func:`AirflowRest.xcom`, :func:`AirflowRest.task_log`: the
  REST calls the tests share.

The tests need root (a second dockerd) and the Debian packages ``deploy/stack.py`` installs; without
root they skip, saying so. ``TFPIPE_STACK_TEST_REUSE=1`` (with the ``TFPIPE_STACK_*`` settings of a
running stack) makes them use a stack that is already up instead, and leave it up.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "deploy"))

import stack as stack_module  # noqa: E402  (deploy/ is not a package)

#: Airflow settings the test session starts the stack with (caller's AIRFLOW__* pass through).
STACK_TEST_ENV = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
    "TFPIPE_RETRY_DELAY": "2",
}
TERMINAL = {"success", "failed"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AirflowRest:
    """A small client of Airflow's REST API v2 (JWT from ``/auth/token``, refreshed on 401)."""

    def __init__(self, base_url: str, user: str, password: str) -> None:
        self.base = base_url.rstrip("/")
        self.user, self.password = user, password
        self.session = requests.Session()
        self._login()

    def _login(self) -> None:
        resp = requests.post(f"{self.base}/auth/token", json={"username": self.user, "password": self.password},
                             timeout=30)
        resp.raise_for_status()
        self.session.headers["Authorization"] = f"Bearer {resp.json()['access_token']}"

    def request(self, method: str, path: str, *, ok: tuple[int, ...] = (200, 201, 204), **kw: Any) -> Any:
        url = f"{self.base}/api/v2/{path.lstrip('/')}"
        resp = self.session.request(method, url, timeout=60, **kw)
        if resp.status_code == 401:
            self._login()
            resp = self.session.request(method, url, timeout=60, **kw)
        if resp.status_code not in ok:
            raise AssertionError(f"{method} {path}: {resp.status_code} {resp.text[:2000]}")
        ctype = resp.headers.get("content-type", "")
        return resp.json() if "json" in ctype else resp.text

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> dict:
        """Wait until the dag-processor has parsed ``dag_id`` (the stack parses DAG files continuously)."""
        deadline = time.monotonic() + timeout
        while True:
            resp = self.session.get(f"{self.base}/api/v2/dags/{dag_id}", timeout=30)
            if resp.status_code == 200:
                return resp.json()
            if time.monotonic() > deadline:
                errors = self.get("importErrors")
                raise AssertionError(f"DAG {dag_id} not parsed within {timeout:.0f} s; import errors: {errors}")
            time.sleep(2)

    def unpause(self, dag_id: str, paused: bool = False) -> None:
        self.wait_for_dag(dag_id)
        self.request("PATCH", f"dags/{dag_id}", json={"is_paused": paused})

    def trigger(self, dag_id: str, conf: dict | None = None, run_id: str | None = None) -> str:
        """Unpause ``dag_id`` and create a run with ``conf``; returns the run id."""
        self.unpause(dag_id)
        run_id = run_id or f"stack-{uuid.uuid4().hex[:10]}"
        body = {"dag_run_id": run_id, "logical_date": None, "conf": conf or {}}
        return self.request("POST", f"dags/{dag_id}/dagRuns", json=body)["dag_run_id"]

    def run(self, dag_id: str, run_id: str) -> dict:
        return self.get(f"dags/{dag_id}/dagRuns/{run_id}")

    def wait_for_run(self, dag_id: str, run_id: str, states=TERMINAL, timeout: float = 600) -> dict:
        """Poll the run until its state is in ``states``; fail with the task states on timeout."""
        deadline = time.monotonic() + timeout
        while True:
            run = self.run(dag_id, run_id)
            if run["state"] in states:
                return run
            if time.monotonic() > deadline:
                tis = {t["task_id"]: (t["state"], t["try_number"]) for t in self.task_instances(dag_id, run_id)}
                raise AssertionError(f"{dag_id}/{run_id} still {run['state']} after {timeout:.0f} s: {tis}")
            time.sleep(2)

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.get(f"dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> dict:
        return self.get(f"dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}")

    def wait_for_task(self, dag_id: str, run_id: str, task_id: str, states, timeout: float = 600) -> dict:
        """Poll one task instance until its state is in ``states``."""
        deadline = time.monotonic() + timeout
        while True:
            ti = self.task_instance(dag_id, run_id, task_id)
            if ti["state"] in states:
                return ti
            if time.monotonic() > deadline:
                raise AssertionError(f"{dag_id}/{run_id}/{task_id} still {ti['state']} after {timeout:.0f} s")
            time.sleep(1)

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        path = f"dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
        return self.get(path, params={"deserialize": "true"})["value"]

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> str:
        path = f"dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        data = self.get(path, params={"full_content": "true"}, headers={"Accept": "application/json"})
        content = data.get("content") if isinstance(data, dict) else data
        if not isinstance(content, list):
            return str(content)
        lines = []
        for entry in content:
            if not isinstance(entry, dict):
                lines.append(str(entry))
                continue
            lines.append(str(entry.get("event", "")))
            # A task's exception is structured, not part of the event text.
            for err in entry.get("error_detail") or []:
                lines.append(f"{err.get('exc_type')}: {err.get('exc_value')}")
        return "\n".join(lines)


def _stack_env() -> dict[str, str]:
    engine_port = free_port()
    return {
        "TFPIPE_STACK_DIR": str(REPO / ".cache" / "stack-test"),
        "TFPIPE_STACK_API_PORT": str(free_port()),
        "TFPIPE_STACK_PG_PORT": str(free_port()),
        "TFPIPE_STACK_REDIS_PORT": str(free_port()),
        "TFPIPE_STACK_REGISTRY_PORT": str(free_port()),
        "TFPIPE_STACK_ENGINE_PORT": str(engine_port),
        # Its own bridge and subnet, so a user's `make up` and this session can coexist.
        "TFPIPE_STACK_BRIDGE": f"tfpt{engine_port}",
        "TFPIPE_STACK_SUBNET": f"10.214.{engine_port % 250}.1/24",
        "TFPIPE_STACK_EXTRA_DAGS": str(Path(__file__).parent / "dags"),
        **STACK_TEST_ENV,
    }


def stack_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """Run ``deploy/stack.py ARGS`` (what ``make up/down/status`` run) with the session's settings."""
    return subprocess.run([sys.executable, str(REPO / "deploy" / "stack.py"), *args], env=env,
                          capture_output=True, text=True)


@pytest.fixture(scope="session")
def stack():
    """``make up``'s stack for this session (see the module docstring); ``make down`` at the end."""
    if os.geteuid() != 0:
        pytest.skip("the deployment tests start a second dockerd and PostgreSQL as its user: they need root")
    if os.environ.get("TFPIPE_STACK_TEST_REUSE"):
        # Developing a test: use the stack already up at TFPIPE_STACK_DIR (settings from the environment).
        handle = stack_module.Stack(dict(os.environ))
        handle.env = dict(os.environ)
        handle.rest = AirflowRest(handle.api_url, stack_module.ADMIN_USER, handle.admin_password())
        yield handle
        return
    env = {**os.environ, **_stack_env()}
    t0 = time.monotonic()
    up = stack_cli(env, "up", "--fresh")
    if up.returncode:
        pytest.fail(f"make up failed (exit {up.returncode}):\n{up.stderr[-6000:]}")
    handle = stack_module.Stack(env)
    handle.env = env
    handle.up_seconds = time.monotonic() - t0
    handle.rest = AirflowRest(handle.api_url, stack_module.ADMIN_USER, handle.admin_password())
    try:
        yield handle
    finally:
        handle.down(quiet=True)


@pytest.fixture(scope="session")
def rest(stack) -> AirflowRest:
    return stack.rest
