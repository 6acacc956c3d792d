"""ruff keeps the layout honest: `make test` runs it on the tree, and it refuses a module-level
import of TensorFlow, google.cloud or kubernetes on the Airflow side (DAG files parse fast)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
RUFF = Path(sys.executable).parent / "ruff"


def _ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    if not RUFF.exists():
        pytest.fail(f"{RUFF} is missing: `make venv` installs ruff from requirements/host.lock")
    return subprocess.run([str(RUFF), "check", "--no-cache", "--output-format", "concise", *args], input=stdin,
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def test_the_tree_passes():
    proc = _ruff(".")
    assert proc.returncode == 0, proc.stdout[-3000:]


@pytest.mark.parametrize("module", ["tensorflow", "google.cloud.storage", "kubernetes.client"])
def test_heavy_module_level_imports_are_refused_on_the_airflow_side(module):
    source = f"import {module}\n\n\ndef f():\n    return {module}\n"
    provider = _ruff("--stdin-filename", "provider/tfpipe/probe.py", "-", stdin=source)
    assert provider.returncode == 1 and "TID253" in provider.stdout, provider.stdout
    lazy = f"def f():\n    import {module}\n\n    return {module}\n"
    assert _ruff("--stdin-filename", "provider/tfpipe/probe.py", "-", stdin=lazy).returncode == 0
    trainer = _ruff("--stdin-filename", "trainer/probe.py", "-", stdin=source)
    assert trainer.returncode == 0, "the trainer runs in the image and imports TensorFlow freely"


def test_airflow_rules_are_on():
    source = "from airflow.sdk import DAG\n\ndag = DAG(dag_id='x')\n"
    proc = _ruff("--stdin-filename", "dags/probe.py", "-", stdin=source)
    assert "AIR" in proc.stdout, proc.stdout
