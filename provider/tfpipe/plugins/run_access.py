"""The api-server's way to a run's files and TensorBoard: through the Docker engine, never a host path.

The api-server's host need not see the engine's volumes. Report files are read with ``GET /archive``
on a never-started helper container; TensorBoard runs in a container without network, reached with
``docker exec``, so a TLS-protected remote engine needs no published port. Idle TensorBoards go after
``TFPIPE_TENSORBOARD_IDLE_S`` (1800) seconds; at most ``TFPIPE_TENSORBOARD_MAX`` (4) run, least recently used out first.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfpipe import contract
from tfpipe.plugins.paths import REPORT_FILES

LOG = logging.getLogger(__name__)

REPORT_READER_ROLE = "report-reader"
TENSORBOARD_ROLE = "ui-tensorboard"
TENSORBOARD_PORT = 6006
#: Seconds to wait for a new TensorBoard to answer (it imports TensorFlow and reads the event files).
TENSORBOARD_START_TIMEOUT_S = 300
_IDLE_ENV, _MAX_ENV = "TFPIPE_TENSORBOARD_IDLE_S", "TFPIPE_TENSORBOARD_MAX"


def engine_tls(docker_url: str) -> Any:
    """The TLS config for ``docker_url``: the deployment's ``[tfpipe]`` TLS files when it names that engine
    (a location record names the engine by URL only; client keys never go into the metadata DB)."""
    from tfpipe.engine_settings import EngineSettings

    engine = EngineSettings.from_airflow_config()
    return engine.tls_config() if engine.uses_tls and engine.docker_url == docker_url else None


def api_client(docker_url: str) -> Any:
    """A docker-py ``APIClient`` of the engine that ran the stages (over TLS where the deployment uses it)."""
    import docker

    return docker.APIClient(base_url=docker_url, version="auto", timeout=120, tls=engine_tls(docker_url) or False)


def read_run_file(location: Mapping[str, str], dag_id: str, run_id: str, name: str) -> bytes | None:
    """The bytes of report file ``name`` (one of :data:`~tfpipe.plugins.paths.REPORT_FILES`) of the run, or ``None``."""
    if name not in REPORT_FILES:
        raise ValueError(f"name: {name!r} is not a report file. Fix: one of {', '.join(REPORT_FILES)}")
    from tfpipe.hooks.docker import TfpipeDockerHook, VolumeHelper

    hook = TfpipeDockerHook(docker_url=location["docker_url"], tls=engine_tls(location["docker_url"]))
    try:
        with VolumeHelper(hook, image=location["image"], host_path=location["work"], mount_point=contract.CONTAINER_WORK,
                         read_only=True, labels={"tfpipe.dag_id": dag_id, "tfpipe.run_id": run_id},
                         role=REPORT_READER_ROLE) as helper:
            return helper.read_file(f"{contract.run_dir(dag_id, run_id)}/{name}")
    finally:
        hook.api_client.close()


# --- TensorBoard on demand -----------------------------------------------------------------------

# Runs inside the TensorBoard container for each forwarded request (Python 3.8, standard library):
# it writes one JSON line (status, headers) and then the body to stdout.
_FETCH = r"""
import base64, json, os, sys, urllib.error, urllib.request
body = base64.b64decode(os.environ.get("TB_BODY", "")) or None
req = urllib.request.Request(os.environ["TB_URL"], data=body, method=os.environ.get("TB_METHOD", "GET"))
if os.environ.get("TB_CTYPE"):
    req.add_header("Content-Type", os.environ["TB_CTYPE"])
try:
    resp = urllib.request.urlopen(req, timeout=60)
except urllib.error.HTTPError as err:
    resp = err
except OSError as err:
    sys.stdout.write(json.dumps({"status": 0, "error": str(err)}) + "\n")
    sys.exit(0)
data = resp.read()
kept = ("content-type", "content-encoding", "cache-control", "etag", "last-modified", "location")
headers = {k: v for k, v in resp.headers.items() if k.lower() in kept}
sys.stdout.write(json.dumps({"status": resp.status if hasattr(resp, "status") else resp.code, "headers": headers}) + "\n")
sys.stdout.flush()
sys.stdout.buffer.write(data)
"""


@dataclass(frozen=True)
class Forwarded:
    """One response of TensorBoard, as the container's fetch returned it."""

    status: int
    headers: dict[str, str]
    body: bytes


def tensorboard_container_name(dag_id: str, run_id: str) -> str:
    """One deterministic name per run and engine: concurrent requests find the same container."""
    digest = hashlib.sha1(f"{dag_id}\0{run_id}".encode()).hexdigest()[:12]
    return f"tfpipe-tb-{contract.safe_name(dag_id, 30)}-{digest}"


def _env_number(name: str, default: str, kind: type, example: str) -> Any:
    """The api-server's setting ``name`` as ``kind``; a value that is not one names the variable."""
    from tfpipe.config import TfpipeConfigError

    text = os.environ.get(name, default)
    try:
        return kind(text)
    except ValueError:
        raise TfpipeConfigError(f"{name}={text!r} is not {example}. Fix: set {name} to {example} in the "
                                "api-server's environment, or unset it") from None


