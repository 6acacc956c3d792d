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


@pytest.mark.skipif(os.geteuid() != 0, reason="ensure-docker starts dockerd only as root")
def test_ensure_docker_as_root_starts_an_installed_engine_in_the_background(tmp_path):
    """dockerd installed, no engine answering: the script starts it detached and waits for it."""
    started = tmp_path / "dockerd.started"
    folder = tmp_path / "bin"
    # the stand-in engine answers `docker info` once the stand-in dockerd has run
    folder = _path(tmp_path, {"dockerd": f'echo "$$" > {shlex.quote(str(started))}; echo "dockerd up"',
                              "docker": f'[ -s {shlex.quote(str(started))} ]'})
    proc = _run("ensure-docker.sh", folder)
    assert proc.returncode == 0, proc.stderr
    assert f"ensure-docker: starting dockerd in the background (log: {folder / 'dockerd.log'})" in proc.stderr
    assert started.read_text().strip().isdigit()
    assert (folder / "dockerd.log").read_text() == "dockerd up\n"


def test_ensure_docker_as_a_user_with_dockerd_not_running_says_how_to_start_it(tmp_path):
    started = tmp_path / "dockerd.started"
    folder = _path(tmp_path, {"dockerd": f"touch {shlex.quote(str(started))}", "docker": "exit 1"})
    proc = _run("ensure-docker.sh", folder, as_user=True)
    assert proc.returncode == 1
    assert "dockerd is installed but not running; start it: sudo systemctl start docker" in proc.stderr
    assert not started.exists()  # a user's script starts no engine of its own


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs util-linux's unshare")
def test_unmount_under_clears_what_debootstrap_left_mounted_in_its_target(tmp_path):
    """``docker/unmount-under.sh`` before the root image's ``tar``: a /proc left mounted in the
    target (debootstrap ignores a failed unmount at its exit) would be archived into the image.
    In a mount namespace of the test's own, so nothing is left mounted on the host."""
    target = tmp_path / "rootfs"
    for sub in ("proc", "sys", "dev/pts", "etc"):
        (target / sub).mkdir(parents=True)
    (tmp_path / "rootfs-other").mkdir()  # a sibling whose name starts with the target's stays
    script = f"""
set -e
t={shlex.quote(str(target))}
mount -t proc proc "$t/proc"
mount -t tmpfs tmpfs "$t/sys" && mount -t tmpfs tmpfs "$t/sys"  # mounted over twice
mount -t tmpfs tmpfs "$t/dev/pts"
mount -t tmpfs tmpfs "$t-other"
{shlex.quote(str(REPO / "docker" / "unmount-under.sh"))} "$t"
echo "rc=$?"
awk '{{print $2}}' /proc/self/mounts | grep -F "$t" || true
"""
    argv = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        argv.insert(1, "--map-root-user")
    proc = subprocess.run([*argv, "bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split()
    assert lines == ["rc=0", f"{target}-other"], proc.stdout
    # without it, tar would have read the host's processes under the target's proc/
    assert list((target / "proc").iterdir()) == []


def test_unmount_under_a_missing_directory_is_nothing_to_do(tmp_path):
    proc = subprocess.run([str(REPO / "docker" / "unmount-under.sh"), str(tmp_path / "absent")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == ""


@pytest.mark.parametrize("target", ["demo", "test"])
def test_demo_and_test_build_the_venv_and_the_image_at_once_then_set_up_the_rest(target):
    """README and the docs: ``make demo`` and ``make test`` do all set-up themselves, the venv and the image built
    at once (one ``make -j2``: the venv is mostly downloads, the image a CPU-bound build), then the
    metadata DB; ``make demo`` then runs ``tfpipe_digits``. Read from the recipes (``make -n``)."""
    def recipe(*args: str) -> list[str]:
        return subprocess.run(["make", "-n", "--no-print-directory", *args], cwd=REPO, capture_output=True,
                              text=True, check=True, timeout=60).stdout.splitlines()

    makefile = (REPO / "Makefile").read_text()
    body = makefile[makefile.index(f"\n{target}:") + 1:].split("\n\n")[0].splitlines()[1:]
    assert body[0].strip().endswith("-j2 venv image"), body
    if target == "demo":
        assert body[1].strip().endswith("run DAG=tfpipe_digits"), body
        steps = recipe("run", "DAG=tfpipe_digits")
        assert any("-m tfpipe.cli run tfpipe_digits" in line for line in steps), steps
    else:
        assert "airflow-db" in body[1] and "data" in body[1], body
    assert any("airflow db migrate" in line for line in recipe("airflow-db", "-B"))
