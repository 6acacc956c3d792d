"""Bad input, faults and least privilege, each shown for real through Airflow and the engine."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from airflow.sdk import DAG

from tests.conftest import REPO, dag_command, parse_summary, run_dag, write_dag
from tfpipe.config import PipelineConfig
from tfpipe.exceptions import StageFailedError
from tfpipe.operators.docker import TrainOperator
from tfpipe.redact import RedactingLog
from tfpipe.specs import config_template

pytestmark = [pytest.mark.integration, pytest.mark.reliability]


def _versions(home: Path, name: str) -> list[str]:
    root = home / "models" / name
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_malformed_csv_fails_prep_once_naming_file_and_row(tfpipe_home, trainer_image, tmp_path):
    csv = tfpipe_home / "data" / "digits" / "digits.csv"
    lines = csv.read_text().splitlines()
    lines[42] = lines[42].replace(",", ",seven,", 1)
    csv.write_text("\n".join(lines) + "\n")
    write_dag(tmp_path / "dags", "bad_csv")
    summary, log = run_dag("bad_csv", {}, home=tfpipe_home, image=trainer_image, dags_folder=tmp_path / "dags")
    assert summary["state"] == "failed"
    assert summary["tasks"]["prep"] == {"state": "failed", "try_number": 1}, "bad data must not be retried"
    assert re.search(r"digits\.csv[^\n]*(line|row) 43", log), "the error must name the file and the row"
    datasets = tfpipe_home / "work" / "datasets"
    assert not datasets.exists() or [p for p in datasets.iterdir() if not p.name.startswith(".")] == []


def test_a_label_outside_data_classes_fails_prep_once_naming_the_row_the_list_and_the_fix(
        tfpipe_home, trainer_image, tmp_path):
    """The digits declared as nine classes (no "9"): the first row labelled 9 fails prep, not retried."""
    _, *rows = (tfpipe_home / "data" / "digits" / "digits.csv").read_text().splitlines()
    line = 2 + next(i for i, row in enumerate(rows) if row.rsplit(",", 1)[1] == "9")  # the header is line 1
    write_dag(tmp_path / "dags", "undeclared_label",
              data={"path": "digits/digits.csv", "classes": [str(d) for d in range(9)]})
    summary, log = run_dag("undeclared_label", {}, home=tfpipe_home, image=trainer_image,
                           dags_folder=tmp_path / "dags")
    assert summary["state"] == "failed"
    assert summary["tasks"]["prep"] == {"state": "failed", "try_number": 1}, "bad input must not be retried"
    assert f"digits.csv line {line} column 'label': label '9' is not one of the 9 classes of data.classes" in log
    assert "Fix: add it to data.classes (at the end keeps the other classes' ids), or correct the row" in log
    assert "exit 11" in log
    datasets = tfpipe_home / "work" / "datasets"
    assert not datasets.exists() or [p for p in datasets.iterdir() if not p.name.startswith(".")] == []


def test_nan_loss_fails_clearly_and_keeps_earlier_versions(tfpipe_home, trainer_image, tmp_path):
    dags = tmp_path / "dags"
    write_dag(dags, "nan_loss", training={"model": "mlp", "epochs": 3, "learning_rate": 0.002})
    good, log = run_dag("nan_loss", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert good["state"] == "success", log[-4000:]
    before = _versions(tfpipe_home, "nan_loss")
    # learning rates above 10 are refused when the DAG is parsed, so divergence comes from a user
    # model whose logits blow up after a few steps (as a bad custom layer would)
    code = tfpipe_home / "data" / "code" / "exploding"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text(EXPLODING_MODEL)
    write_dag(dags, "nan_loss", training={"model": "exploding:build", "code_path": "code", "epochs": 3})
    bad, log = run_dag("nan_loss", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert bad["state"] == "failed"
    assert bad["tasks"]["train"] == {"state": "failed", "try_number": 1}, "divergence must not be retried"
    assert bad["tasks"]["export"]["state"] == "upstream_failed"
    assert "diverged" in log.lower() and ("nan" in log.lower() or "inf" in log.lower())
    assert _versions(tfpipe_home, "nan_loss") == before


def test_out_of_space_export_leaves_no_partial_version_and_retry_completes(tfpipe_home, trainer_image, tmp_path):
    models = tmp_path / "small-models"
    models.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(models)], check=True)
    try:
        dags = tmp_path / "dags"
        write_dag(dags, "nospace", training={"model": "mlp", "epochs": 2})
        text = (dags / "nospace.py").read_text().replace('f"{HOME}/models"', repr(str(models)))
        (dags / "nospace.py").write_text(text)
        first, log = run_dag("nospace", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
        assert first["state"] == "success", log[-4000:]
        v1 = models / "nospace" / "1"
        v1_files = sorted(str(p.relative_to(v1)) for p in v1.rglob("*"))
        # leave less room than one version needs
        free = int(subprocess.run(["df", "--output=avail", "-B1", str(models)], capture_output=True,
                                  text=True, check=True).stdout.split()[-1])
        (models / "filler").write_bytes(b"\0" * max(0, free - 64 * 1024))
        failed, log = run_dag("nospace", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
        assert failed["state"] == "failed" and failed["tasks"]["export"]["state"] == "failed"
        assert "No space left on device" in log or "ENOSPC" in log
        assert sorted(p.name for p in (models / "nospace").iterdir() if not p.name.startswith(".")) == ["1"]
        assert sorted(str(p.relative_to(v1)) for p in v1.rglob("*")) == v1_files, "earlier version changed"
        (models / "filler").unlink()
        retried, log = run_dag("nospace", None, home=tfpipe_home, image=trainer_image, dags_folder=dags,
                               rerun=failed["run_id"])
        assert retried["state"] == "success", log[-4000:]
        assert sorted(p.name for p in (models / "nospace").iterdir() if not p.name.startswith(".")) == ["1", "2"]
    finally:
        subprocess.run(["umount", "-l", str(models)], check=False)


def test_unreachable_engine_names_the_url_and_is_retried(tfpipe_home, trainer_image, tmp_path):
    dags = tmp_path / "dags"
    write_dag(dags, "no_engine", docker_url="tcp://127.0.0.1:9")
    summary, log = run_dag("no_engine", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert summary["state"] == "failed"
    # An engine that does not answer may be restarting: unlike a refused certificate, it is retried.
    assert summary["tasks"]["prep"] == {"state": "failed", "try_number": 2}, summary["tasks"]
    assert log.count("cannot reach the Docker engine at tcp://127.0.0.1:9") >= 2, log[-4000:]


def test_two_runs_at_once_use_separate_dirs_and_versions(tfpipe_home, trainer_image, tmp_path):
    dags = tmp_path / "dags"
    write_dag(dags, "twice", training={"model": "mlp", "epochs": 4})
    procs = []
    for _ in range(2):
        cmd, env = dag_command("twice", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
        procs.append(subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
        time.sleep(1.5)  # distinct run ids (they are timestamps)
    results = [parse_summary(*p.communicate(timeout=600), p.returncode) for p in procs]
    assert [r["state"] for r in results] == ["success", "success"]
    assert results[0]["run_id"] != results[1]["run_id"]
    assert len(list((tfpipe_home / "work" / "runs" / "twice").iterdir())) == 2
    dirs = {r["model_dir"] for r in results}
    assert len(dirs) == 2 and _versions(tfpipe_home, "twice") == ["1", "2"]
    for r in results:
        metadata = json.loads((Path(r["model_dir"]) / "metadata.json").read_text())
        assert metadata["run_id"] == r["run_id"]


class StageInspector(threading.Thread):
    """Captures ``docker inspect`` of a stage container of a DAG while it runs."""

    def __init__(self, client, dag_id: str, stage: str = "train"):
        super().__init__(daemon=True)
        self.client, self.dag_id, self.stage = client, dag_id, stage
        self.seen: dict = {}

    def run(self):
        deadline = time.time() + 300
        while time.time() < deadline and not self.seen:
            for c in self.client.containers.list(filters={"label": [f"tfpipe.dag_id={self.dag_id}",
                                                                    f"tfpipe.stage={self.stage}"]}):
                if "tfpipe.role" not in c.labels:
                    self.seen.update(self.client.api.inspect_container(c.id))
                    return
            time.sleep(0.1)


def test_least_privilege_and_no_network(tfpipe_home, trainer_image, docker_client, tmp_path):
    """Inspect a running training container; the whole run works with network_mode='none'."""
    dags = tmp_path / "dags"
    write_dag(dags, "locked_down", training={"model": "mlp", "epochs": 30, "checkpoint_every_steps": 5},
              resources={"network_mode": "none"})
    inspector = StageInspector(docker_client, "locked_down")
    inspector.start()
    summary, log = run_dag("locked_down", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    inspector.join(timeout=5)
    seen = inspector.seen
    assert summary["state"] == "success", log[-4000:]
    assert seen, "never saw the training container running"
    config, host = seen["Config"], seen["HostConfig"]
    assert config["User"] == "1000:1000"
    assert host["Privileged"] is False
    assert host["NetworkMode"] == "none"
    mounts = {m["Destination"]: m for m in seen["Mounts"]}
    assert set(mounts) == {"/data", "/work", "/models"}
    assert mounts["/data"]["RW"] is False and mounts["/work"]["RW"] and mounts["/models"]["RW"]
    assert not any("docker.sock" in m["Source"] for m in seen["Mounts"])
    assert host["ShmSize"] >= 512 * 1024 * 1024
    env = dict(e.split("=", 1) for e in config["Env"])
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" and env["CUDA_CACHE_PATH"].startswith("/work/")
    # files on the mounts belong to the stage user, not root
    run_dir = next((tfpipe_home / "work" / "runs" / "locked_down").iterdir())
    assert (run_dir / "attempts.json").stat().st_uid == 1000


# A user model whose logits overflow to inf once training moves its scale: the loss turns NaN.
EXPLODING_MODEL = """
import tensorflow as tf

