"""A typo in a run parameter fails the run before any container starts (through `make run`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def test_make_run_with_a_typo_fails_before_any_container_and_echoes_the_conf(tfpipe_home, trainer_image,
                                                                              docker_client):
    started = time.time()
    env = {**os.environ, "TFPIPE_HOME": str(tfpipe_home), "TFPIPE_RETRY_DELAY": "1"}
    proc = subprocess.run(["make", "--no-print-directory", "run", "DAG=tfpipe_digits_manual", 'CONF={"epoch": 3}'],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert '[run] tfpipe_digits_manual with conf {"epoch": 3} on image' in out, "the conf is echoed as given"
    assert "unknown run parameter 'epoch' (did you mean 'epochs'?). Fix: remove it from the run's conf, or use " \
        "one of tfpipe_digits_manual's parameters: " in out
    assert re.search(r"parameters: [a-z_, ]*\bepochs\b[a-z_, ]*\. Nothing ran\.", out), out[-3000:]
    summary = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert summary["state"] == "failed" and summary["model_dir"] is None
    tasks = summary["tasks"]
    assert tasks["stage_in"] == {"state": "failed", "try_number": 1}, "a typo is not retried"
    assert all(tasks[t]["state"] == "upstream_failed" for t in ("prep", "validate", "train", "evaluate", "export"))
    assert tasks["cleanup"]["state"] == "failed", "cleanup refuses the run's conf too, before its container"
    events = docker_client.events(since=int(started), until=int(time.time()) + 1, decode=True,
                                  filters={"type": "container", "event": "create",
                                           "label": f"tfpipe.run_id={summary['run_id']}"})
    assert list(events) == [], "no container may start for a run with an unknown parameter"
    assert not (tfpipe_home / "work" / "runs" / "tfpipe_digits_manual").exists()