class TensorBoards:
    """On-demand TensorBoard containers, one per run, reached only through the engine API."""

    def __init__(self, role: str = TENSORBOARD_ROLE) -> None:
        #: the ``tfpipe.role`` label of the containers this instance starts, finds and evicts
        self.role = role
        self._lock = threading.Lock()
        self._last_used: dict[tuple[str, str], float] = {}

    @staticmethod
    def idle_seconds() -> float:
        """``TFPIPE_TENSORBOARD_IDLE_S``: a TensorBoard unused this long is removed (default 1800)."""
        return _env_number(_IDLE_ENV, "1800", float, "a number of seconds such as 1800")

    @staticmethod
    def max_running() -> int:
        """``TFPIPE_TENSORBOARD_MAX``: TensorBoards kept per engine (default 4; 0 counts as 1)."""
        return max(1, _env_number(_MAX_ENV, "4", int, "a whole number of containers such as 4"))

    def _ensure(self, cli: Any, location: Mapping[str, str], dag_id: str, run_id: str) -> str:
        name = tensorboard_container_name(dag_id, run_id)
        found = cli.containers(all=True, filters={"name": f"^/{name}$"})
        if found and found[0].get("State") == "running":
            return found[0]["Id"]
        if found and found[0].get("State") == "created":
            # Another api-server process (or server) created it and is about to start it: removing
            # it here would make that start fail. Starting a started container is a no-op.
            cli.start(found[0]["Id"])
            return found[0]["Id"]
        for container in found:  # exited or dead: start afresh
            cli.remove_container(container["Id"], force=True)
        self.evict(cli, keep=self.max_running() - 1)
        run_dir = contract.run_dir(dag_id, run_id)
        logdir = f"{run_dir}/train/tensorboard"
        host_config = cli.create_host_config(
            binds={location["work"]: {"bind": contract.CONTAINER_WORK, "mode": "ro"}},
            network_mode="none", auto_remove=False,
        )
        from docker.errors import APIError

        try:
            created = cli.create_container(
                image=location["image"], name=name, entrypoint=[], user="65534:65534",
                environment={"HOME": "/tmp"}, host_config=host_config,
                labels={"tfpipe.role": self.role, "tfpipe.tensorboard": f"{dag_id}/{run_id}"},
                command=["tensorboard", "--logdir", logdir, "--host", "127.0.0.1",
                         "--port", str(TENSORBOARD_PORT)],
            )
        except APIError as err:
            if err.status_code != 409:  # 409: a concurrent request created it first
                raise
            return self._ensure(cli, location, dag_id, run_id)
        cli.start(created["Id"])
        return created["Id"]

    def mark_used(self, dag_id: str, run_id: str, at: float | None = None) -> None:
        """Record a request for the run's TensorBoard (eviction removes the least recently used)."""
        self._last_used[(dag_id, run_id)] = time.time() if at is None else at

    def evict(self, cli: Any, keep: int) -> None:
        """Remove idle TensorBoards, then the least recently used ones beyond ``keep``."""
        running = cli.containers(all=True, filters={"label": f"tfpipe.role={self.role}"})
        now = time.time()
        idle = self.idle_seconds()

        def last_used(c: Mapping[str, Any]) -> float:
            key = tuple((c.get("Labels") or {}).get("tfpipe.tensorboard", "/").split("/", 1))
            return self._last_used.get(key, float(c.get("Created") or 0))  # type: ignore[arg-type]

        ordered = sorted(running, key=last_used)
        for index, container in enumerate(ordered):
            if now - last_used(container) > idle or len(ordered) - index > keep:
                LOG.info("removing TensorBoard container %s", (container.get("Names") or ["?"])[0])
                cli.remove_container(container["Id"], force=True)

    def forward(self, location: Mapping[str, str], dag_id: str, run_id: str, path: str,
                *, method: str = "GET", query: str = "", body: bytes = b"", content_type: str = "") -> Forwarded:
        """Forward one request to the run's TensorBoard, starting it first when none runs."""
        cli = api_client(location["docker_url"])
        try:
            with self._lock:
                cid = self._ensure(cli, location, dag_id, run_id)
                self.mark_used(dag_id, run_id)
            # TensorBoard's page uses relative URLs, so it needs no --path_prefix behind this route.
            url = f"http://127.0.0.1:{TENSORBOARD_PORT}/{path.lstrip('/')}"
            if query:
                url += "?" + query
            env = {"TB_URL": url, "TB_METHOD": method, "TB_BODY": base64.b64encode(body).decode(),
                   "TB_CTYPE": content_type}
            deadline = time.monotonic() + TENSORBOARD_START_TIMEOUT_S
            while True:
                answer = self._fetch(cli, cid, env)
                if answer.status or time.monotonic() > deadline:
                    return answer
                time.sleep(1)  # TensorBoard is still starting: nothing listens yet
        finally:
            cli.close()

    @staticmethod
    def _fetch(cli: Any, cid: str, env: Mapping[str, str]) -> Forwarded:
        exec_id = cli.exec_create(cid, ["python3", "-c", _FETCH], environment=dict(env), stdout=True,
                                  stderr=True, user="65534:65534")
        out, err = cli.exec_start(exec_id, demux=True)
        out = out or b""
        head, _, body = out.partition(b"\n")
        try:
            meta = json.loads(head or b"{}")
        except ValueError:
            meta = {}
        if "status" not in meta:
            detail = (err or b"").decode("utf-8", "replace")[-2000:]
            state = cli.inspect_container(cid).get("State", {})
            if not state.get("Running"):
                logs = cli.logs(cid, tail=30).decode("utf-8", "replace")
                raise RuntimeError(f"TensorBoard exited ({state.get('ExitCode')}):\n{logs}")
            raise RuntimeError(f"forwarding to TensorBoard failed: {detail}")
        return Forwarded(int(meta["status"]), dict(meta.get("headers") or {}), body)

    def stop_all(self, docker_url: str) -> int:
        """Remove every TensorBoard container of this kind on the engine; return how many."""
        cli = api_client(docker_url)
        try:
            found = cli.containers(all=True, filters={"label": f"tfpipe.role={self.role}"})
            for container in found:
                cli.remove_container(container["Id"], force=True)
            return len(found)
        finally:
            cli.close()
