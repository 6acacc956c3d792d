"""Every example DAG imports cleanly, without connection lookups and without TensorFlow."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
DAG_FILES = sorted(p for p in (REPO / "dags").glob("*.py") if p.name.startswith("tfpipe_"))

PROBE = r"""
import json, sys, time, importlib.util
sys.path.insert(0, sys.argv[1])
t0 = time.perf_counter()
spec = importlib.util.spec_from_file_location("probe_dag", sys.argv[2])
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
elapsed = time.perf_counter() - t0
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "keras", "google.cloud"))
task_time = sorted(m for m in sys.modules if m in TASK_TIME)
tfpipe_modules = sorted(m for m in sys.modules if m.split(".")[0] == "tfpipe")
print(json.dumps({"seconds": elapsed, "heavy": heavy, "dag_id": mod.dag.dag_id, "task_time": task_time,
                  "tfpipe_modules": tfpipe_modules}))
"""
#: tfpipe modules only a running task needs: a DAG file's parse imports none of them.
TASK_TIME_MODULES = ("tfpipe.hooks.docker", "tfpipe.hooks.gcs", "tfpipe.engine_settings", "tfpipe.lineage", "tfpipe.metrics",
                     "tfpipe.run_params", "tfpipe.gcs.sync", "tfpipe.gcs.publish", "tfpipe.exceptions", "tfpipe.settings",
                     "tfpipe.tries", "tfpipe.redact")
PROBE = PROBE.replace("TASK_TIME", repr(TASK_TIME_MODULES))


@pytest.fixture(scope="module")
def dagbag():
    from tfpipe.compat import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_dagbag_has_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert {"tfpipe_digits", "tfpipe_digits_manual", "tfpipe_digits_on_data"} <= set(dagbag.dag_ids)


NO_LOOKUPS = r"""
import os
from airflow.secrets import BaseSecretsBackend


class RecordLookups(BaseSecretsBackend):
    # Records every connection and variable lookup, and answers none.

    def _record(self, kind, key):
        with open(os.environ["TFPIPE_LOOKUP_LOG"], "a") as handle:
            handle.write(f"{kind} {key}\n")

    def get_conn_value(self, conn_id, team_name=None):
        self._record("connection", conn_id)

    def get_variable(self, key, team_name=None):
        self._record("variable", key)
"""

PARSE_THEN_LOOK_UP = r"""
import sys
from tfpipe.compat import DagBag
bag = DagBag(dag_folder=sys.argv[1])
if bag.import_errors:
    sys.exit(f"import errors: {bag.import_errors}")
print("PARSED", len(bag.dags), flush=True)
# the control: a lookup made now must reach the recording backend
try:
    from airflow.sdk import BaseHook
except ImportError:  # Airflow 3.0
    from airflow.hooks.base import BaseHook
try:
    BaseHook.get_connection("control_lookup")
except Exception as err:
    print("control lookup failed as expected:", type(err).__name__)
"""


def test_parsing_the_dags_looks_up_no_connection_or_variable(tmp_path):
    """A secrets backend records every lookup: parsing makes none; a lookup after parsing is seen."""
    (tmp_path / "record_lookups.py").write_text(NO_LOOKUPS)
    lookups = tmp_path / "lookups.txt"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "AIRFLOW__SECRETS__BACKEND": "record_lookups.RecordLookups", "TFPIPE_LOOKUP_LOG": str(lookups),
           "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags")}
    env = {k: v for k, v in env.items() if not k.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_"))}
    proc = subprocess.run([sys.executable, "-c", PARSE_THEN_LOOK_UP, str(REPO / "dags")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 0 and "PARSED" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    recorded = lookups.read_text().splitlines() if lookups.exists() else []
    assert recorded and recorded[-1] == "connection control_lookup", (
        f"the recording backend never saw the control lookup ({recorded}): this test would prove nothing")
    assert recorded == ["connection control_lookup"], f"parsing looked up {recorded[:-1]}"


@pytest.mark.parametrize("path", DAG_FILES, ids=[p.name for p in DAG_FILES])
def test_dag_file_imports_without_tensorflow(path):
    proc = subprocess.run([sys.executable, "-c", PROBE, str(REPO / "dags"), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    assert probe["heavy"] == [], f"{path.name} imported {probe['heavy']}"
    assert probe["task_time"] == [], f"parsing {path.name} imported {probe['task_time']}, which only tasks need"
    # How fast it parses is measured by `make bench` (dag_parse_ratio), not asserted here.
    assert probe["dag_id"] == path.stem


@pytest.mark.parametrize("path", sorted((REPO / "dags").glob("*.py")), ids=lambda p: p.name)
def test_dag_files_name_tfpipe_for_the_dag_processors_pre_import(path):
    """Airflow's DAG processor imports the airflow.* modules a DAG file names once, in its manager,
    before it forks the process that parses the file (``parsing_pre_import_modules``, on by
    default): a file that names ``airflow.providers.tfpipe`` spares every parse of it tfpipe's
    modules and the Docker provider's."""
    from airflow.utils.file import iter_airflow_imports

    assert "airflow.providers.tfpipe" in set(iter_airflow_imports(str(path)))


