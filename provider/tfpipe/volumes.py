"""Files into and out of a volume directory **through the Docker engine**.

The Airflow worker and the Docker engine may be on different hosts, so the worker never opens a
volume's host directory itself. A :class:`VolumeHelper` instead works from short-lived helper
containers of the trainer image on the engine, each bind-mounting the one host directory:

- :meth:`VolumeHelper.put_archive` streams a tar archive into the volume (``PUT /archive``);
- :meth:`VolumeHelper.get_archive` streams a file or directory out as a tar (``GET /archive``);
- :meth:`VolumeHelper.run_python` runs a small Python script next to the files (listing,
  deleting) and returns the JSON it wrote.

Archives go through one created, never started container (the engine mounts its binds for archive
operations, and creates a missing bind source); scripts run in their own container as root with no network. Every container carries
``tfpipe.*`` labels and a ``tfpipe.role``, is removed when done, and :func:`remove_leftovers`
removes those a killed worker left behind. The same pattern prepares stage directories in
:meth:`tfpipe.operators.TfpipeStageOperator._prepare_dirs`.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
import time
from collections.abc import Iterator, Mapping
from typing import IO, Any

from tfpipe.exceptions import StageFailedError

LOG = logging.getLogger(__name__)

_SCRIPT_IN = "/tmp/tfpipe-helper-in.json"
_SCRIPT_OUT = "/tmp/tfpipe-helper-out.json"
_SCRIPT_PRELUDE = f"""
import json, os, sys
with open({_SCRIPT_IN!r}) as _f:
    payload = json.load(_f)
def finish(result):
    with open({_SCRIPT_OUT!r}, "w") as _f:
        json.dump(result, _f)
"""


def remove_leftovers(cli: Any, labels: Mapping[str, str], role: str, log: logging.Logger | None = None) -> int:
    """Remove helper containers of ``role`` that carry ``labels`` (an earlier try's); return how many."""
    filters = {"label": [f"{k}={v}" for k, v in labels.items()] + [f"tfpipe.role={role}"]}
    removed = 0
    for container in cli.containers(all=True, filters=filters):
        (log or LOG).warning("removing leftover helper container %s (%s) of an earlier try",
                             container["Id"][:12], container.get("State"))
        cli.remove_container(container["Id"], force=True)
        removed += 1
    return removed


def tar_bytes(name: str, data: bytes, *, uid: int = 0, gid: int = 0, mode: int = 0o644) -> bytes:
    """A tar archive holding one regular file ``name`` with ``data``."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size, info.uid, info.gid, info.mode, info.mtime = len(data), uid, gid, mode, time.time()
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class VolumeHelper:
    """Helper containers on the Docker engine for one host directory, mounted at ``mount_point``.

    Use as a context manager: the archive container is created on first use and removed on leaving.

    :param cli: a docker-py ``APIClient`` of the engine (e.g. ``DockerHook(...).api_client``).
    :param image: the trainer image (it has ``python3``; no other image needs pulling).
    :param host_path: the directory on the engine's host; the engine creates it when missing.
    :param mount_point: where the helpers see it.
    :param read_only: mount it read-only (reading an exported model out).
    :param labels: ``tfpipe.*`` labels of the task; ``tfpipe.role`` is added.
    :param role: the helper's role label, e.g. ``"gcs-stage-in"``.
    """

    def __init__(self, cli: Any, *, image: str, host_path: str, mount_point: str = "/vol",
                 read_only: bool = False, labels: Mapping[str, str] | None = None, role: str = "volume-helper",
                 log: logging.Logger | None = None) -> None:
        self.cli = cli
        self.image = image
        self.host_path = host_path
        self.mount_point = mount_point
        self.read_only = read_only
        self.labels = {**(labels or {}), "tfpipe.role": role}
        self.log = log or LOG
        self._archive_id: str | None = None
        self._entered = False

    # -- containers -----------------------------------------------------------------------------

    def _create(self, command: list[str]) -> str:
        host_config = self.cli.create_host_config(
            binds={self.host_path: {"bind": self.mount_point, "mode": "ro" if self.read_only else "rw"}},
            network_mode="none", auto_remove=False,
        )
        container = self.cli.create_container(image=self.image, command=command, user="0:0", entrypoint=[],
                                              host_config=host_config, labels=dict(self.labels))
        return container["Id"]

    def __enter__(self) -> VolumeHelper:
        self._entered = True
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._archive_id:
            try:
                self.cli.remove_container(self._archive_id, force=True)
            except Exception as err:  # already gone
                self.log.debug("helper %s already gone: %s", self._archive_id[:12], err)
            self._archive_id = None
        self._entered = False

    def _require(self) -> str:
        if not self._entered:
            raise RuntimeError("use VolumeHelper as a context manager")
        if not self._archive_id:
            self._archive_id = self._create(["true"])
        return self._archive_id

    # -- archives -------------------------------------------------------------------------------

    def put_archive(self, path: str, data: bytes | IO[bytes]) -> None:
        """Extract the tar ``data`` (bytes or a binary file, streamed) into ``path`` (must exist)."""
        if not self.cli.put_archive(self._require(), path, data):
            raise StageFailedError(f"the Docker engine refused to extract an archive into {path} "
                                   f"({self.host_path} on the engine's host)", exit_code=None)

    def get_archive(self, path: str) -> Iterator[bytes] | None:
        """The tar stream of ``path`` (file or directory), or ``None`` when it does not exist."""
        from docker.errors import NotFound

        try:
            stream, _stat = self.cli.get_archive(self._require(), path, chunk_size=1 << 20)
        except NotFound:
            return None
        return stream

    def read_file(self, path: str) -> bytes | None:
        """The bytes of one (small) file, or ``None`` when it does not exist."""
        stream = self.get_archive(path)
        if stream is None:
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r:") as tar:
            for member in tar:
                if member.isfile():
                    return tar.extractfile(member).read()  # type: ignore[union-attr]
        return None

    # -- scripts --------------------------------------------------------------------------------

    def run_python(self, script: str, payload: Mapping[str, Any], *, timeout: int = 600) -> Any:
        """Run ``script`` (Python 3.8, standard library) in a helper container and return its result.

        The script sees ``payload`` as the variable ``payload`` and reports with ``finish(result)``
        (JSON). Payload and result travel as files in the container, not as arguments or logs,
        so their size is not limited and any logging driver works.
        """
        cid = self._create(["python3", "-c", _SCRIPT_PRELUDE + script])
        try:
            self.cli.put_archive(cid, "/tmp", tar_bytes(_SCRIPT_IN.rsplit("/", 1)[1],
                                                        json.dumps(payload).encode()))
            self.cli.start(cid)
            status = self.cli.wait(cid, timeout=timeout).get("StatusCode")
            if status != 0:
                out = self.cli.logs(cid).decode("utf-8", "replace")[-4000:]
                raise StageFailedError(f"a helper container on the engine failed (exit {status}) working in "
                                       f"{self.host_path}:\n{out}", exit_code=status)
            stream, _ = self.cli.get_archive(cid, _SCRIPT_OUT)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream)), mode="r:") as tar:
                member = tar.next()
                return json.loads(tar.extractfile(member).read())  # type: ignore[arg-type, union-attr]
        finally:
            try:
                self.cli.remove_container(cid, force=True)
            except Exception as err:  # already gone
                self.log.debug("helper %s already gone: %s", cid[:12], err)
