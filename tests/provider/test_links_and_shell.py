"""Extra links and the pure builders behind `tfpipe shell` / `tfpipe tensorboard` (no engine)."""

from __future__ import annotations

import json

import pytest

from tfpipe import contract, reproduce
from tfpipe import links as run_links
from tfpipe.config import PipelineConfig
from tfpipe.dag_factory import pipeline_params, training_pipeline
from tfpipe.config import GpuRequest
from tfpipe.specs import MountSpec

RUN_ID = "manual__2026-11-29T18:10:11.460351+00:00"
SAFE_RUN = "manual__2026-11-29T18_10_11.460351_00_00"
HOME = "/srv/ml"


RESOURCES = {"environment": {"WANDB_MODE": "offline"}, "private_environment": {"API_TOKEN": "s3cr3t"},
             "gpus": "all", "gpu_fallback": "cpu", "mem_limit": "8g", "network_mode": "none"}


def _cfg(**overrides) -> PipelineConfig:
    settings = {
        "dag_id": "dbg",
        "image": {"ref": "tfpipe/trainer:1f14aed53083"},
        "volumes": {"data": f"{HOME}/data", "work": f"{HOME}/work", "models": f"{HOME}/models"},
        "data": {"path": "digits/digits.csv"},
        "training": {"model": "mlp", "epochs": 4},
        "export": {"model_name": "digits"},
        "resources": RESOURCES,
        **overrides,
    }
    return PipelineConfig.from_dict(settings)


@pytest.fixture(scope="module")
def dag():
    return training_pipeline(_cfg(gcs_tasks=True))  # with the Cloud Storage tasks, which carry no links


def _key(task_id: str, run_id: str = RUN_ID):
    from airflow.providers.common.compat.sdk import TaskInstanceKey

    return TaskInstanceKey(dag_id="dbg", task_id=task_id, run_id=run_id, try_number=1, map_index=-1)


# --- paths and URLs ----------------------------------------------------------------------------

def test_host_path_maps_the_three_mounts_only(dag):
    volumes = dag.get_task("train").volumes
    assert run_links.host_path("/work/runs/x/report.html", volumes) == f"{HOME}/work/runs/x/report.html"
    assert run_links.host_path("/models/digits/3/report/report.html", volumes) == f"{HOME}/models/digits/3/report/report.html"
    assert run_links.host_path("/data", volumes) == f"{HOME}/data"
    assert run_links.host_path("/workshop/x", volumes) is None, "a prefix match is not a mount"
    assert run_links.host_path("/etc/passwd", volumes) is None and run_links.host_path(None, volumes) is None
    assert run_links.host_run_dir(volumes, "dbg", RUN_ID) == f"{HOME}/work/runs/dbg/{SAFE_RUN}"
    assert run_links.host_tensorboard_dir(volumes, "dbg", RUN_ID).endswith(f"{SAFE_RUN}/train/tensorboard")


def test_tensorboard_url_selects_the_run(monkeypatch):
    monkeypatch.delenv(run_links.TENSORBOARD_URL_ENV, raising=False)
    url = run_links.tensorboard_url("dbg", RUN_ID)
    # TensorBoard 2.9 reads ?runFilter=<regex> into the run selector; '.' escaped to match literally
    assert url == f"http://localhost:6006/?runFilter=dbg%2F{SAFE_RUN.replace('.', '%5C.')}#timeseries"
    monkeypatch.setenv(run_links.TENSORBOARD_URL_ENV, "https://tb.example.org:8443/")
    assert run_links.tensorboard_url("dbg", RUN_ID).startswith("https://tb.example.org:8443/?runFilter=dbg%2F")
    assert run_links.tensorboard_run_name("dbg", RUN_ID) == f"dbg/{SAFE_RUN}"


# --- operator extra links ----------------------------------------------------------------------

def test_stage_operators_carry_the_links(dag):
    names = {t.task_id: sorted(link.name for link in t.operator_extra_links) for t in dag.tasks}
    for task_id in ("evaluate", "export"):
        assert names[task_id] == ["Run report", "TensorBoard"], task_id
    assert names["train"] == ["MLflow run", "Run report", "TensorBoard"]
    assert names["prep"] == [] and names["stage_in"] == [] and names["publish"] == []


