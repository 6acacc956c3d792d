"""``python3 -m trainer`` end to end: config sources, result line, exit codes (contract 2)."""

import json
import os
import re
import subprocess
import sys

import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow  # noqa: E402,F401

from conftest import REPO  # noqa: E402
from trainer import common, contract, data, prep  # noqa: E402


def result_of(proc):
    """The JSON of the result line, which must be the last stdout line."""
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith(contract.RESULT_PREFIX), proc.stdout[-2000:]
    return json.loads(lines[-1][len(contract.RESULT_PREFIX):])


@pytest.mark.parametrize("setup, words", [
    ("missing", ["no stage config", contract.CONFIG_ENV]),
    ("not json", ["not valid JSON"]),
    ("bad envelope", ["schema_version"]),
    ("wrong stage", ["runs stage 'prep'", "'train'"]),
    ("bad field", ["data.shard_size"]),
])
def test_bad_configs_exit_11(ws, cli, setup, words):
    config = ws.config("prep")
    env = {}
    if setup == "not json":
        env[contract.CONFIG_ENV] = "{not json"
        config = None
    elif setup == "missing":
        config = None
    elif setup == "bad envelope":
        config["schema_version"] = 99
    elif setup == "wrong stage":
        config["stage"] = "train"
    elif setup == "bad field":
        config["data"]["shard_size"] = 0
    proc = cli("prep", config, env=env)
    assert proc.returncode == contract.ExitCode.BAD_INPUT, proc.stderr
    for word in words:
        assert word in proc.stderr
    assert contract.RESULT_PREFIX not in proc.stdout


def test_bad_data_exits_11_naming_the_line(ws, cli):
    with open(os.path.join(ws.data, "blobs.csv"), "a") as handle:
        handle.write("1,2,oops,4,0\n")
    proc = cli("prep", ws.config("prep"))
    assert proc.returncode == 11
    assert "blobs.csv line 302 column 'f2': 'oops' is not a number" in proc.stderr
    assert ws.visible("work", "datasets") == []


def test_prep_runs_without_importing_tensorflow(ws, cli, without_tensorflow):
    proc = cli("prep", ws.config("prep"), env=without_tensorflow)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result_of(proc)["examples"] == {"train": 245, "eval": 55}