class Explode(tf.keras.layers.Layer):
    def build(self, shape):
        self.scale = self.add_weight(name="scale", shape=(), initializer="ones")

    def call(self, x):
        return x * tf.exp(1e4 * (self.scale - 1.0)) * 1e30

def build(input_spec, num_classes, stats):
    inputs = tf.keras.Input(shape=input_spec["shape"], name="features")
    x = tf.keras.layers.Rescaling(1.0 / 16)(inputs)
    return tf.keras.Model(inputs, Explode()(tf.keras.layers.Dense(num_classes)(x)))
"""


# A user model that prints the secret it finds in its environment, as careless user code would.
LEAKY_MODEL = """
import os
import tensorflow as tf

def build(input_spec, num_classes, stats):
    print("leaky model: API_TOKEN is " + os.environ["API_TOKEN"] + " (end)", flush=True)
    inputs = tf.keras.Input(shape=input_spec["shape"], name="features")
    x = tf.keras.layers.Rescaling(1.0 / 16)(inputs)
    return tf.keras.Model(inputs, tf.keras.layers.Dense(num_classes)(x))
"""


def _secret() -> str:
    return "s3cr3t-" + uuid.uuid4().hex  # unique: the metadata DB outlives test runs


def _dag_with_secret_and_model(home: Path, tmp_path: Path, dag_id: str, model_source: str) -> Path:
    """A DAG folder whose pipeline trains the user model ``leaky:build`` (``model_source``) and passes
    ``$TFPIPE_TEST_SECRET`` to the stages as ``private_environment`` ``API_TOKEN``."""
    code = home / "data" / "code" / "leaky"
    code.mkdir(parents=True)
    (code / "__init__.py").write_text(model_source)
    dags = tmp_path / "dags"
    # the DAG reads the secret from its environment (as from a secrets backend): a value written
    # into a DAG file would be stored with the file's source by Airflow
    path = write_dag(dags, dag_id, training={"model": "leaky:build", "code_path": "code", "epochs": 2},
                     resources={"private_environment": {"API_TOKEN": "@SECRET@"}})
    path.write_text(path.read_text().replace("'@SECRET@'", 'os.environ["TFPIPE_TEST_SECRET"]'))
    return dags


def test_a_printed_secret_is_masked_in_the_task_log_and_absent_from_xcom_and_db(
        tfpipe_home, trainer_image, docker_client, tmp_path):
    secret = _secret()
    dags = _dag_with_secret_and_model(tfpipe_home, tmp_path, "with_secret", LEAKY_MODEL)
    inspector = StageInspector(docker_client, "with_secret")
    inspector.start()
    summary, log = run_dag("with_secret", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags,
                           extra_env={"TFPIPE_TEST_SECRET": secret})
    inspector.join(timeout=5)
    assert summary["state"] == "success", log[-4000:]
    assert f"API_TOKEN={secret}" in inspector.seen["Config"]["Env"], "the container must get the secret"
    # the task log (dag.test writes it to the process's output): the stage printed it, Airflow masked it
    printed = [line for line in log.splitlines() if "leaky model: API_TOKEN is" in line]
    assert printed, "the stage's output did not reach the task log"
    assert all("API_TOKEN is *** (end)" in line for line in printed), printed
    assert secret not in log and secret not in json.dumps(summary)
    db = Path(__import__("os").environ["AIRFLOW_HOME"]) / "airflow.db"
    with sqlite3.connect(db) as conn:
        xcoms = conn.execute("SELECT key, value FROM xcom WHERE dag_id = 'with_secret'").fetchall()
        assert {key for key, _ in xcoms} >= {"return_value"}, "the stages pushed their results"
        assert all(secret not in repr(value) for _, value in xcoms)
        for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
            for row in conn.execute(f'SELECT * FROM "{table}"'):
                assert secret not in repr(row), f"secret found in table {table}"
    for path in (tfpipe_home / "work" / "runs").rglob("*.json"):
        assert secret not in path.read_text(), f"secret found in {path}"


# User code that fails with the secret in its output and in its error, as a careless client would.
LEAKY_FAILING_MODEL = """
import os

