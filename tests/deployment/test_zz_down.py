"""(10) ``make down`` leaves no process, container, mount, bridge or open port behind.

Named to sort last: pytest runs a directory's modules in name order, and this test ends the
session's stack (the session fixture's own ``down`` then finds nothing to do).
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from tests.deployment.conftest import stack_cli

pytestmark = [pytest.mark.integration, pytest.mark.deployment]


def _open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_make_down_leaves_nothing_behind(stack):
    names = stack.names()
    assert {"postgres", "redis", "registry", "engine", "api-server", "scheduler", "worker1", "worker2"} <= set(names)
    pids = {name: stack.pid(name) for name in names}
    # A running and an exited container on the GPU host: the engine keeps both in its data root
    # when it stops, unless make down removes them first.
    label = "tfpipe.stack-test=make-down"
    stack.engine_docker("run", "-d", "--network", "none", "--label", label, "--entrypoint", "sleep",
                        stack.image_ref(), "600")
    stack.engine_docker("create", "--network", "none", "--label", label, "--entrypoint", "true", stack.image_ref())
    containers = stack.gpuhost / "docker" / "containers"
    assert len(list(containers.iterdir())) >= 2
    done = stack_cli(stack.env, "down")
    assert done.returncode == 0, done.stderr
    state = str(stack.dir)
    left = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            status = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state in cmdline and status != "Z":
            left.append(f"{proc.name}: {cmdline[:200]}")
    assert not left, "processes left behind:\n" + "\n".join(left)
    assert all(pids.values()), pids
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if state in line]
    assert not mounts, mounts
    assert subprocess.run(["ip", "link", "show", stack.settings["bridge"]], capture_output=True).returncode != 0
    for part in ("api", "pg", "redis", "registry", "engine"):
        assert not _open(stack.port(part)), f"port of {part} ({stack.port(part)}) still open"
    assert stack.names() == []
    assert not list(containers.iterdir()), f"containers left in the GPU host's data root: {list(containers.iterdir())}"
    # The first engine's bridge is untouched (a second engine with --bridge=none would delete it).
    assert subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode == 0
