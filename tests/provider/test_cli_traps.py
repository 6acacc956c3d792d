"""Three traps of a first tfpipe DAG, each met with the cause and the fix instead of a riddle.

* a DAG file that imports only ``tfpipe``: Airflow's DAG discovery safe mode never reads it;
* ``tfpipe run`` in an ``AIRFLOW_HOME`` whose metadata DB was never migrated;
* ``dags/`` copied into an Airflow without the Kubernetes provider.

Each is run for real: a ``tfpipe run`` or a DAG parse in a fresh interpreter, on real files.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import REPO, parse_summary

#: A user's DAG file as a newcomer writes it: tfpipe's API only, no word of Airflow in it.
ONLY_TFPIPE = '''"""My digits pipeline."""
from tfpipe import PipelineConfig, training_pipeline

pipeline = training_pipeline(
    PipelineConfig(
        dag_id="{dag_id}",
        image={{"ref": "tfpipe/trainer:1f14aed53083"}},
        volumes={{"data": "/srv/ml/data", "work": "/srv/ml/work", "models": "/srv/ml/models"}},
        data={{"path": "digits/digits.csv"}},
        export={{"model_name": "digits"}},
    )
)
'''

TINY_DAG = '''"""One Python task."""
import pendulum
from airflow.sdk import DAG, task

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    @task(retries=0)
    def one():
        return None

    one()
'''


def _tfpipe(args: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfpipe.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def _bag(dags: Path, env: dict[str, str]) -> dict:
    """``{"dag_ids": [...], "import_errors": {...}}`` of a DagBag of ``dags`` in a fresh interpreter."""
    code = ("import json, sys\nfrom tfpipe.compat import DagBag\n"
            "bag = DagBag(dag_folder=sys.argv[1])\n"
            "print(json.dumps({'dag_ids': sorted(bag.dag_ids), 'import_errors': {k: str(v) for k, v in "
            "bag.import_errors.items()}}))")
    proc = subprocess.run([sys.executable, "-c", code, str(dags)], env=env, capture_output=True, text=True,
                          timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- 1. a DAG file that names only tfpipe ------------------------------------------------------------

def test_a_dag_file_naming_only_tfpipe_is_named_with_the_safe_mode_fix_when_its_dag_is_not_found(tmp_path):
    """``tfpipe run`` of a DAG whose file Airflow's safe mode skipped names that file, why it was
    skipped and the fixes; a file that does not use tfpipe is not named; and the fix it gives works:
    with the ``airflow.sdk`` import line added, Airflow reads the file and finds the DAG."""
    dags = tmp_path / "dags"
    (dags / "team").mkdir(parents=True)
    user_file = dags / "team" / "my_digits.py"
    user_file.write_text(ONLY_TFPIPE.format(dag_id="user_only_tfpipe"))
    (dags / "helpers.py").write_text("def double(x):\n    return 2 * x\n")  # no tfpipe: not a suspect
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
    env.pop("AIRFLOW__CORE__DAG_DISCOVERY_SAFE_MODE", None)

    proc = _tfpipe(["run", "user_only_tfpipe", "--dags-folder", str(dags)], env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stdout == ""
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith(f"tfpipe: no DAG 'user_only_tfpipe' in {dags} (found: none). "
                              "Airflow did not read team/my_digits.py: it uses tfpipe, but Airflow's DAG "
                              "discovery safe mode reads only files whose text names both \"airflow\" and \"dag\"."), \
        message
    assert "Fix: add the line `from airflow.sdk import DAG  # noqa: F401`" in message
    assert "or set AIRFLOW__CORE__DAG_DISCOVERY_SAFE_MODE=False" in message
    assert "helpers.py" not in message and "Traceback" not in proc.stderr

    # both fixes it names make Airflow read the file
    assert _bag(dags, {**env, "AIRFLOW__CORE__DAG_DISCOVERY_SAFE_MODE": "False"})["dag_ids"] == ["user_only_tfpipe"]
    assert _bag(dags, env)["dag_ids"] == [], "the control: in safe mode the file is skipped"
    user_file.write_text("from airflow.sdk import DAG  # noqa: F401\n" + user_file.read_text())
    assert _bag(dags, env) == {"dag_ids": ["user_only_tfpipe"], "import_errors": {}}


def test_a_missing_dag_among_files_airflow_reads_gets_no_safe_mode_advice(tmp_path):
    """When every file that uses tfpipe was read, the message lists the DAGs found and nothing more."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "one.py").write_text(TINY_DAG.format(dag_id="cli_traps_one"))
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags)}
    proc = _tfpipe(["run", "cli_traps_other", "--dags-folder", str(dags)], env)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == \
        f"tfpipe: no DAG 'cli_traps_other' in {dags} (found: cli_traps_one)"


# --- 2. an AIRFLOW_HOME whose metadata DB was never migrated -----------------------------------------