PROCESSOR_PARSE = r"""
import json, runpy, sys
import airflow.dag_processing.processor as processor
import structlog
path, pre_import = sys.argv[1], sys.argv[2] == "pre-import"
if pre_import:
    # Airflow's own step, as its DAG processor makes it before forking the parsing process
    processor._pre_import_airflow_modules(path, structlog.get_logger())
before = set(sys.modules)
runpy.run_path(path, run_name="processor_probe")
# Airflow 3.0's providers manager reads every provider's info in a process's first DAG build (the
# hand-written file's too): metadata, not what the file builds its DAG with
print(json.dumps(sorted(m for m in set(sys.modules) - before
                        if (m.split(".")[0] == "tfpipe" or m.startswith("airflow.providers.docker"))
                        and not m.endswith(".get_provider_info"))))
"""
#: What a parse of these files still imports in the DAG processor: modules only their pipelines need.
ONLY_THIS_PIPELINE = {"tfpipe_digits_manual.py": {"tfpipe.operators.gcs"},
                      "k8s_tfpipe_digits.py": {"tfpipe.operators.kubernetes", "tfpipe.operators.exits", "tfpipe.exceptions",
                                               "tfpipe.run_params", "tfpipe.settings", "tfpipe.tries"}}


@pytest.mark.parametrize("path", sorted((REPO / "dags").glob("*.py")), ids=lambda p: p.name)
def test_in_the_dag_processor_a_parse_finds_tfpipe_loaded(path):
    """After the pre-import Airflow's DAG processor makes, parsing the file imports none of tfpipe's
    DAG-building modules and not the Docker provider; without it (the control) it imports them."""
    env = {**os.environ, "TFPIPE_HOME": "/srv/tfpipe-probe"}

    def imported(mode: str) -> set[str]:
        proc = subprocess.run([sys.executable, "-c", PROCESSOR_PARSE, str(path), mode], capture_output=True,
                              text=True, timeout=120, env=env, cwd=str(REPO))
        assert proc.returncode == 0, proc.stderr[-3000:]
        return set(json.loads(proc.stdout.strip().splitlines()[-1]))

    control = imported("none")
    assert {"tfpipe.config", "tfpipe.dag_factory", "airflow.providers.docker.operators.docker"} <= control
    left = imported("pre-import")
    assert left <= ONLY_THIS_PIPELINE.get(path.name, set()), f"{path.name}'s parse still imports {sorted(left)}"