def test_links_point_at_the_plugin_under_the_api_server(dag, monkeypatch):
    """get_link as the worker calls it when the task ends: the plugin's routes, one per run."""
    quoted = "manual__2026-11-29T18%3A10%3A11.460351%2B00%3A00"
    monkeypatch.delenv("AIRFLOW__API__BASE_URL", raising=False)
    links = {}
    for task_id in ("train", "evaluate", "export"):
        op = dag.get_task(task_id)
        links[task_id] = {link.name: link.get_link(op, ti_key=_key(task_id)) for link in op.operator_extra_links}
    assert {v["Run report"] for v in links.values()} == {f"/tfpipe/runs/dbg/{quoted}/report/"}
    assert {v["TensorBoard"] for v in links.values()} == {f"/tfpipe/runs/dbg/{quoted}/tensorboard/"}
    # behind a configured base URL (another host, or a path prefix) the links are absolute
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "https://airflow.example.org/ml/")
    op = dag.get_task("export")
    link = next(link for link in op.operator_extra_links if link.name == "Run report")
    assert link.get_link(op, ti_key=_key("export")) == f"https://airflow.example.org/ml/tfpipe/runs/dbg/{quoted}/report/"


def test_links_survive_dag_serialization(dag):
    from tfpipe.compat import DagSerialization

    data = DagSerialization.to_dict(dag)
    json.dumps(data)
    encoded = {t["__var"]["task_id"]: t["__var"].get("_operator_extra_links") for t in data["dag"]["tasks"]}
    expected = {"Run report": "_link_RunReportLink", "TensorBoard": "_link_TensorBoardLink"}
    assert encoded["evaluate"] == encoded["export"] == expected
    assert encoded["train"] == {**expected, "MLflow run": "_link_MlflowRunLink"}
    restored = DagSerialization.from_dict(data)
    # the UI side reads the URL the worker stored in XCom under each xcom_key
    assert {link.name: link.xcom_key for link in restored.get_task("export").operator_extra_links} == expected


def test_provider_info_registers_the_links():
    import importlib

    from airflow.providers_manager import ProvidersManager

    from tfpipe.get_provider_info import get_provider_info

    classes = get_provider_info()["extra-links"]
    assert classes == ["tfpipe.links.RunReportLink", "tfpipe.links.TensorBoardLink"]
    loaded = [getattr(importlib.import_module(c.rsplit(".", 1)[0]), c.rsplit(".", 1)[1]) for c in classes]
    assert {cls().name for cls in loaded} == {"Run report", "TensorBoard"}
    assert set(classes) <= set(ProvidersManager().extra_links_class_names), "Airflow discovers them"


