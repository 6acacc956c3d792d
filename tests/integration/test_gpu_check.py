"""``scripts/gpu-check.sh`` on an engine without the NVIDIA runtime: it says nothing ran and fails.

On a GPU host the script runs the whole GPU section instead (minutes), which is its purpose there,
not a check of this one."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def test_without_the_nvidia_runtime_it_fails_at_once_saying_no_gpu_path_ran(docker_client):
    if "nvidia" in (docker_client.info().get("Runtimes") or {}):
        pytest.skip("this engine has the NVIDIA runtime: gpu-check.sh would run every GPU test here")
    proc = subprocess.run([str(REPO / "scripts" / "gpu-check.sh")], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpu-check: NOT RUN: the Docker engine has no NVIDIA runtime" in proc.stderr, proc.stderr
    assert "No GPU path was exercised on this host" in proc.stderr
    assert "NVIDIA Container Toolkit" in proc.stderr
    # at once: no test and no bench ran, so no log of theirs was written
    assert not (REPO / ".cache" / "gpu-check").exists() or not any((REPO / ".cache" / "gpu-check").iterdir())
