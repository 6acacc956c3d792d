"""``make up`` installs the Debian packages it needs as root on Debian, and otherwise says what to install;
``make down`` stops the GPU host's leftover containerd shims.

These need no stack. ``PATH`` is a directory of the test's own, so which tools are "installed" is
up to the test; where root on Debian would run ``apt-get``, the ``apt-get`` on that ``PATH`` only
writes down its arguments, so nothing is ever installed.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from deploy.stack import StackError, _alive, _check_tools, _install_hint, stop_leftover_shims

REPO = Path(__file__).resolve().parents[2]
INSTALL = "sudo apt-get install -y"


def _bin(tmp_path: Path, monkeypatch, *tools: str, script: str = "exit 0") -> Path:
    """A PATH holding only ``tools`` (each running ``script``)."""
    path = tmp_path / "bin"
    path.mkdir()
    for tool in tools:
        (path / tool).write_text(f"#!/bin/sh\n{script}\n")
        (path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(path))
    return path


def test_install_hint_names_each_package_and_the_apt_get_command():
    hint = _install_hint(["redis-server", "docker-registry"])
    assert hint.startswith("missing: redis-server, docker-registry. ")
    assert f"{INSTALL} redis-server docker-registry " in hint
    assert "`make up` as root on Debian" in hint


def test_not_root_names_what_is_missing_and_the_command_that_installs_it(tmp_path, monkeypatch):
    """Not root: no install; a StackError naming each missing package and the apt-get line."""
    _bin(tmp_path, monkeypatch, "postgres")
    with pytest.raises(StackError) as err:
        _check_tools(root=False)
    assert str(err.value) == _install_hint(["redis-server", "docker-registry", "pigz"])
    assert f"{INSTALL} redis-server docker-registry pigz " in str(err.value)

def test_nothing_missing_means_nothing_to_install(tmp_path, monkeypatch):
    record = tmp_path / "apt-get.calls"
    _bin(tmp_path, monkeypatch, "postgres", "redis-server", "docker-registry", "unpigz", "apt-get",
         script=f'echo "$*" >> {shlex.quote(str(record))}')
    assert _check_tools(root=True) is None
    assert not record.exists()


@pytest.mark.skipif(not Path("/etc/debian_version").exists(), reason="the install path is for Debian only")
def test_root_on_debian_installs_exactly_what_is_missing_with_apt_get(tmp_path, monkeypatch):
    """Root on Debian: ``apt-get update`` then ``apt-get install`` of the missing packages, non-interactively."""
    record = tmp_path / "apt-get.calls"
    monkeypatch.delenv("DEBIAN_FRONTEND", raising=False)  # the install sets it itself
    _bin(tmp_path, monkeypatch, "postgres", "apt-get",
         script=f'echo "$DEBIAN_FRONTEND $*" >> {shlex.quote(str(record))}')
    _check_tools(root=True)
    assert record.read_text().splitlines() == [
        " update -qq",
        "noninteractive install -y -qq --no-install-recommends redis-server docker-registry pigz",
    ]


def test_root_without_apt_get_says_what_to_install(tmp_path, monkeypatch):
    """Root where there is no apt-get (not Debian, or no package manager): the same hint, no install."""
    _bin(tmp_path, monkeypatch, "postgres")
    with pytest.raises(StackError) as err:
        _check_tools(root=True)
    assert str(err.value) == _install_hint(["redis-server", "docker-registry", "pigz"])


@pytest.mark.parametrize("command", ["up", "tools"])
def test_up_and_tools_as_a_user_with_tools_missing_say_what_to_install_without_a_traceback(command):
    """`make up` (deploy/stack.py up), and ``tools`` (what ``make test`` runs before the suites that
    start PostgreSQL and Redis), run by a user, not root, with the packages missing: exit 1, one line
    naming the packages and the apt-get command, no traceback, and nothing made."""
    # No tool on PATH; a state dir that does not exist: both stop at the tools, before they make anything.
    env = {"PATH": "/nonexistent", "TFPIPE_STACK_DIR": f"/tmp/tfpipe-stack-absent-{uuid.uuid4().hex}"}
    argv = [sys.executable, str(REPO / "deploy" / "stack.py"), command]
    if os.geteuid() == 0:
        argv = [shutil.which("setpriv"), "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # postgresql is missing too where /usr/lib/postgresql does not exist (found there without PATH).
    assert "[stack] error: missing: redis-server, docker-registry" in proc.stderr, proc.stderr
    assert f"{INSTALL} redis-server docker-registry" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert not Path(env["TFPIPE_STACK_DIR"]).exists()


def _fake_shim(exec_root: Path) -> tuple[subprocess.Popen, int]:
    """A process whose command line is a containerd shim's for ``exec_root``, with a "container" under it."""
    code = "import subprocess, time; print(subprocess.Popen(['sleep', '600']).pid, flush=True); time.sleep(600)"
    shim = subprocess.Popen([sys.executable, "-c", code, "containerd-shim-runc-v2", "-namespace", "t", "-id", "c1",
                             "-address", f"{exec_root}/containerd/containerd.sock"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    return shim, int(shim.stdout.readline())


def test_leftover_shims_of_the_stacks_engine_are_stopped_with_their_containers_and_no_others(tmp_path):
    """A shim outlives the engine when containerd stops before telling it to exit: ``make down`` kills it."""
    ours, theirs = tmp_path / "gpuhost" / "exec", tmp_path / "other" / "exec"
    shim, container = _fake_shim(ours)
    other, other_container = _fake_shim(theirs)
    try:
        assert stop_leftover_shims(ours) == [shim.pid]
        assert not _alive(shim.pid) and not _alive(container)
        assert _alive(other.pid) and _alive(other_container)
        assert stop_leftover_shims(ours) == []
    finally:
        for pid in (shim.pid, container, other.pid, other_container):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        shim.wait()
        other.wait()


def _readme_row(readme: str, starts: str) -> str:
    rows = [line for line in readme.splitlines() if line.startswith(f"| {starts}")]
    assert len(rows) == 1, f"the deploying page's `make up` table has one row starting {starts!r}: {rows}"
    return rows[0]


def test_make_up_s_defaults_are_the_ones_the_docs_table_lists():
    """With no ``TFPIPE_STACK_*`` setting, each part listens where the `make up` table of the docs'
    deploying page says, the second engine has its own bridge, and there are two workers of
    concurrency 1."""
    from deploy.stack import Stack

    stack = Stack({})
    readme = (REPO / "docs" / "deploying.md").read_text()
    assert f"| 127.0.0.1:{stack.port('pg')} |" in _readme_row(readme, "PostgreSQL")
    assert f"| 127.0.0.1:{stack.port('redis')} (password) |" in _readme_row(readme, "Redis |")
    assert f"| {stack.api_url} |" in _readme_row(readme, "Airflow api-server")
    assert f"| {stack.registry} |" in _readme_row(readme, "Debian's `docker-registry`")
    engine = _readme_row(readme, "a second dockerd")
    assert f"| {stack.engine_url}, TLS client certificates |" in engine
    assert f"bridge `{stack.settings['bridge']}`" in engine and stack.settings["bridge"] != "docker0"
    workers = {"2": "two"}[stack.settings["workers"]]
    assert _readme_row(readme, f"{workers} Celery workers (concurrency {stack.settings['concurrency']} each) |")
    assert stack.dir == REPO / ".stack" and "state under .stack/" in readme


def test_the_stack_s_state_and_certificates_are_ignored_by_git():
    """README: ``make up`` keeps its state under ``.stack/`` (not in git), the CA and the client key
    and the admin password included. A default outside the ignored tree would put them one
    ``git add -A`` away from a commit."""
    from deploy.stack import Stack

    stack = Stack({})
    assert stack.dir == REPO / ".stack"
    secrets = [stack.certs / "client" / "key.pem", stack.gpuhost / "tls" / "key.pem", stack.dir / "secrets" / "x",
               stack.airflow_home / "airflow.cfg", stack.pg_data / "PG_VERSION"]
    for path in secrets:
        assert path.is_relative_to(stack.dir), path
    rel = [str(path.relative_to(REPO)) for path in secrets]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *rel], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == rel, (proc.stdout, proc.stderr)


def test_the_worker_settings_set_how_many_workers_start_and_their_concurrency(tmp_path, monkeypatch):
    """README's table: ``TFPIPE_STACK_WORKERS`` Celery workers start, each with
    ``TFPIPE_STACK_WORKER_CONCURRENCY`` task slots. What ``start_airflow`` would start, recorded
    instead of started (the deployment tests run the stack itself, at the defaults)."""
    from deploy.stack import Stack

    stack = Stack({"TFPIPE_STACK_DIR": str(tmp_path), "TFPIPE_STACK_WORKERS": "3",
                   "TFPIPE_STACK_WORKER_CONCURRENCY": "2"})
    spawned: dict[str, list[str]] = {}
    waited: list[int] = []
    monkeypatch.setattr(stack, "spawn", lambda name, argv, **kw: spawned.setdefault(name, argv) and 1)
    monkeypatch.setattr(stack, "wait_for", lambda *args, **kwargs: None)
    monkeypatch.setattr(stack, "wait_for_worker", waited.append)
    stack.start_airflow()
    workers = sorted(name for name in spawned if name.startswith("worker"))
    assert workers == ["worker1", "worker2", "worker3"] and waited == [1, 2, 3]
    for name in workers:
        argv = spawned[name]
        assert argv[argv.index("celery"):] == ["celery", "worker", "--celery-hostname", f"{name}@%h",
                                              "--skip-serve-logs", "--concurrency", "2"], argv
        assert argv[0] == "unshare", "each worker runs where the GPU host's files are hidden"
    assert stack.airflow_env()["AIRFLOW__CELERY__WORKER_CONCURRENCY"] == "2"
