"""Shared fixtures of the host test suite.

Airflow reads its configuration when first imported, so the environment is set here, before
any test module imports it: a project-local AIRFLOW_HOME (SQLite), this repo's dags/, no
example DAGs. `make test` sets the same values.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("AIRFLOW_HOME", str(REPO / ".airflow"))
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(REPO / "dags"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")

DIGITS_CSV = REPO / ".demo" / "data" / "digits" / "digits.csv"


def trainer_image_ref() -> str:
    """The trainer image `make image` built (content-tagged)."""
    ref = os.environ.get("TFPIPE_IMAGE")
    if not ref:
        marker = REPO / ".cache" / "trainer-image"
        if not marker.exists():
            pytest.fail("no trainer image: run `make image` (or `make test`, which builds it) first")
        ref = marker.read_text().strip()
    return ref


@pytest.fixture(scope="session")
def trainer_image() -> str:
    """The trainer image reference; fails (does not skip) when it is missing."""
    ref = trainer_image_ref()
    if subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode != 0:
        pytest.fail(f"trainer image {ref} is not in the Docker engine: run `make image`")
    return ref


@pytest.fixture(scope="session")
def docker_client():
    """A docker-py client of the local engine (the real one; `make test` starts it)."""
    import docker

    client = docker.from_env()
    client.ping()
    return client


@pytest.fixture
def tfpipe_home(tmp_path: Path) -> Path:
    """A fresh data/work/models tree holding the digits CSV."""
    if not DIGITS_CSV.exists():
        pytest.fail(f"{DIGITS_CSV} is missing: run `make data`")
    home = tmp_path / "home"
    (home / "data" / "digits").mkdir(parents=True)
    shutil.copy(DIGITS_CSV, home / "data" / "digits" / "digits.csv")
    yield home
    # Stage containers write as uid 1000; the tmp tree is removed by pytest as root.


def dag_command(dag_id: str, conf: dict | None, *, home: Path, image: str, extra_env: dict | None = None,
                dags_folder: Path | None = None, rerun: str | None = None,
                rerun_tasks: list[str] | None = None) -> tuple[list[str], dict]:
    """The `tfpipe run` command line and environment for one DAG run (or re-run)."""
    # DAG files that name no image read the Airflow Variable tfpipe_image; Airflow also takes a
    # Variable from AIRFLOW_VAR_<NAME>, which keeps each test independent of the DB's Variables.
    env = {**os.environ, "TFPIPE_HOME": str(home), "TFPIPE_IMAGE": image, "AIRFLOW_VAR_TFPIPE_IMAGE": image,
           "TFPIPE_RETRY_DELAY": "1",
           "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    cmd = [sys.executable, "-m", "tfpipe.cli", "run", dag_id, "--conf", json.dumps(conf or {})]
    if dags_folder:  # dag.test() syncs the configured bundle, so point Airflow at it too
        cmd += ["--dags-folder", str(dags_folder)]
        env["AIRFLOW__CORE__DAGS_FOLDER"] = str(dags_folder)
    if rerun:
        cmd += ["--rerun", rerun]
    for task_id in rerun_tasks or []:
        cmd += ["--task", task_id]
    return cmd, env


def parse_summary(stdout: str, stderr: str = "", returncode: int | None = None) -> dict:
    """The JSON summary line `tfpipe run` prints last."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"tfpipe run printed no summary (exit {returncode}):\n"
                             f"{stdout[-3000:]}\n{stderr[-6000:]}")
    return json.loads(lines[-1])


def run_dag(dag_id: str, conf: dict | None, *, timeout: int = 900, **kwargs) -> tuple[dict, str]:
    """Run one DAG run through `tfpipe run` in a fresh interpreter; return (summary, log)."""
    cmd, env = dag_command(dag_id, conf, **kwargs)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    return parse_summary(proc.stdout, proc.stderr, proc.returncode), proc.stdout + proc.stderr


def write_dag(folder: Path, dag_id: str, **config) -> Path:
    """Write a test DAG file: the digits pipeline with ``config`` overrides."""
    folder.mkdir(parents=True, exist_ok=True)
    settings = {
        "data": {"path": "digits/digits.csv"},
        "training": {"model": "mlp", "epochs": 15, "batch_size": 32, "learning_rate": 0.002},
        "evaluation": {"threshold": 0.5, "tolerance": 0.5},  # tests exercise mechanics, not quality
        "export": {"model_name": dag_id},
        "retry_delay_seconds": 1,
        **config,
    }
    path = folder / f"{dag_id}.py"
    path.write_text(f'''"""Airflow DAG written by a test."""
import os
from tfpipe import PipelineConfig, training_pipeline

HOME = os.environ["TFPIPE_HOME"]
dag = training_pipeline(PipelineConfig.from_dict({{
    "dag_id": {dag_id!r},
    "image": {{"ref": os.environ["TFPIPE_IMAGE"]}},
    "volumes": {{"data": f"{{HOME}}/data", "work": f"{{HOME}}/work", "models": f"{{HOME}}/models"}},
    **{settings!r},
}}))
''')
    return path
