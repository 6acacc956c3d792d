"""scripts/ensure-tf-client.sh, where it cannot build the outside client's venv: it stops, names
what failed and leaves nothing a later call would take for a finished venv. (Building and reusing
the real venv: tests/integration/test_outside_client.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.conftest import REPO


def _checkout(tmp_path: Path, lock: str) -> Path:
    """A copy of the script in a tree of its own, whose requirements/tf-client.lock is ``lock``."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "requirements").mkdir()
    for script in ("ensure-tf-client.sh", "ensure-locked-venv.sh"):
        shutil.copy2(REPO / "scripts" / script, tmp_path / "scripts")
    (tmp_path / "requirements" / "tf-client.lock").write_text(lock)
    return tmp_path / "scripts" / "ensure-tf-client.sh"


def _offline_env(tmp_path: Path, **extra: str) -> dict:
    """pip with no index and no configuration: a package it cannot find is missing at once, offline."""
    (tmp_path / "no-wheels").mkdir(exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull,
            "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(tmp_path / "no-wheels"), **extra}


def test_ensure_tf_client_without_the_python_it_is_given_says_so(tmp_path):
    """PYTHON names no interpreter on PATH: exit 1, naming it and how to choose another."""
    script = _checkout(tmp_path, "tensorflow-cpu==2.21.0\n")
    proc = subprocess.run([str(script)], env=_offline_env(tmp_path, PYTHON="no-such-python3"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "ensure-tf-client: FAILED: no no-such-python3 on PATH (set PYTHON" in proc.stderr


def test_ensure_tf_client_replaces_a_stale_venv_and_names_pip_when_the_lock_cannot_be_installed(tmp_path):
    """A venv built from another lock is not reused: it is built again. When pip cannot install the
    lock, the script exits 1 naming pip and the lock, shows pip's own reason, and writes no stamp,
    so the half-built venv is built again next time rather than used."""
    script = _checkout(tmp_path, "tensorflow-cpu==0.0.0\n")
    venv = tmp_path / ".cache" / "tf-client"
    venv.mkdir(parents=True)
    (venv / ".built-from").write_text("a hash of another lock\n")
    proc = subprocess.run([str(script)], env=_offline_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert f"ensure-tf-client: FAILED: pip could not install {tmp_path}/requirements/tf-client.lock" in proc.stderr
    assert "No matching distribution found for tensorflow-cpu==0.0.0" in proc.stderr
    assert (venv / "bin" / "python").exists(), "the stale venv was not built again"
    assert not (venv / ".built-from").exists()
