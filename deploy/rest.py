"""A small client of Airflow's REST API v2, for the deployment tests and the bench (stdlib + requests)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import requests

TERMINAL = {"success", "failed"}


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
        # A DELETE answers 204 with a JSON content type and no body.
        return resp.json() if "json" in ctype and resp.content else resp.text

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