print("leaky model: API_TOKEN is " + os.environ["API_TOKEN"] + " (end)", flush=True)
raise RuntimeError("the registry refused API_TOKEN " + os.environ["API_TOKEN"] + " (end)")
"""


def test_a_secret_in_a_failing_stage_output_and_error_is_masked_in_the_task_log(
        tfpipe_home, trainer_image, tmp_path):
    """The train stage prints the secret, then fails with it in its error (a bad user module, exit 11):
    the followed output, the error's log tail and the operator's exception all show ``***``."""
    secret = _secret()
    dags = _dag_with_secret_and_model(tfpipe_home, tmp_path, "secret_fails", LEAKY_FAILING_MODEL)
    summary, log = run_dag("secret_fails", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags,
                           extra_env={"TFPIPE_TEST_SECRET": secret})
    assert summary["state"] == "failed"
    assert summary["tasks"]["train"] == {"state": "failed", "try_number": 1}, "bad input must not be retried"
    assert "train rejected its input" in log, "the operator's exception did not reach the task log"
    printed = [line for line in log.splitlines() if "leaky model: API_TOKEN is" in line]
    refused = [line for line in log.splitlines() if "the registry refused API_TOKEN" in line]
    assert printed and refused, log[-4000:]
    # refused: the stage's error line as followed, and again in the exception's tail of the output
    assert len(refused) >= 2, refused
    assert all("API_TOKEN is *** (end)" in line for line in printed), printed
    assert all("refused API_TOKEN *** (end)" in line for line in refused), refused
    assert secret not in log and secret not in json.dumps(summary)


def test_the_operator_redacts_a_secret_in_a_failed_container_output_and_its_exception(
        trainer_image, docker_client, tmp_path, capfd):
    """A stage container that fails with the secret on stdout and in a traceback on stderr: every
    line the operator logs and the exception it raises (message and the lines it carries) show
    ``***``, through the operator's own follow-and-map path on the real engine."""
    secret = _secret()
    volumes = {name: str(tmp_path / name) for name in ("data", "work", "models")}
    cfg = PipelineConfig.from_dict({"dag_id": "redact", "image": {"ref": trainer_image},
                                    "data": {"path": "digits/digits.csv"}, "volumes": volumes})
    with DAG("redact", schedule=None):
        op = TrainOperator(task_id="train", image=trainer_image, stage_config=config_template(cfg, "train"),
                           volumes=cfg.volumes, private_environment={"API_TOKEN": secret})
    op.command = ["python3", "-c", "import os; t = os.environ['API_TOKEN']; print('token is ' + t, flush=True); "
                  "raise RuntimeError('refused ' + t)"]
    op.mounts = []  # the script reads no volume
    op.container_name = f"tfpipe-redact-{uuid.uuid4().hex[:10]}"
    op.labels = {"tfpipe.test": "redact"}
    op._fresh = True  # started by this try: followed from its first line, as submit_job leaves it
    capfd.readouterr()
    with pytest.raises(StageFailedError) as err:
        op.poll_until_complete(op._create_and_start()["Id"], {})
    logged = "\n".join(capfd.readouterr())
    assert err.value.exit_code == 1
    message = str(err.value)
    assert "token is ***" in message and "RuntimeError: refused ***" in message, message
    assert "token is ***" in logged and "RuntimeError: refused ***" in logged, logged
    assert secret not in message and secret not in logged and secret not in repr(err.value.logs)
    assert docker_client.containers.list(all=True, filters={"name": op.container_name}) == []