def _fresh_home_env(home: Path, dags: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW__DATABASE__", "AIRFLOW__LOGGING__")) and k != "AIRFLOW_CONFIG"}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    return env


def test_tfpipe_run_in_a_fresh_airflow_home_creates_its_sqlite_db_says_so_and_runs(tmp_path):
    """A new ``AIRFLOW_HOME`` (no ``airflow db migrate`` yet): ``tfpipe run`` says which DB it creates,
    creates it as ``airflow db migrate`` does, and the run succeeds; no ``no such table`` error."""
    home, dags = tmp_path / "home", tmp_path / "dags"
    home.mkdir()
    dags.mkdir()
    (dags / "tiny.py").write_text(TINY_DAG.format(dag_id="cli_traps_fresh"))
    proc = _tfpipe(["run", "cli_traps_fresh", "--dags-folder", str(dags)], _fresh_home_env(home, dags))
    summary = parse_summary(proc.stdout, proc.stderr, proc.returncode)
    assert proc.returncode == 0 and summary["state"] == "success", proc.stderr[-4000:]
    db = home / "airflow.db"
    assert f"tfpipe: Airflow's metadata DB at sqlite:///{db} is empty (a new AIRFLOW_HOME): creating it, as " \
           "`airflow db migrate` does" in proc.stderr, proc.stderr[-3000:]
    assert "no such table" not in proc.stderr
    with sqlite3.connect(db) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"dag", "dag_run", "task_instance", "alembic_version"} <= tables


def test_a_sqlite_db_holding_other_tables_is_not_migrated_and_the_error_names_it_and_the_fix(tmp_path):
    """A DB that is not empty but not Airflow's (a wrong ``sql_alchemy_conn``) is left alone: the
    command stops before any run, naming the DB and ``airflow db migrate``."""
    home, dags = tmp_path / "home", tmp_path / "dags"
    home.mkdir()
    dags.mkdir()
    (dags / "tiny.py").write_text(TINY_DAG.format(dag_id="cli_traps_other_db"))
    db = tmp_path / "someone_elses.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    env = {**_fresh_home_env(home, dags), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{db}"}
    proc = _tfpipe(["run", "cli_traps_other_db", "--dags-folder", str(dags)], env)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1] == (
        f"tfpipe: Airflow's metadata DB at sqlite:///{db} (AIRFLOW_HOME={home}) has no Airflow tables "
        "(it has 1 other tables). Fix: run `airflow db migrate` with this AIRFLOW_HOME, or point AIRFLOW_HOME / "
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN at the DB you migrated.")
    with sqlite3.connect(db) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["invoices"]


def test_the_db_named_in_errors_has_its_password_hidden(monkeypatch):
    """The DB the errors name is ``sql_alchemy_conn`` as Airflow reads it, its password written ``***``."""
    import airflow.configuration  # noqa: F401 -- Airflow starts on this session's DB before the env changes

    from tfpipe.cli.common import metadata_db_url

    secret = "s3cr3t-pw"
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", f"postgresql://airflow:{secret}@db.internal:5432/airflow")
    assert metadata_db_url() == "postgresql://airflow:***@db.internal:5432/airflow"
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "sqlite:////srv/airflow/airflow.db")
    assert metadata_db_url() == "sqlite:////srv/airflow/airflow.db"


# --- 3. dags/ in an Airflow without the Kubernetes provider -----------------------------------------

#: Parses the Kubernetes example in a fresh interpreter; with "refuse", as if the provider were not
#: installed: a finder ahead of all others answers every import of it with ModuleNotFoundError.
PARSE_K8S = textwrap.dedent('''
    import json, logging, sys

    class RefuseKubernetesProvider:
        def find_spec(self, name, path=None, target=None):
            if name == "airflow.providers.cncf.kubernetes" or name.startswith("airflow.providers.cncf.kubernetes."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    from tfpipe.compat import DagBag

    if sys.argv[2] == "refuse":
        # after Airflow's start-up: its provider discovery loads the installed provider's entry point,
        # which an Airflow without the provider does not have; then the provider is gone
        for name in [m for m in sys.modules if m.startswith("airflow.providers.cncf.kubernetes")]:
            del sys.modules[name]
        sys.meta_path.insert(0, RefuseKubernetesProvider())
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logging.getLogger().addHandler(handler)
    bag = DagBag(dag_folder=sys.argv[1])
    print(json.dumps({"dag_ids": sorted(bag.dag_ids), "import_errors": {k: str(v) for k, v in bag.import_errors.items()},
                      "said": [m for m in records if m.startswith("k8s_tfpipe_digits")],
                      "provider_loaded": any(m.startswith("airflow.providers.cncf.kubernetes") for m in sys.modules)}))
''')


def _parse_k8s_example(mode: str) -> dict:
    env = {**os.environ, "AIRFLOW_VAR_TFPIPE_IMAGE": "registry.example:5000/tfpipe/trainer:3f2a9c1b7e4d"}
    proc = subprocess.run([sys.executable, "-c", PARSE_K8S, str(REPO / "dags" / "k8s_tfpipe_digits.py"), mode],
                          env=env, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_kubernetes_example_without_the_provider_is_skipped_with_a_log_line_not_an_import_error():
    """Without the Kubernetes provider the example builds no DAG, records no import error, and logs
    why and the fix; with the provider (this venv has it: requirements/host.lock) it is the DAG."""
    without = _parse_k8s_example("refuse")
    assert without["import_errors"] == {} and without["dag_ids"] == [], without
    assert not without["provider_loaded"], "the refusing finder kept the provider out"
    assert len(without["said"]) == 1 and without["said"][0].startswith(
        "k8s_tfpipe_digits: not built: the Kubernetes provider (apache-airflow-providers-cncf-kubernetes) is "
        "not installed. Fix: pip install 'airflow-provider-tfpipe[kubernetes]'"), without["said"]

    installed = _parse_k8s_example("allow")
    assert installed["import_errors"] == {} and installed["dag_ids"] == ["k8s_tfpipe_digits"], installed
    assert installed["said"] == [] and installed["provider_loaded"]
