"""tfpipe's housekeeping on a Docker engine, as a subclass of Airflow's ``DockerHook``.

The worker and the engine may be on different hosts, so everything done to the engine's disks goes
through short-lived, labelled helper containers of the trainer image, removed when done.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import IO, Any

from airflow.providers.common.compat.sdk import AirflowFailException
from airflow.providers.docker.hooks.docker import DockerHook

from tfpipe.engine_settings import DEFAULT_DOCKER_URL, EngineSettings, diagnose, engine_error_message
from tfpipe.exceptions import (
    DockerEngineRefusedError,
    DockerEngineUnreachableError,
    GpuUnavailableError,
    StageFailedError,
    TfpipeConfigError,
)

LOG = logging.getLogger(__name__)

#: Where a helper program's payload and result live inside its container.
HELPER_IN = "/tmp/tfpipe-helper-in.json"
HELPER_OUT = "/tmp/tfpipe-helper-out.json"
#: Label that says what a container is for (``stage`` containers have none).
ROLE_LABEL = "tfpipe.role"


def tar_bytes(name: str, data: bytes, *, uid: int = 0, gid: int = 0, mode: int = 0o644) -> bytes:
    """A tar archive holding one regular file ``name`` with ``data``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size, info.uid, info.gid, info.mode, info.mtime = len(data), uid, gid, mode, time.time()
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _first_file(stream: Iterator[bytes]) -> bytes | None:
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r:") as tar:
        for member in tar:
            if member.isfile():
                return tar.extractfile(member).read()  # type: ignore[union-attr]
    return None