def test_redacting_log_replaces_every_secret_longest_first(caplog):
    """Overlapping secrets leave no part of the longer one behind; %-arguments are redacted too."""
    log = RedactingLog(logging.getLogger("tfpipe.test.redact"), ["abc", "abcdef", "xyz"])
    assert log.redact("abcdef abc xyz abcdefabc") == "*** *** *** ******"
    with caplog.at_level(logging.INFO, logger="tfpipe.test.redact"):
        log.info("token %s and %s", "abcdef", "xyz")
        log.error("plain abc")
    assert [r.getMessage() for r in caplog.records] == ["token *** and ***", "plain ***"]


def test_out_of_memory_kill_names_the_stage_and_is_retried(tfpipe_home, trainer_image, tmp_path):
    """96 MiB holds prep, which never imports TensorFlow, but not train: train is OOM-killed twice."""
    dags = tmp_path / "dags"
    write_dag(dags, "tiny_memory", resources={"mem_limit": "96m"}, retries=1)
    summary, log = run_dag("tiny_memory", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert summary["state"] == "failed"
    assert summary["tasks"]["prep"] == {"state": "success", "try_number": 1}
    # an OOM kill (exit 137) is a transient failure, so train's retry ran too
    assert summary["tasks"]["train"] == {"state": "failed", "try_number": 2}
    assert summary["tasks"]["evaluate"]["state"] == "upstream_failed"
    killed = re.findall(r"(\w+) was killed by the out-of-memory killer \(exit (\d+), mem_limit=96m\)", log)
    assert killed == [("train", "137"), ("train", "137")], killed