def test_doc_md_explains_every_param():
    cfg = _cfg()
    doc = training_pipeline(cfg).doc_md
    for name in pipeline_params(cfg):
        row = next((line for line in doc.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"Param {name} is not in the DAG's doc_md"
        meaning = row.rsplit("|", 2)[-2].strip()
        assert len(meaning) > 12, f"Param {name} has no meaning in doc_md: {row}"


# --- what a task's container is ----------------------------------------------------------------

def test_task_plan_is_what_execute_builds(dag):
    train = dag.get_task("train")
    params = {**dag.params.dump(), "epochs": 7, "gpus": "1"}
    plan = reproduce.task_plan(train, dag_id="dbg", run_id=RUN_ID, try_number=3, params=params)
    config = json.loads(plan.environment[contract.CONFIG_ENV])
    assert config == plan.config
    assert config["stage"] == "train" and config["training"]["epochs"] == 7
    assert config["run"] == {"dag_id": "dbg", "run_id": RUN_ID, "task_id": "train", "try_number": 3,
                             "image": "tfpipe/trainer:1f14aed53083"}
    assert config["paths"]["run_dir"] == f"/work/runs/dbg/{SAFE_RUN}"
    assert plan.image == "tfpipe/trainer:1f14aed53083"
    assert plan.command == ("python3", "-m", "trainer", "train")
    assert plan.mounts == (MountSpec(f"{HOME}/data", "/data", True), MountSpec(f"{HOME}/work", "/work", False),
                           MountSpec(f"{HOME}/models", "/models", False))
    assert plan.user == "1000:1000" and plan.network_mode == "none" and plan.mem_limit == "8g"
    assert plan.shm_size == 1 << 30
    assert plan.gpus == GpuRequest(count=1), "the run's gpus Param applies to a GPU stage"
    assert plan.environment["WANDB_MODE"] == "offline" and plan.environment["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert "API_TOKEN" not in plan.environment and plan.left_out == ("API_TOKEN",)
    assert "s3cr3t" not in json.dumps(dict(plan.environment))
    assert plan.labels["tfpipe.try_number"] == "3" and plan.labels["tfpipe.stage"] == "train"
    # export is no GPU stage: the gpus Param does not reach it
    export = reproduce.task_plan(dag.get_task("export"), dag_id="dbg", run_id=RUN_ID, try_number=1, params=params)
    assert export.gpus is None and export.config["export"]["model_name"] == "digits"
    # an image recorded by the run wins over the DAG's current one, in the config too
    pinned = reproduce.task_plan(train, dag_id="dbg", run_id=RUN_ID, try_number=1, params=params,
                             image="tfpipe/trainer:0123456789ab")
    assert pinned.image == pinned.config["run"]["image"] == "tfpipe/trainer:0123456789ab"


def _opt(args: list[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == flag]


def test_shell_args(dag):
    plan = reproduce.task_plan(dag.get_task("evaluate"), dag_id="dbg", run_id=RUN_ID, try_number=2,
                           params=dag.params.dump())
    args = reproduce.shell_args(plan, dag_id="dbg", run_id=RUN_ID, task_id="evaluate", name="tfpipe-shell-x")
    assert args[:3] == ["docker", "run", "--rm"] and "--interactive" in args and "--tty" in args
    image_at = args.index(plan.image)
    assert args[image_at + 1:image_at + 3] == ["sh", "-c"] and "exec bash" in args[image_at + 3]
    assert "python3 -m trainer evaluate" in args[-1], "the banner says how to rerun the stage"
    head = args[:image_at]
    assert "tfpipe.role=shell" in _opt(head, "--label") and "tfpipe.run_id=" + RUN_ID in _opt(head, "--label")
    assert _opt(head, "--user") == ["1000:1000"] and _opt(head, "--network") == ["none"]
    assert _opt(head, "--shm-size") == [str(1 << 30)] and _opt(head, "--memory") == ["8g"]
    assert _opt(head, "--gpus") == ["all"]
    assert _opt(head, "--mount") == [f"type=bind,src={HOME}/data,dst=/data,readonly",
                                     f"type=bind,src={HOME}/work,dst=/work",
                                     f"type=bind,src={HOME}/models,dst=/models"]
    env = dict(e.split("=", 1) for e in _opt(head, "--env"))
    assert json.loads(env[contract.CONFIG_ENV]) == plan.config and "API_TOKEN" not in env
    assert "s3cr3t" not in " ".join(args)
    assert _opt(head, "--workdir") == [], "no working dir of its own: the image's, as the task's"
    assert _opt(head, "--cpus") == [], "no CPU limit in the config, none in the shell"

    detached = reproduce.shell_args(plan, dag_id="dbg", run_id=RUN_ID, task_id="evaluate", detach=True, gpus=False)
    assert detached[-2:] == ["sleep", "infinity"] and "--detach" in detached and "--tty" not in detached
    assert "--gpus" not in detached
    printed = reproduce.printable(args)
    assert printed.startswith("docker run --rm") and "'TFPIPE_CONFIG={" in printed


@pytest.mark.parametrize("cpus, arg", [(1.5, "1.5"), (4, "4"), (0.01, "0.01")])
def test_the_shell_has_the_tasks_cpu_limit(cpus, arg):
    task = training_pipeline(_cfg(resources={**RESOURCES, "cpus": cpus})).get_task("train")
    plan = reproduce.task_plan(task, dag_id="dbg", run_id=RUN_ID, try_number=1, params=None)
    assert plan.cpus == cpus and task.nano_cpus == round(cpus * 1e9)
    args = reproduce.shell_args(plan, dag_id="dbg", run_id=RUN_ID, task_id="train")
    assert _opt(args, "--cpus") == [arg], "Docker's --cpus, which sets the NanoCpus the task's container has"


def test_mount_gpu_and_engine_arguments():
    assert reproduce.mount_arg(MountSpec("/srv/a,b", "/data", True)) == 'type=bind,"src=/srv/a,b",dst=/data,readonly'
    assert reproduce.gpus_arg(GpuRequest(count=-1)) == "all"
    assert reproduce.gpus_arg(GpuRequest(count=2)) == "2"
    assert reproduce.gpus_arg(GpuRequest(device_ids=("0", "1"))) == '"device=0,1"'
    assert reproduce.docker_base("unix://var/run/docker.sock") == ["docker"]
    assert reproduce.docker_base("unix:///run/docker.sock") == ["docker"]
    assert reproduce.docker_base("tcp://gpu-host-1:2376") == ["docker", "-H", "tcp://gpu-host-1:2376"]


def test_tensorboard_args():
    args = reproduce.tensorboard_args(image="tfpipe/trainer:1f14aed53083", event_dir="/srv/ml/work/runs/dbg/r/train/tensorboard",
                                  dag_id="dbg", run_id=RUN_ID, port=6106, user="1000:1000", detach=True)
    assert args[:4] == ["docker", "run", "--rm", "--detach"]
    assert _opt(args, "--publish") == ["127.0.0.1:6106:6006"], "published on the loopback only"
    assert _opt(args, "--mount") == [
        f"type=bind,src=/srv/ml/work/runs/dbg/r/train/tensorboard,dst=/logs/dbg/{SAFE_RUN},readonly"]
    assert "tfpipe.role=tensorboard" in _opt(args, "--label")
    assert not any(label.startswith("tfpipe.dag_id=") for label in _opt(args, "--label")), \
        "a TensorBoard is no stage container of the run"
    assert args[args.index("tfpipe/trainer:1f14aed53083") + 1:] == [
        "tensorboard", "--logdir", "/logs", "--host", "0.0.0.0", "--port", "6006"]


def test_tensorboards_per_engine_default_to_four_and_follow_the_variable(monkeypatch):
    """TFPIPE_TENSORBOARD_MAX caps the api-server's TensorBoards (the engine test evicts by it)."""
    from tfpipe.plugins.run_access import TensorBoards

    monkeypatch.delenv("TFPIPE_TENSORBOARD_MAX", raising=False)
    assert TensorBoards.max_running() == 4
    monkeypatch.setenv("TFPIPE_TENSORBOARD_MAX", "9")
    assert TensorBoards.max_running() == 9
    monkeypatch.setenv("TFPIPE_TENSORBOARD_MAX", "0")
    assert TensorBoards.max_running() == 1, "the run asked for always gets its TensorBoard"


@pytest.mark.parametrize("name, bad", [("TFPIPE_TENSORBOARD_MAX", "four"), ("TFPIPE_TENSORBOARD_MAX", "2.5"),
                                       ("TFPIPE_TENSORBOARD_IDLE_S", "30m")])
def test_a_bad_tensorboard_setting_names_the_variable_and_the_fix(monkeypatch, name, bad):
    from tfpipe.config import TfpipeConfigError
    from tfpipe.plugins.run_access import TensorBoards

    monkeypatch.setenv(name, bad)
    read = TensorBoards.max_running if name.endswith("MAX") else TensorBoards.idle_seconds
    with pytest.raises(TfpipeConfigError, match=f"{name}='{bad}' is not .*Fix: set {name}"):
        read()
    monkeypatch.setenv("TFPIPE_TENSORBOARD_IDLE_S", "90.5")
    assert TensorBoards.idle_seconds() == 90.5
    monkeypatch.delenv("TFPIPE_TENSORBOARD_IDLE_S")
    assert TensorBoards.idle_seconds() == 1800, "the docs: an idle TensorBoard goes after 1800 s by default"


def test_jupyter_args_publish_on_loopback_with_a_token(dag):
    plan = reproduce.task_plan(dag.get_task("train"), dag_id="dbg", run_id=RUN_ID, try_number=1,
                           params=dag.params.dump())
    args = reproduce.jupyter_args(plan, port=8899, token="tok")
    assert _opt(args, "--publish") == ["127.0.0.1:8899:8888"]
    assert _opt(args, "--network") == ["bridge"], "network_mode='none' cannot publish a port"
    assert "JUPYTER_TOKEN=tok" in _opt(args, "--env") and "tfpipe.role=shell" in _opt(args, "--label")
    assert args[args.index(plan.image) + 1:][:2] == ["jupyter", "lab"]
    assert reproduce.jupyter_url(8899, "tok") == "http://127.0.0.1:8899/lab?token=tok"


def test_cli_parses_the_new_subcommands():
    import argparse

    from tfpipe import cli

    parser = argparse.ArgumentParser()
    cli._add_debug_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["shell", "tfpipe_digits", "train"])
    assert (args.run, args.port, args.jupyter, args.print, args.detach) == ("latest", 8888, False, False, False)
    assert args.map_index is None
    args = parser.parse_args(["shell", "tfpipe_digits", "prep_shard", "--map-index", "2"])
    assert args.map_index == 2
    args = parser.parse_args(["tensorboard", "tfpipe_digits", "latest", "--port", "6007", "--print"])
    assert (args.run_id, args.port, args.print) == ("latest", 6007, True)


def _deployment_engine(monkeypatch, tmp_path, hostname=None):
    files = {}
    for name in ("ca", "cert", "key"):
        (tmp_path / f"{name}.pem").write_text("PEM")
        files[name] = str(tmp_path / f"{name}.pem")
    settings = {"docker_url": "tcp://gpu-host.example:2376", "tls_ca_cert": files["ca"],
                "tls_client_cert": files["cert"], "tls_client_key": files["key"], "tls_hostname": hostname}
    for option, value in settings.items():
        if value:
            monkeypatch.setenv(f"AIRFLOW__TFPIPE__{option.upper()}", value)
    return files


def test_the_shell_and_tensorboard_reach_the_deployment_engine_with_its_tls_files(monkeypatch, tmp_path):
    """In a deployment (``[tfpipe] docker_url`` and TLS files) the shell and TensorBoard start on the
    engine the task's tries use, presenting the same client certificate, verified against the CA."""
    from tfpipe.cli.common import on_its_engine

    files = _deployment_engine(monkeypatch, tmp_path)
    task = on_its_engine(training_pipeline(_cfg()).get_task("evaluate"))
    plan = reproduce.task_plan(task, dag_id="dbg", run_id=RUN_ID, try_number=1, params=None)
    assert plan.docker_url == "tcp://gpu-host.example:2376" and not plan.notes
    engine = ["docker", "--tlsverify", "--tlscacert", files["ca"], "--tlscert", files["cert"],
              "--tlskey", files["key"], "-H", "tcp://gpu-host.example:2376"]
    args = reproduce.shell_args(plan, dag_id="dbg", run_id=RUN_ID, task_id="evaluate")
    assert args[:len(engine) + 1] == [*engine, "run"]
    board = reproduce.tensorboard_args(image="img", event_dir="/e", dag_id="dbg", run_id=RUN_ID, port=6006,
                                   docker_url=task.docker_url, tls=reproduce.engine_tls(task))
    assert board[:len(engine) + 1] == [*engine, "run"]
    # A DAG that names its own engine keeps it, and no deployment TLS goes to it (as in execute)
    own = on_its_engine(training_pipeline(_cfg(docker_url="tcp://own.example:2375")).get_task("train"))
    own_plan = reproduce.task_plan(own, dag_id="dbg", run_id=RUN_ID, try_number=1, params=None)
    assert reproduce.shell_args(own_plan, dag_id="dbg", run_id=RUN_ID, task_id="train")[:4] == [
        "docker", "-H", "tcp://own.example:2375", "run"]
    # Without a deployment engine the local socket stays, with no flags
    monkeypatch.delenv("AIRFLOW__TFPIPE__DOCKER_URL")
    for option in ("TLS_CA_CERT", "TLS_CLIENT_CERT", "TLS_CLIENT_KEY"):
        monkeypatch.delenv(f"AIRFLOW__TFPIPE__{option}")
    local = on_its_engine(training_pipeline(_cfg()).get_task("train"))
    assert reproduce.shell_args(reproduce.task_plan(local, dag_id="dbg", run_id=RUN_ID, try_number=1, params=None),
                            dag_id="dbg", run_id=RUN_ID, task_id="train")[:2] == ["docker", "run"]


def test_a_tls_hostname_the_docker_cli_cannot_check_is_said(monkeypatch, tmp_path):
    from tfpipe.cli.common import on_its_engine

    _deployment_engine(monkeypatch, tmp_path, hostname="gpu-1.internal")
    task = on_its_engine(training_pipeline(_cfg()).get_task("train"))
    (note,) = reproduce.task_plan(task, dag_id="dbg", run_id=RUN_ID, try_number=1, params=None).notes
    assert "tcp://gpu-host.example:2376" in note and "'gpu-1.internal'" in note


def test_a_port_published_on_a_remote_engine_says_how_to_reach_it():
    """TensorBoard and Jupyter publish on the engine host's loopback: for a tcp:// engine the CLI
    says so and gives the SSH tunnel; a local engine needs no word."""
    note = reproduce.remote_port_note("tcp://gpu-host.example:2376", 6007)
    assert "gpu-host.example" in note and "ssh -N -L 6007:127.0.0.1:6007 gpu-host.example" in note
    assert "ssh -N -L 8888:127.0.0.1:8888 10.0.0.7" in reproduce.remote_port_note("tcp://10.0.0.7:2376", 8888)
    for local in ("unix:///var/run/docker.sock", None, "tcp://127.0.0.1:22376", "tcp://localhost:2376",
                  "tcp://[::1]:2376"):
        assert reproduce.remote_port_note(local, 6007) is None, local


def test_make_tensorboard_and_make_shell_pass_readme_s_defaults_and_settings():
    """The docs (Monitoring): ``make tensorboard`` serves ``RUN=latest`` of ``DAG=tfpipe_digits`` on ``PORT=6006``;
    ``make shell`` opens ``TASK=train`` of the latest run; both take those settings. Read from the
    recipes make would run (``make -n`` runs none), then parsed as the CLI parses them."""
    import argparse
    import shlex
    import subprocess

    from tests.conftest import REPO
    from tfpipe import cli

    def command(*settings: str) -> argparse.Namespace:
        recipe = subprocess.run(["make", "-n", "--no-print-directory", *settings], cwd=REPO, capture_output=True,
                                text=True, check=True, timeout=60).stdout.splitlines()
        argv = shlex.split(next(line for line in recipe if " -m tfpipe.cli " in line))
        parser = argparse.ArgumentParser()
        cli._add_debug_parsers(parser.add_subparsers(dest="command"))
        return parser.parse_args(argv[argv.index("tfpipe.cli") + 1:])

    board = command("tensorboard")
    assert (board.command, board.dag_id, board.run_id, board.port) == ("tensorboard", "tfpipe_digits", "latest", 6006)
    board = command("tensorboard", "DAG=d", "RUN=manual__1", "PORT=6007")
    assert (board.dag_id, board.run_id, board.port) == ("d", "manual__1", 6007)
    shell = command("shell")
    assert (shell.command, shell.dag_id, shell.task_id, shell.run, shell.no_gpus) == (
        "shell", "tfpipe_digits", "train", "latest", False)
    shell = command("shell", "DAG=d", "TASK=evaluate", "RUN=manual__1", "ARGS=--no-gpus")
    assert (shell.dag_id, shell.task_id, shell.run, shell.no_gpus) == ("d", "evaluate", "manual__1", True)
