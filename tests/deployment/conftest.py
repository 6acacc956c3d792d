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
- :class:`AirflowRest` (``deploy/rest.py``): :func:`AirflowRest.trigger`, :func:`AirflowRest.wait_for_run`,
  :func:`AirflowRest.wait_for_task`, :func:`AirflowRest.task_instances`, :func:`AirflowRest.xcom`,
  :func:`AirflowRest.task_log`: the
  REST calls the tests share.

The tests need root (a second dockerd) and the Debian packages ``deploy/stack.py`` installs; without
root they skip, saying so. ``TFPIPE_STACK_TEST_REUSE=1`` (with the ``TFPIPE_STACK_*`` settings of a
running stack) makes them use a stack that is already up instead, and leave it up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy import stack as stack_module
from deploy.rest import TERMINAL, AirflowRest  # noqa: F401  (the tests' REST client)
from tests.conftest import free_port
from tests.integration.conftest import gcs_emulator  # noqa: F401  (the session's emulator fixture)

REPO = Path(__file__).resolve().parents[2]

#: Airflow settings the test session starts the stack with (caller's AIRFLOW__* pass through).
STACK_TEST_ENV = {
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "60",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
    "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
    "TFPIPE_RETRY_DELAY": "2",
    # dockerd flags make up passes on to the GPU host's engine; a label is harmless and visible.
    "TFPIPE_STACK_ENGINE_ARGS": "--label tfpipe.stack-test=engine-args",
}



def _stack_env() -> dict[str, str]:
    engine_port = free_port()
    return {
        "TFPIPE_STACK_DIR": str(REPO / ".cache" / "stack-test"),
        "TFPIPE_STACK_API_PORT": str(free_port()),
        "TFPIPE_STACK_PG_PORT": str(free_port()),
        "TFPIPE_STACK_REDIS_PORT": str(free_port()),
        "TFPIPE_STACK_REGISTRY_PORT": str(free_port()),
        "TFPIPE_STACK_MLFLOW_PORT": str(free_port()),
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
    # What an earlier session left: `up --fresh` keeps the registry and the GPU host's data root.
    state = Path(env["TFPIPE_STACK_DIR"])
    # Any trainer image in the GPU host's kept data root: an earlier build shares every layer but
    # the code layer with this one, so this session's pull fetches next to nothing either way.
    kept = [ref for path in (state / "gpuhost" / "docker" / "image").glob("*/repositories.json")
            for refs in json.loads(path.read_text()).get("Repositories", {}).values()
            for ref in refs if "/tfpipe/trainer@sha256:" in ref]
    t0 = time.monotonic()
    up = stack_cli(env, "up", "--fresh")
    if up.returncode:
        pytest.fail(f"make up failed (exit {up.returncode}):\n{up.stderr[-6000:]}")
    handle = stack_module.Stack(env)
    #: the GPU host's kept data root already held a trainer image (an earlier session pulled this
    #: digest or an earlier build of it), so this session's pull had all or most layers at hand
    handle.layers_were_on_gpu_host = bool(kept)
    handle.env = env
    handle.up_output = up.stdout + up.stderr
    handle.up_seconds = time.monotonic() - t0
    handle.rest = AirflowRest(handle.api_url, stack_module.ADMIN_USER, handle.admin_password())
    try:
        yield handle
    finally:
        handle.down(quiet=True)


@pytest.fixture(scope="session")
def rest(stack) -> AirflowRest:
    return stack.rest