class TfpipeDockerHook(DockerHook):
    """Airflow's ``DockerHook`` plus tfpipe's housekeeping on the engine (see the module's doc).

    :param docker_url: the Docker engine, local or remote (``unix://...``, ``tcp://host:2376``).
    :param docker_conn_id: an Airflow Docker connection (registry login), or ``None``.
    :param version: the engine API version, ``"auto"`` to negotiate it.
    :param kwargs: passed to ``DockerHook`` (``tls``, ``timeout``).
    """

    def __init__(self, *, docker_url: str = DEFAULT_DOCKER_URL, docker_conn_id: str | None = None,
                 version: str | None = "auto", **kwargs: Any) -> None:
        super().__init__(docker_conn_id=docker_conn_id, base_url=docker_url, version=version, **kwargs)
        self.docker_url = docker_url
        self._tls_config = kwargs.get("tls")

    @classmethod
    def for_task(cls, docker_url: str, task_id: str) -> TfpipeDockerHook:
        """A hook on ``docker_url`` that answered a ping (see :meth:`ping_or_raise`); the local default
        means the deployment's ``[tfpipe]`` engine and TLS files, whose errors fail ``task_id`` without retry."""
        tls = None
        if docker_url == DEFAULT_DOCKER_URL:
            try:
                engine = EngineSettings.from_airflow_config()
            except TfpipeConfigError as err:
                raise AirflowFailException(f"{task_id}: {err}") from err
            docker_url, tls = engine.docker_url, engine.tls_config()
        hook = cls(docker_url=docker_url, tls=tls)
        hook.ping_or_raise(what=task_id)
        return hook

    # -- the engine ------------------------------------------------------------------------------

    def ping_or_raise(self, what: str = "") -> Any:
        """The engine's API client once it answered; else :class:`DockerEngineUnreachableError`
        (retried) or :class:`DockerEngineRefusedError` (TLS refused), naming the real cause."""
        try:
            reused = "api_client" in self.__dict__  # DockerHook pings a client it creates: not twice
            cli = self.api_client
            if reused:
                cli.ping()
        except Exception as err:  # docker-py and the hook raise several types; all mean "not reachable"
            message, retryable = engine_error_message(self.docker_url,
                                                      diagnose(self.docker_url, self._tls_config) or err)
            error = DockerEngineUnreachableError if retryable else DockerEngineRefusedError
            raise error(f"{what}: {message}" if what else message) from err
        return cli

    def require_api(self, minimum: str, what: str) -> None:
        """Raise :class:`GpuUnavailableError` unless the engine speaks API ``minimum`` (for ``what``)."""
        from docker.utils import version_lt

        version = self.api_client.api_version
        if version_lt(version, minimum):
            raise GpuUnavailableError(
                f"{what} needs Docker API >= {minimum}; the engine at {self.docker_url} speaks {version}. "
                "Fix: upgrade Docker to 19.03 or newer.")

    # -- containers ------------------------------------------------------------------------------

    def remove_labelled(self, labels: Mapping[str, str], *, role: str | None = None, name: str | None = None,
                        keep: str | None = None, log: logging.Logger | None = None) -> int:
        """Stop and remove every container carrying all ``labels`` (and ``tfpipe.role=role``), plus
        the one named ``name``, except the one with id ``keep`` (a re-attached try's own); return
        how many. Containers of other runs or tasks are left alone."""
        cli = self.api_client
        filters = {"label": [f"{k}={v}" for k, v in labels.items()]
                   + ([f"{ROLE_LABEL}={role}"] if role else [])}
        found = {c["Id"]: c for c in cli.containers(all=True, filters=filters)}
        if name:
            for c in cli.containers(all=True, filters={"name": f"^/{name}$"}):
                found.setdefault(c["Id"], c)
        found.pop(keep or "", None)
        for cid, c in found.items():
            tags = c.get("Labels") or {}
            (log or LOG).warning(
                "removing leftover container %s (%s, try %s, state %s) of an earlier try before starting",
                (c.get("Names") or [cid[:12]])[0].lstrip("/"), tags.get(ROLE_LABEL) or tags.get("tfpipe.stage", "?"),
                tags.get("tfpipe.try_number", "?"), c.get("State"))
            cli.remove_container(cid, force=True)
        return len(found)

    def create_helper(self, *, image: str, command: Sequence[str], binds: Mapping[str, Mapping[str, str]],
                      labels: Mapping[str, str], role: str, environment: Mapping[str, str] | None = None) -> str:
        """Create (not start) a helper container: root, no network, no entrypoint; return its id.

        Root: run dirs and data sets belong to the stages' user, whichever uid that is. Binds, not
        mounts: the engine creates a missing source directory, so a fresh host needs no set-up.
        """
        cli = self.api_client
        host_config = cli.create_host_config(binds=dict(binds), network_mode="none", auto_remove=False)
        container = cli.create_container(image=image, command=list(command), user="0:0", entrypoint=[],
                                         environment=dict(environment or {}), host_config=host_config,
                                         labels={**labels, ROLE_LABEL: role})
        return container["Id"]

    def remove_quietly(self, container_id: str, log: logging.Logger | None = None) -> None:
        """Remove a container that may already be gone."""
        try:
            self.api_client.remove_container(container_id, force=True)
        except Exception as err:  # already gone
            (log or LOG).debug("container %s already gone: %s", container_id[:12], err)

    def run_helper(self, *, image: str, command: Sequence[str], binds: Mapping[str, Mapping[str, str]],
                   labels: Mapping[str, str], role: str, payload: Any = None, result: bool = False,
                   timeout: int = 600, where: str = "") -> Any:
        """Run a helper container to its end and remove it.

        ``payload`` (JSON) is copied in as :data:`HELPER_IN` before it starts; with ``result`` the
        JSON it wrote to :data:`HELPER_OUT` is returned. A non-zero exit raises
        :class:`~tfpipe.exceptions.StageFailedError` with the end of its output.
        """
        cli = self.api_client
        cid = self.create_helper(image=image, command=command, binds=binds, labels=labels, role=role)
        try:
            if payload is not None:
                cli.put_archive(cid, "/tmp", tar_bytes(HELPER_IN.rsplit("/", 1)[1], json.dumps(payload).encode()))
            cli.start(cid)
            status = cli.wait(cid, timeout=timeout).get("StatusCode")
            if status != 0:
                out = cli.logs(cid).decode("utf-8", "replace")[-4000:]
                raise StageFailedError(f"a helper container ({role}) on the engine failed (exit {status})"
                                       f"{' working in ' + where if where else ''}:\n{out}", exit_code=status)
            if not result:
                return None
            stream, _ = cli.get_archive(cid, HELPER_OUT)
            return json.loads(_first_file(stream) or b"null")
        finally:
            self.remove_quietly(cid)


