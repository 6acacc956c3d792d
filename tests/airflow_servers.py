"""Airflow's own servers for tests: each command in its own process group on loopback, stopped by that group.

Used by the tests that need the api-server (the plugin, the REST API) or a scheduler with its DAG
processor, each on a metadata DB of its own (:func:`release_home`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path


from tests.conftest import DIGITS_CSV, REPO, copy_sqlite_db, free_port, stop_group, wait_until_answers, write_dag

#: A test DAG's settings for a run of about a minute whose model is blessed (and so exported).
QUICK_BLESSED = {"training": {"model": "mlp", "epochs": 3, "batch_size": 64},
                 "evaluation": {"threshold": 0.5, "tolerance": 1.0}}
#: The simple auth manager's users' passwords (which users exist and their roles: each test's settings).
PASSWORDS = {"admin": "admin-pw", "mlviewer": "mlviewer-pw", "outsider": "outsider-pw"}
#: The team that owns the test DAG folder's bundle in multi-team mode, and another one (team names
#: have 3 to 50 characters). ``mlviewer`` is a viewer in the first, ``outsider`` in the second.
TEAM, OTHER_TEAM = "mlteam", "other"
#: The users of a multi-team home: the simple auth manager limits per DAG only through teams (its
#: roles alone apply to every DAG).
TEAM_USERS = f"admin:admin,mlviewer:viewer:{TEAM},outsider:viewer:{OTHER_TEAM}"


def has_multi_team() -> bool:
    """Whether this Airflow has multi-team mode (``[core] multi_team`` and ``airflow teams``: 3.2 on)."""
    from airflow.configuration import conf

    return conf.has_option("core", "multi_team")


def multi_team_settings(dags: Path) -> dict[str, str]:
    """Airflow settings for multi-team mode, the DAG folder ``dags`` a bundle owned by :data:`TEAM`."""
    bundles = [{"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                "kwargs": {"path": str(dags)}, "team_name": TEAM}]
    return {"AIRFLOW__CORE__MULTI_TEAM": "True",
            "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundles),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": TEAM_USERS}


def create_teams(env: dict) -> None:
    """``airflow teams create`` of both teams, at once, in the metadata DB that ``env`` names: the
    auth manager refuses to start while a user's team is not there."""
    airflow = str(Path(sys.executable).parent / "airflow")
    creating = [subprocess.Popen([airflow, "teams", "create", team], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, cwd=REPO) for team in (TEAM, OTHER_TEAM)]
    for proc in creating:
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"airflow teams create failed:\n{out[-3000:]}"


def release_home(root: Path, dag_id: str, users: str, *, local_data: bool = True,
                 **dag_config) -> tuple[Path, Path, dict[str, str]]:
    """``(TFPIPE_HOME, DAG folder, Airflow settings)`` under ``root``: a copy of this worker's migrated
    metadata DB (tests/conftest.py makes it, for the Airflow release under test), the digits CSV on
    the data volume (unless ``local_data`` is false: a run then stages it in), one test DAG written
    with ``dag_config``, and the simple auth manager with ``users``."""
    airflow_home, home, dags = root / "airflow", root / "home", root / "dags"
    airflow_home.mkdir()
    copy_sqlite_db(Path(os.environ["AIRFLOW_HOME"]) / "airflow.db", airflow_home / "airflow.db")
    (home / "data" / "digits").mkdir(parents=True)
    if local_data:
        shutil.copy(DIGITS_CSV, home / "data" / "digits" / "digits.csv")
    write_dag(dags, dag_id, **dag_config)
    passwords = airflow_home / "passwords.json"
    passwords.write_text(json.dumps(PASSWORDS))
    return home, dags, {
        "AIRFLOW_HOME": str(airflow_home),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{airflow_home / 'airflow.db'}",
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": users,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
    }


class AirflowProcess:
    """``airflow <args>`` of this interpreter's Airflow, in its own process group, output in ``log_path``."""

    def __init__(self, args: list[str], env: dict, log_path: Path) -> None:
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([str(Path(sys.executable).parent / "airflow"), *args], env=env, cwd=REPO,
                                     stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        """Stop the whole group (the command's own children too)."""
        stop_group(self.proc, timeout=30)
        self._log.close()


class ApiServer(AirflowProcess):
    """``airflow api-server`` on a free loopback port; returns once it answers its health check."""

    def __init__(self, env: dict, log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        super().__init__(["api-server", "--host", "127.0.0.1", "--port", str(self.port)], env, log_path)
        wait_until_answers(f"{self.url}/api/v2/monitor/health", self.proc, log_path, seconds=120,
                           what="the api-server")

    def token(self, user: str) -> str:
        body = json.dumps({"username": user, "password": PASSWORDS[user]}).encode()
        req = urllib.request.Request(f"{self.url}/auth/token", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())["access_token"]

    def get(self, path: str, *, user: str | None = None, headers: dict | None = None,
            timeout: int = 360) -> tuple[int, dict, bytes]:
        """``GET path`` as ``user`` (None: no credentials); redirects are not followed."""
        headers = dict(headers or {})
        if user:
            headers["Authorization"] = f"Bearer {self.token(user)}"

        class NoRedirect(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None

        opener = urllib.request.build_opener(NoRedirect)
        try:
            with opener.open(urllib.request.Request(self.url + path, headers=headers), timeout=timeout) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def call(self, method: str, path: str, body: dict, *, user: str = "admin") -> dict:
        """``method path`` with a JSON body as ``user``; the JSON answer (an HTTP error raises)."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/json",
                                              "Authorization": f"Bearer {self.token(user)}"})
        with urllib.request.urlopen(req, timeout=60) as resp:
            return json.loads(resp.read())


def remove_tensorboards(dag_id: str, run_id: str) -> None:
    """Remove the TensorBoard containers the plugin started on the local engine for one run."""
    from tfpipe.plugins.run_access import TENSORBOARD_ROLE, api_client

    cli = api_client("unix://var/run/docker.sock")
    try:
        for c in cli.containers(all=True, filters={"label": [f"tfpipe.role={TENSORBOARD_ROLE}",
                                                             f"tfpipe.tensorboard={dag_id}/{run_id}"]}):
            cli.remove_container(c["Id"], force=True)
    finally:
        cli.close()