def test_the_wheel_ships_the_pre_import_module_and_no_airflow_package_init(tmp_path):
    """``airflow.providers.tfpipe`` reaches an installed provider: the wheel has it, and has no
    ``__init__.py`` of ``airflow`` or ``airflow.providers``, which would replace Airflow's own."""
    import shutil
    import zipfile

    # A copy of what the build reads: setuptools builds in the source tree (build/, egg-info)
    source = tmp_path / "source"
    shutil.copytree(REPO / "provider", source / "provider",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
                           str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("airflow_provider_tfpipe-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "airflow/providers/tfpipe/__init__.py" in names and "tfpipe/dag_factory.py" in names
    assert "airflow_provider_tfpipe.py" in names  # the module Airflow's example-DAG discovery guesses
    assert {n for n in names if n.startswith("airflow/")} == {"airflow/providers/tfpipe/__init__.py"}


def _parse_probe(path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(REPO / "dags"), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_dag_without_a_bucket_parses_without_the_gcs_operators_or_the_plugin():
    """The Cloud Storage operators' module loads only for a DAG with a bucket task, and the UI
    plugin's modules (the extra links' URLs) only when a link is computed, never at parse."""
    plain = _parse_probe(REPO / "dags" / "tfpipe_digits.py")["tfpipe_modules"]
    assert "tfpipe.operators.docker" in plain  # the probe sees tfpipe's modules at all
    assert "tfpipe.operators.gcs" not in plain
    assert [m for m in plain if m.startswith("tfpipe.plugins")] == []
    with_bucket = _parse_probe(REPO / "dags" / "tfpipe_digits_manual.py")["tfpipe_modules"]
    assert "tfpipe.operators.gcs" in with_bucket  # gcs_tasks=True: the stage_in and publish tasks need it
    assert [m for m in with_bucket if m.startswith("tfpipe.plugins")] == []


SHARDED_DAG = """
from tfpipe import PipelineConfig, training_pipeline
dag = training_pipeline(PipelineConfig(
    dag_id="sharded_probe", image={"ref": None},
    volumes={"data": "/srv/data", "work": "/srv/work", "models": "/srv/models"},
    data={"path": "digits", "format": "csv", "label": "label", "shards": 2}))
"""


def test_a_sharded_dag_parses_with_no_tfpipe_module_a_plain_dag_does_not_import(tmp_path):
    """prep_shard and prep_merge's operators live beside the other stages' in
    ``tfpipe.operators.docker``: a plain DAG's parse makes their classes too, and a sharded DAG's
    parse needs no module of its own."""
    plain = _parse_probe(REPO / "dags" / "tfpipe_digits.py")["tfpipe_modules"]
    sharded_file = tmp_path / "sharded_probe.py"
    sharded_file.write_text(SHARDED_DAG)
    sharded = _parse_probe(sharded_file)["tfpipe_modules"]
    assert "tfpipe.operators.docker" in plain  # the probe sees tfpipe's operator modules at all
    assert sorted(set(sharded) - set(plain)) == []


def _scheduled(dag):
    """The DAG's timetable as the scheduler reads it back (the same classes on every Airflow release)."""
    from tfpipe.compat import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dag)).timetable


def test_digits_dag_shape(dagbag):
    dag = dagbag.get_dag("tfpipe_digits")
    # No bucket configured: no Cloud Storage tasks, no Params for them; cleanup beside training.
    stages = ["prep", "validate", "train", "evaluate", "export"]
    assert [t.task_id for t in dag.topological_sort() if t.task_id != "cleanup"] == [*stages, "register"]
    assert set(dag.task_ids) == {*stages, "cleanup", "register"}
    assert dag.get_task("cleanup").upstream_task_ids == {"validate"}
    assert not {"data_uri", "publish_uri"} & set(dag.params.keys())
    assert dag.get_task("prep").trigger_rule == "all_success"
    assert dag.max_active_runs == 1 and dag.catchup is False
    assert _scheduled(dag).summary == "0 3 * * *"
    train = dag.get_task("train")
    # no pool configured: Airflow's default pool, which always exists (a missing pool waits forever)
    assert train.retries == 3 and train.pool == "default_pool" and train.retry_exponential_backoff
    assert dag.get_task("prep").retries == 1
    assert dag.doc_md and all(t.doc_md for t in dag.tasks)
    assert [o.uri for o in dag.get_task("export").outlets] == ["tfpipe://models/digits"]


def test_default_args_and_dag_callbacks_reach_every_task_training_pipeline_makes(tmp_path):
    """Alerts are Airflow's own: training_pipeline passes its keyword arguments to the DAG, so
    default_args reach the stages, the Cloud Storage tasks and cleanup alike (README: Alerts)."""
    from tfpipe import PipelineConfig, training_pipeline

    def on_failure(context):
        return None

    def on_retry(context):
        return None

    def on_dag_failure(context):
        return None

    cfg = PipelineConfig(dag_id="alerted", image={"ref": None},
                         volumes={k: str(tmp_path / k) for k in ("data", "work", "models")},
                         data={"path": "digits/digits.csv"},
                         data_uri="gs://raw-bucket/digits", publish_uri="gs://model-bucket/models")
    dag = training_pipeline(cfg, on_failure_callback=on_dag_failure, max_active_runs=2, default_args={
        "owner": "ml-platform", "on_failure_callback": on_failure, "on_retry_callback": on_retry,
        "email": ["ml-oncall@example.com"]})
    assert set(dag.task_ids) == {"stage_in", "prep", "validate", "train", "evaluate", "export", "publish", "cleanup",
                                 "register"}
    for task in dag.tasks:
        assert list(task.on_failure_callback) == [on_failure], task.task_id
        assert list(task.on_retry_callback) == [on_retry], task.task_id
        assert task.owner == "ml-platform" and list(task.email) == ["ml-oncall@example.com"], task.task_id
    assert dag.on_failure_callback is on_dag_failure
    assert dag.max_active_runs == 2  # in place of tfpipe's 1


def test_example_dags_name_no_image_and_read_the_variable(dagbag):
    """A dags/ folder deploys as it is: no image baked in at parse time, none nothing builds."""
    for dag_id in ("tfpipe_digits", "tfpipe_digits_manual", "tfpipe_digits_on_data"):
        dag = dagbag.get_dag(dag_id)
        images = {t.task_id: getattr(t, "image", "n/a") for t in dag.tasks}
        assert set(images.values()) == {None}, images
        assert "Airflow Variable `tfpipe_image`" in dag.doc_md


def test_trigger_form_params(dagbag):
    dag = dagbag.get_dag("tfpipe_digits_manual")
    params = dag.params
    for name in ("epochs", "batch_size", "learning_rate", "model", "optimizer", "gpus", "warm_start", "data_uri",
                 "publish_uri"):
        assert name in params, name
    # advanced overrides a run's conf may carry (tests/provider/test_specs.py) are kept off the form
    for name in ("early_stopping_patience", "gradient_clip_norm", "checkpoint_every_steps"):
        assert name not in params, name
    # gcs_tasks: the buckets are chosen per run, so both tasks are there
    assert {"stage_in", "publish"} <= set(dag.task_ids)
    assert dag.get_task("stage_in").downstream_task_ids == {"prep"}
    assert dag.get_task("publish").upstream_task_ids == {"export"}
    schema = params.get_param("epochs").schema
    assert schema["type"] == "integer" and schema["minimum"] == 1


@pytest.mark.reliability
@pytest.mark.parametrize("conf", [
    {"epochs": 0}, {"epochs": "ten"}, {"batch_size": -1}, {"learning_rate": 0},
    {"model": "transformer"}, {"optimizer": "lion"}, {"gpus": "many"}, {"warm_start": "yes"},
])
def test_bad_run_parameters_are_rejected_before_a_run(dagbag, conf):
    from airflow.providers.common.compat.sdk import ParamValidationError

    params = copy.deepcopy(dagbag.get_dag("tfpipe_digits_manual").params)
    with pytest.raises(ParamValidationError):
        for key, value in conf.items():
            params[key] = value
        params.validate()


def test_asset_triggered_dag(dagbag):
    dag = dagbag.get_dag("tfpipe_digits_on_data")
    timetable = _scheduled(dag)
    assert "Asset" in type(timetable).__name__ and "data/digits" in repr(timetable.asset_condition)


def test_provider_does_not_import_tensorflow():
    code = ("import sys, tfpipe, tfpipe.operators.docker, tfpipe.dag_factory, tfpipe.cli, tfpipe.contract; "
            "print([m for m in sys.modules if m.startswith(('tensorflow', 'keras'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"  # older Airflow logs its own start-up to stdout first


def test_airflow_lists_the_provider():
    proc = subprocess.run([str(Path(sys.executable).parent / "airflow"), "providers", "list", "-o", "json"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # the JSON list is the last thing printed; older Airflow prints log and warning lines before it
    listing = next(json.loads(line) for line in reversed(proc.stdout.splitlines()) if line.startswith("[{"))
    assert "airflow-provider-tfpipe" in [p["package_name"] for p in listing]


@pytest.mark.reliability
def test_tfpipe_run_rejects_bad_parameters_before_a_run():
    env = {**__import__("os").environ, "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags")}
    proc = subprocess.run([sys.executable, "-m", "tfpipe.cli", "run", "tfpipe_digits_manual", "--conf",
                           '{"epochs": 0}'], capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout == ""
    assert "rejected the run parameters" in proc.stderr and "epochs" in proc.stderr
    assert "Traceback" not in proc.stderr