@dataclass
class VolumeHelper:
    """Files into and out of one host directory on the engine, mounted at ``mount_point``.

    Use as a context manager: the archive container (created, never started) is removed on leaving.

    :param hook: the engine's :class:`TfpipeDockerHook`.
    :param image: the trainer image (it has ``python3``; no other image needs pulling).
    :param host_path: the directory on the engine's host; the engine creates it when missing.
    :param mount_point: where the helpers see it.
    :param read_only: mount it read-only (reading an exported model out).
    :param labels: ``tfpipe.*`` labels of the task; ``tfpipe.role`` is added.
    :param role: the helper's role label, e.g. ``"gcs-stage-in"``.
    """

    hook: TfpipeDockerHook
    _: KW_ONLY
    image: str
    host_path: str
    mount_point: str = "/vol"
    read_only: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    role: str = "volume-helper"
    log: logging.Logger = LOG
    _archive_id: str | None = field(default=None, init=False)
    _entered: bool = field(default=False, init=False)

    @property
    def _binds(self) -> dict[str, dict[str, str]]:
        return {self.host_path: {"bind": self.mount_point, "mode": "ro" if self.read_only else "rw"}}

    def __enter__(self) -> VolumeHelper:
        self._entered = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._archive_id:
            self.hook.remove_quietly(self._archive_id, self.log)
            self._archive_id = None
        self._entered = False

    def _archive_container(self) -> str:
        if not self._entered:
            raise RuntimeError("use VolumeHelper as a context manager")
        if not self._archive_id:
            self._archive_id = self.hook.create_helper(image=self.image, command=["true"], binds=self._binds,
                                                       labels=self.labels, role=self.role)
        return self._archive_id

    # -- archives -------------------------------------------------------------------------------

    def put_archive(self, path: str, data: bytes | IO[bytes]) -> None:
        """Extract the tar ``data`` (bytes or a binary file, streamed) into ``path`` (must exist)."""
        if not self.hook.api_client.put_archive(self._archive_container(), path, data):
            raise StageFailedError(f"the Docker engine refused to extract an archive into {path} "
                                   f"({self.host_path} on the engine's host)", exit_code=None)

    def get_archive(self, path: str) -> Iterator[bytes] | None:
        """The tar stream of ``path`` (file or directory), or ``None`` when it does not exist."""
        from docker.errors import NotFound

        try:
            stream, _stat = self.hook.api_client.get_archive(self._archive_container(), path, chunk_size=1 << 20)
        except NotFound:
            return None
        return stream

    def read_file(self, path: str) -> bytes | None:
        """The bytes of one (small) file, or ``None`` when it does not exist."""
        stream = self.get_archive(path)
        return None if stream is None else _first_file(stream)

    # -- programs -------------------------------------------------------------------------------

    def run_program(self, program: str, payload: Mapping[str, Any], *, timeout: int = 600) -> Any:
        """Run ``python3 -m trainer.volume_ops <program>`` next to the files; return its result.

        Payload and result travel as files, so their size is not limited and any logging driver works.
        """
        return self.hook.run_helper(
            image=self.image, command=["python3", "-m", "trainer.volume_ops", program, HELPER_IN, HELPER_OUT],
            binds=self._binds, labels=self.labels, role=self.role, payload=dict(payload), result=True,
            timeout=timeout, where=self.host_path)
