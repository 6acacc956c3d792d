"""Soak: six nightly runs back to back, the data changing every night; retention keeps the volumes bounded.

Retention reaches its steady state by the third night, so six nights show the volumes staying flat
over the three nights after it, and the data gate lets every ordinary night through;
``TFPIPE_SOAK_RUNS=30`` soaks longer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO, write_dag

pytestmark = [pytest.mark.integration, pytest.mark.reliability, pytest.mark.soak]

RUNS = int(os.environ.get("TFPIPE_SOAK_RUNS", "6"))
DAG_ID = "soak_nightly"

#: Loads every kept version in the image and calls its serving signature on one digit.
LOAD_ALL = """
import json, os, sys
import tensorflow as tf
root = sys.argv[1]
out = {}
for name in sorted(os.listdir(root)):
    if not name.isdigit():
        continue
    loaded = tf.saved_model.load(os.path.join(root, name))
    sig = loaded.signatures["serving_default"]
    inputs = {key: tf.constant([1.0]) for key in sig.structured_input_signature[1]}
    probs = sig(**inputs)["probabilities"].numpy()
    out[name] = [int(probs.shape[1]), float(probs.sum())]
print("LOADED " + json.dumps(out))
"""


def test_nightly_runs_keep_volumes_bounded(tfpipe_home, trainer_image, tmp_path, docker_client):
    dags = tmp_path / "dags"
    write_dag(dags, DAG_ID,
              training={"model": "mlp", "epochs": 1, "batch_size": 64, "checkpoint_every_steps": 1000},
              evaluation={"threshold": 0.0, "tolerance": 1.0},  # every night exports: versions churn
              export={"model_name": DAG_ID, "keep_versions": 2},
              retention={"keep_runs": 2, "min_idle_minutes": 0})
    env = {**os.environ, "TFPIPE_HOME": str(tfpipe_home), "TFPIPE_IMAGE": trainer_image,
           "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "PYTHONUNBUFFERED": "1"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "reliability" / "soak_driver.py"), DAG_ID,
                           str(RUNS), str(tfpipe_home), str(dags)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=60 * 60)
    nights = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and len(nights) == RUNS, proc.stderr[-6000:]
    elapsed = time.monotonic() - started
    for night in nights:
        assert night["state"] == "success", (night, proc.stderr[-6000:])
        assert night["tasks"]["cleanup"]["state"] == "success"
        # threshold 0, tolerance 1: every candidate is blessed and exported, so versions churn
        assert night["blessed"] is True and night["tasks"]["export"]["state"] == "success", night
        # the blessing gate compared against the newest version kept at that time
        newest = max(night["versions_before"]) if night["versions_before"] else None
        assert (night["baseline"] or {}).get("version") == newest, night
        # retention: the 2 newest versions; the newest 2 runs plus the run whose version this run's
        # export replaced (cleanup runs beside training, before the export, while that version is
        # still kept: its run dir goes at the next run's cleanup), and their data sets
        assert len(night["versions_after"]) == min(night["run"], 2), night
        assert night["run_dirs"] == night["datasets"] == min(night["run"], 3), night
    total = {n["run"]: n["work_bytes"] + n["models_bytes"] for n in nights}
    half = RUNS // 2
    figures = {k: total[k] for k in sorted({3, half, RUNS}) if k in total}
    print(f"\nsoak: {RUNS} runs in {elapsed:.0f} s ({elapsed / RUNS:.1f} s per run); "
          f"work+models bytes after runs {figures}")
    # from the steady state (night 3) on, the second half of the nights adds no lasting bytes
    assert RUNS >= 6, "a soak needs at least 6 nights to compare a second half with retention's steady state"
    assert total[RUNS] <= 1.2 * total[half], figures

    # every kept version still loads and answers, in the image
    out = docker_client.containers.run(
        trainer_image, ["python3", "-c", LOAD_ALL, "/models"], remove=True, network_mode="none",
        volumes={str(tfpipe_home / "models" / DAG_ID): {"bind": "/models", "mode": "ro"}})
    loaded = json.loads(out.decode().split("LOADED ", 1)[1])
    assert sorted(int(v) for v in loaded) == nights[-1]["versions_after"] and len(loaded) == 2
    for classes, total_p in loaded.values():
        assert classes == 10 and total_p == pytest.approx(1.0, abs=1e-4)