@pytest.mark.integration
def test_the_four_stages_through_the_cli(ws, cli, tmp_path):
    proc = cli("prep", ws.config("prep"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result_of(proc)["examples"] == {"train": 245, "eval": 55}

    config_file = tmp_path / "train.json"
    config_file.write_text(json.dumps(ws.config("train")))
    proc = cli("train", args=["--config", str(config_file)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert result_of(proc)["steps"] == 24
    assert "\r" not in proc.stdout

    proc = cli("evaluate", ws.config("evaluate"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = result_of(proc)
    assert result["blessed"] is True and "WARNING" not in proc.stdout
    assert result["report"] == os.path.join(ws.run_dir(), "report.html")
    assert [os.path.basename(p) for p in result["plots"]] == [
        "loss.png", "accuracy.png", "confusion_matrix.png"]

    proc = cli("export", ws.config("export"), env={"TFPIPE_IMAGE_ID": "abc123"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = result_of(proc)
    assert result["version"] == 1 and result["metrics"]["accuracy"] >= 0.9
    assert os.path.isfile(os.path.join(result["model_dir"], "report", "report.html"))
    meta = json.load(open(os.path.join(result["model_dir"], "metadata.json")))
    # The root comes from the file the image build wrote; the Docker image ID and repo digest
    # come from the operator (absent in this hand-made config; tests/integration checks them).
    root = json.load(open("/opt/tfpipe/root-image.json"))
    assert meta["image"] == {"reference": "tfpipe/trainer:test", "content_id": "abc123",
                             "id": None, "repo_digest": None,
                             "root": {k: (v or None) for k, v in root.items()}}
    assert meta["image"]["root"]["kind"] in ("official", "offline")
    assert meta["image"]["root"]["id"].startswith("sha256:")

    proc = cli("evaluate", ws.config("evaluate", evaluation={"threshold": 1.01}))
    assert proc.returncode == contract.ExitCode.NOT_BLESSED
    assert result_of(proc)["blessed"] is False
    assert result_of(proc)["report"] == os.path.join(ws.run_dir(), "report.html")
    for stage in ("prep", "train", "evaluate", "export"):
        assert os.path.exists(os.path.join(ws.run_dir(), "config", stage + ".json"))


@pytest.mark.integration
def test_divergence_exits_12_and_checkpoints_nothing_diverged(ws, cli):
    prep.run(ws.config("prep"))
    config = ws.config("train", training={"optimizer": "sgd", "learning_rate": 1e12,
                                          "checkpoint_every_steps": 1})
    proc = cli("train", args=["--config", "-"], stdin=json.dumps(config))
    assert proc.returncode == contract.ExitCode.DIVERGED, proc.stdout + proc.stderr
    match = re.search(r"training diverged at epoch 1 step (\d+): loss is (nan|inf)", proc.stderr)
    assert match, proc.stderr
    assert "lower training.learning_rate, or clip the gradients with training.gradient_clip_norm" in proc.stderr
    assert contract.RESULT_PREFIX not in proc.stdout
    bad_step = int(match.group(1))
    train_dir = os.path.join(ws.run_dir(), "train")
    assert not os.path.exists(os.path.join(train_dir, "final"))
    saved = sorted(int(n.split("-")[1].split(".")[0])
                   for n in os.listdir(os.path.join(train_dir, "checkpoints"))
                   if n.startswith("ckpt-") and n.endswith(".index"))
    assert saved == list(range(max(1, bad_step - 3), bad_step))  # finite steps only, keep 3
    attempt = json.load(open(os.path.join(ws.run_dir(), "attempts.json")))[0]
    assert attempt["status"] == "diverged" and "step %d" % bad_step in attempt["error"]


def test_a_directory_it_cannot_write_exits_13_before_the_stage_starts(ws, cli):
    """The stage checks, as its own user, every directory it writes before it starts: a missing one
    is made (as a new run's stage makes its run dir), one it cannot write ends the stage with exit
    13, naming each such directory and the fix, before any data set is written."""
    runs = os.path.dirname(ws.run_dir())
    os.makedirs(runs)
    os.chmod(runs, 0o555)  # the stage's user owns it but cannot write it: what a root-owned one is to it
    try:
        proc = cli("prep", ws.config("prep"))
    finally:
        os.chmod(runs, 0o755)
    assert proc.returncode == contract.ExitCode.DIRS_NOT_READY == 13, proc.stdout + proc.stderr
    assert "ERROR (DirsNotReady, exit 13): this stage runs as uid %d" % os.getuid() in proc.stderr
    assert "%s (owned by %d:%d, mode 555)" % (runs, os.getuid(), os.getgid()) in proc.stderr, proc.stderr
    assert "%s (cannot be made (Permission denied))" % ws.run_dir() in proc.stderr, proc.stderr
    assert "Fix: let the operator prepare the volumes" in proc.stderr and "chown" in proc.stderr
    assert contract.RESULT_PREFIX not in proc.stdout
    assert ws.visible("work", "datasets") == [] and not os.path.exists(ws.run_dir())
    # ready again: the same stage makes what is missing, as its user, and runs
    proc = cli("prep", ws.config("prep"))
    assert proc.returncode == 0, proc.stderr
    for made in (ws.run_dir(), os.path.join(ws.work, "cache", "cuda"), os.path.join(ws.work, "datasets")):
        assert os.stat(made).st_uid == os.getuid(), made


def test_exit_skips_shutdown_but_runs_atexit_and_flushes(tmp_path):
    # The stage process leaves with os._exit: the atexit handlers must still run, unflushed
    # output must still come out, and the code must be the stage's.
    marker = tmp_path / "atexit-ran"
    code = ("import atexit, sys\n"
            "from trainer.__main__ import exit_now\n"
            "atexit.register(lambda: open(%r, 'w').write('yes'))\n"
            "sys.stdout.write('no newline, not flushed')\n"
            "sys.stderr.write('nor this')\n"
            "exit_now(10)\n" % str(marker))
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=60)
    assert proc.returncode == 10
    assert proc.stdout == "no newline, not flushed" and proc.stderr == "nor this"
    assert marker.read_text() == "yes"


def test_a_trained_stage_removes_its_file_cache_at_exit(ws, cli):
    # the file cache is released by an atexit handler, which the fast exit must still run
    prep.run(ws.config("prep"))
    config = ws.config("train", training={"cache": "file"})
    proc = cli("train", config)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cached in a file" in proc.stdout + proc.stderr
    dataset_dir = common.load_dataset(config)[0]
    assert os.listdir(data.cache_root(dataset_dir)) == []
