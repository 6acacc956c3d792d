"""The set-up scripts ``make demo`` and ``make test`` run: as root on Debian they install what is
missing with apt-get, otherwise they say exactly what to install and stop.

``PATH`` is a folder of the test's own holding the few standard tools the scripts use, so what is
"installed" is up to the test. Where root on Debian would run ``apt-get``, the ``apt-get`` on that
``PATH`` writes down its arguments and lays down what the package would (a stand-in executable),
so nothing is ever installed and no engine is started.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO

#: What the scripts call besides the tools under test.
STANDARD = ("id", "seq", "sleep", "cat", "tail", "setsid", "nohup")
ON_DEBIAN_AS_ROOT = os.geteuid() == 0 and Path("/etc/debian_version").exists()


@pytest.fixture
def tmp_path():
    """A folder another user may read too (pytest's own is private to root), for the runs as a user."""
    folder = Path(tempfile.mkdtemp(prefix="tfpipe-setup-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _path(tmp_path: Path, tools: dict[str, str]) -> Path:
    """A PATH folder with the standard tools and ``tools`` (name: shell script body)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in STANDARD:
        (folder / name).symlink_to(shutil.which(name))
    for name, body in tools.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    return folder


def _run(script: str, folder: Path, *, as_user: bool = False) -> subprocess.CompletedProcess:
    argv = ["/bin/bash", str(REPO / "scripts" / script)]
    if as_user and os.geteuid() == 0:
        argv = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    return subprocess.run(argv, env={"PATH": str(folder), "TFPIPE_DOCKERD_LOG": str(folder / "dockerd.log")},
                          capture_output=True, text=True, timeout=60)


def _apt_get(record: Path, folder: Path, installs: str) -> str:
    """An apt-get that records ``DEBIAN_FRONTEND args`` and, on install, puts ``installs`` on PATH."""
    stand_in = folder / installs
    return (f'echo "$DEBIAN_FRONTEND $*" >> {shlex.quote(str(record))}\n'
            f'case "$1" in install) printf "#!/bin/sh\\nexit 0\\n" > {shlex.quote(str(stand_in))}; '
            f'/bin/chmod 755 {shlex.quote(str(stand_in))};; esac')


@pytest.mark.skipif(not ON_DEBIAN_AS_ROOT, reason="the install path is for root on Debian only")
def test_ensure_docker_as_root_on_debian_installs_docker_io_when_dockerd_is_missing(tmp_path):
    record = tmp_path / "apt-get.calls"
    folder = tmp_path / "bin"
    # the package brings dockerd; `docker info` answers once it is installed (the stand-in: exit 0)
    folder = _path(tmp_path, {"apt-get": _apt_get(record, folder, "dockerd"),
                              "docker": f'[ -x {shlex.quote(str(folder / "dockerd"))} ]'})
    proc = _run("ensure-docker.sh", folder)
    assert proc.returncode == 0, proc.stderr
    assert "ensure-docker: installing Debian's docker.io" in proc.stderr
    assert record.read_text().splitlines() == [" update -qq", "noninteractive install -y -qq docker.io"]


def test_ensure_docker_as_a_user_without_docker_says_what_to_install(tmp_path):
    folder = _path(tmp_path, {})
    proc = _run("ensure-docker.sh", folder, as_user=True)
    assert proc.returncode == 1
    assert "no Docker engine is running and dockerd is not installed" in proc.stderr
    assert "sudo apt-get install -y docker.io" in proc.stderr and "API >= 1.40" in proc.stderr


@pytest.mark.skipif(not ON_DEBIAN_AS_ROOT, reason="the install path is for root on Debian only")
def test_ensure_chromium_as_root_on_debian_installs_chromium(tmp_path):
    record = tmp_path / "apt-get.calls"
    folder = _path(tmp_path, {"apt-get": _apt_get(record, tmp_path / "bin", "chromium")})
    proc = _run("ensure-chromium.sh", folder)
    assert proc.returncode == 0, proc.stderr
    assert record.read_text().splitlines() == [
        " update -qq", "noninteractive install -y -qq --no-install-recommends chromium"]


def test_ensure_chromium_stops_with_the_reason_when_it_cannot_install(tmp_path):
    folder = _path(tmp_path, {})
    proc = _run("ensure-chromium.sh", folder, as_user=True)
    assert proc.returncode == 1
    assert "ensure-chromium: FAILED: no chromium on PATH and it cannot be installed from here" in proc.stderr
    assert "sudo apt-get install -y chromium" in proc.stderr


def test_ensure_chromium_with_chromium_on_path_installs_nothing(tmp_path):
    record = tmp_path / "apt-get.calls"
    folder = _path(tmp_path, {"chromium": "exit 0", "apt-get": f"echo \"$*\" >> {shlex.quote(str(record))}"})
    assert _run("ensure-chromium.sh", folder).returncode == 0
    assert not record.exists()


@pytest.mark.parametrize("target", ["test-host", "test-compat", "test-compat-oldest"])
def test_the_test_targets_install_or_name_the_stack_s_packages_before_pytest(target):
    """The Celery and deployment tests start PostgreSQL and Redis: each suite that runs them first
    has ``deploy/stack.py tools`` install them (as root on Debian) or name them and stop."""
    recipe = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    tools = next(i for i, line in enumerate(recipe) if line.endswith("deploy/stack.py tools"))
    tests = next(i for i, line in enumerate(recipe) if "-m pytest" in line or "test-compat.sh" in line)
    assert tools < tests, recipe
