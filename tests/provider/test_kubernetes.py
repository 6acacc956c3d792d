"""The Kubernetes backend: the same specs become KubernetesPodOperators.

No cluster exists here. These tests check the ``V1Pod`` that the operator would send, built by
the Kubernetes provider's own ``build_pod_request_obj`` and serialised by the Kubernetes client
(``ApiClient.sanitize_for_serialization``, the JSON that goes to the API server), and the exit
mapping on pod statuses made of the client's own models.
"""

from __future__ import annotations

import copy
import re
from types import SimpleNamespace

import pytest

from airflow.providers.common.compat.sdk import AirflowFailException, DownstreamTasksSkipped
from kubernetes.client import ApiClient
from kubernetes.client import models as k8s

from tfpipe import contract
from tfpipe.config import PipelineConfig
from tfpipe.dag_factory import training_pipeline
from tfpipe.exceptions import StageFailedError, StageRejectedError, TfpipeConfigError
from tfpipe.operators.kubernetes import POD_OPERATORS, TfpipeStagePodOperator, pod_exit

RUN_ID = "manual__2026-11-30T05:00:00+00:00"
SETTINGS = {
    "dag_id": "k8s_test",
    "backend": "kubernetes",
    "image": {"ref": "registry.example:5000/tfpipe/trainer:0.1.0"},
    "gpu_pool": "gpu",  # not the default (no pool): checks that a chosen pool reaches the pod task
    "volumes": {"data": "/srv/t/data", "work": "/srv/t/work", "models": "/srv/t/models"},
    "kubernetes": {"namespace": "ml", "claims": {"work": "tfpipe-work", "models": "tfpipe-models"},
                   "secret_env": {"WANDB_API_KEY": "wandb:api-key"}},
    "data": {"path": "digits/digits.csv"},
    "evaluation": {"metric": "macro_f1", "threshold": 0.5},
    "resources": {"gpus": 2, "mem_limit": "8g", "shm_size": "2g", "user": "1000:2000",
                  "environment": {"WANDB_MODE": "offline"},
                  "node_selector": {"nvidia.com/gpu.present": "true"},
                  "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
}


def _dag(**overrides):
    return training_pipeline(PipelineConfig.from_dict({**copy.deepcopy(SETTINGS), **overrides}))


def _context(dag, task, params=None, try_number=1):
    ti = SimpleNamespace(dag_id=dag.dag_id, run_id=RUN_ID, task_id=task.task_id, try_number=try_number, map_index=-1,
                         xcom_push=lambda key, value: pushed.__setitem__(key, value))
    pushed: dict = {}
    return {"ti": ti, "run_id": RUN_ID, "dag": dag, "task": task,
            "params": {**dag.params.dump(), **(params or {})}, "pushed": pushed}


def _pod(dag, task_id, params=None):
    """The pod the task would create, as the Kubernetes client serialises it for the API server."""
    task = dag.get_task(task_id)
    context = _context(dag, task, params)
    task.prepare_try(context)
    pod = task.build_pod_request_obj(context, dry_run=True)
    return ApiClient().sanitize_for_serialization(pod)


def _stage_container(pod):
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "base"]
    return container


def test_every_stage_is_a_pod_operator_built_from_its_spec():
    dag = _dag()
    stages = [t for t in dag.topological_sort()]
    assert [t.task_id for t in stages] == list(contract.STAGES), "no Docker-only GCS tasks on Kubernetes"
    for task in stages:
        assert isinstance(task, POD_OPERATORS[task.task_id]) and isinstance(task, TfpipeStagePodOperator)
        assert task.spec.stage == task.task_id
    assert dag.get_task("train").retries == 3 and dag.get_task("train").pool == "gpu"
    assert "data_uri" not in dag.params and dag.params["metric"] == "macro_f1"


def test_the_train_pod():
    dag = _dag()
    pod = _pod(dag, "train", params={"epochs": 7})
    spec, container = pod["spec"], _stage_container(pod)
    assert pod["apiVersion"] == "v1" and pod["kind"] == "Pod" and pod["metadata"]["namespace"] == "ml"
    assert container["image"] == "registry.example:5000/tfpipe/trainer:0.1.0"
    assert container["command"] == ["python3", "-m", "trainer", "train"]
    env = {e["name"]: e for e in container["env"]}
    config = contract.validate_stage_config(__import__("json").loads(env[contract.CONFIG_ENV]["value"]))
    assert config["training"]["epochs"] == 7 and config["evaluation"]["metric"] == "macro_f1"
    assert config["run"]["run_id"] == RUN_ID and config["paths"]["run_dir"].startswith("/work/runs/k8s_test/")
    assert env["WANDB_MODE"]["value"] == "offline" and env["TF_FORCE_GPU_ALLOW_GROWTH"]["value"] == "true"
    assert env["WANDB_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "wandb", "key": "api-key"}
    # GPUs, memory and shm
    assert container["resources"]["limits"] == {"memory": str(8 << 30), "nvidia.com/gpu": "2"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": str(2 << 30)}
    # volumes: claims where configured, a read-only hostPath for the data
    assert volumes["work"]["persistentVolumeClaim"] == {"claimName": "tfpipe-work", "readOnly": False}
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == "tfpipe-models"
    assert volumes["data"]["hostPath"] == {"path": "/srv/t/data", "type": "Directory"}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/data"]["readOnly"] is True and mounts["/work"]["readOnly"] is False
    assert mounts["/models"]["readOnly"] is False and "/dev/shm" in mounts
    # placement
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    # non-root
    assert spec["securityContext"] == {"runAsUser": 1000, "runAsGroup": 2000, "fsGroup": 2000, "runAsNonRoot": True}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "privileged": False,
                                             "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}}
    assert spec["restartPolicy"] == "Never"
    # labels: the tfpipe identity, label-safe, with the exact values in annotations
    labels, annotations = pod["metadata"]["labels"], pod["metadata"]["annotations"]
    assert labels["tfpipe.stage"] == "train" and labels["tfpipe.dag_id"] == "k8s_test"
    assert labels["tfpipe.run_id"] == "manual__2026-11-30T05_00_00_00_00"
    assert annotations["tfpipe.run_id"] == RUN_ID and annotations["tfpipe.try_number"] == "1"
    assert all(len(v) <= 63 for v in labels.values())
    # the init container hands the run's directories to the stage user, and may do nothing else
    (init,) = spec["initContainers"]
    assert init["command"][:2] == ["sh", "-c"] and config["paths"]["run_dir"] in init["command"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]}
    assert init["securityContext"]["allowPrivilegeEscalation"] is False
    assert {m["mountPath"] for m in init["volumeMounts"]} == {"/work", "/models"}
    # root, because chown needs it, but not privileged; and its script only makes directories and
    # hands each listed one (never a tree) to the stage's user
    assert init["securityContext"]["runAsUser"] == 0 and init["securityContext"]["runAsNonRoot"] is False
    assert init["securityContext"]["privileged"] is False
    script, dirs = init["command"][2], init["command"][4:]
    assert re.sub(r'mkdir -p "\$d"|chown 1000:2000 "\$d"|stat -c %u:%g "\$d"', "", script) == (
        'set -e; for d in "$@"; do ; if [ "$()" != "1000:2000" ]; then ; fi; done'), script
    assert "-R" not in script and config["paths"]["run_dir"] in dirs



def test_prepare_volumes_off_leaves_the_pod_without_an_init_container():
    """``kubernetes.prepare_volumes: false``: the volumes are prepared by the cluster's owner, so no
    root init container runs; the stage container itself is unchanged."""
    dag = _dag(kubernetes={**SETTINGS["kubernetes"], "prepare_volumes": False})
    pod = _pod(dag, "train")
    assert not pod["spec"].get("initContainers")
    assert _stage_container(pod)["securityContext"]["runAsNonRoot"] is True

def test_gpus_only_on_gpu_stages_and_the_run_can_change_them():
    dag = _dag()
    assert "nvidia.com/gpu" not in (_stage_container(_pod(dag, "prep"))["resources"]["limits"] or {})
    evaluate = _stage_container(_pod(dag, "evaluate", params={"gpus": "1"}))
    assert evaluate["resources"]["limits"]["nvidia.com/gpu"] == "1"
    cpu = _stage_container(_pod(dag, "train", params={"gpus": "none"}))
    assert cpu["resources"]["limits"] == {"memory": str(8 << 30)}
    with pytest.raises(AirflowFailException, match="by count"):
        _pod(dag, "train", params={"gpus": "all"})


@pytest.mark.parametrize("cpus, quantity", [(4, "4"), (1.5, "1500m"), (0.01, "10m"), (2.0, "2")])
def test_resources_cpus_is_the_pod_cpu_limit_on_every_stage(cpus, quantity):
    """``resources.cpus`` is a CPU limit on Kubernetes as it is Docker's ``--cpus``: the same count,
    whole CPUs as they are and fractions in millicores, on every stage (the GPU ones too)."""
    dag = _dag(resources={**SETTINGS["resources"], "cpus": cpus})
    for stage in ("prep", "train", "evaluate", "export"):
        limits = _stage_container(_pod(dag, stage))["resources"]["limits"]
        assert limits["cpu"] == quantity, stage
        assert limits["memory"] == str(8 << 30)
    # the quantity is the count Docker's backend gives the container (NanoCpus, in 1e-9 CPUs)
    docker_settings = {k: v for k, v in copy.deepcopy(SETTINGS).items() if k not in ("backend", "kubernetes")}
    docker_settings["resources"]["cpus"] = cpus
    docker_dag = training_pipeline(PipelineConfig.from_dict(docker_settings))
    millis = int(quantity[:-1]) if quantity.endswith("m") else int(quantity) * 1000
    assert docker_dag.get_task("train").nano_cpus == millis * 1_000_000


@pytest.mark.parametrize("overrides, words", [
    ({"resources": {**SETTINGS["resources"], "gpus": "all"}}, ["resources.gpus", "by count", "Fix:"]),
    # device ids, in each form the config accepts for them, are refused like "all": a pod asks
    # nvidia.com/gpu for a count and cannot pin particular devices
    ({"resources": {**SETTINGS["resources"], "gpus": "0,1"}},
     ["resources.gpus", "'0,1'", "by count", "Fix: give a count"]),
    ({"resources": {**SETTINGS["resources"], "gpus": ["0", "1"]}},
     ["resources.gpus", "['0', '1']", "by count", "Fix: give a count"]),
    ({"resources": {**SETTINGS["resources"], "gpus": ["GPU-8a3c0f2e"]}},
     ["resources.gpus", "GPU-8a3c0f2e", "by count", "Fix: give a count"]),
    ({"resources": {**SETTINGS["resources"], "tolerations": [{"operator": "Sometimes"}]}},
     ["resources.tolerations[0].operator", "Fix:"]),
    ({"kubernetes": {"claims": {"scratch": "x"}}}, ["kubernetes.claims", "Fix:"]),
    ({"kubernetes": {"namespace": "ML Training"}}, ["kubernetes.namespace", "Fix:"]),
    ({"data_uri": "gs://bucket/raw"}, ["data_uri", "Docker engine", "Fix:"]),
    ({"publish_uri": "gs://bucket/models"}, ["publish_uri", "Docker engine", "Fix:"]),
    ({"gcs_tasks": True}, ["gcs_tasks", "Docker engine", "Fix:"]),
    ({"backend": "nomad"}, ["backend", "'kubernetes'", "Fix:"]),
])
def test_what_kubernetes_cannot_do_is_a_parse_time_error(overrides, words):
    # the config itself refuses it, before any operator is built: the pod operator checks GPUs again
    # when it is built, and that backstop would otherwise hide a gap in the config's own check
    with pytest.raises(TfpipeConfigError) as err:
        PipelineConfig.from_dict({**copy.deepcopy(SETTINGS), **overrides})
    for word in words:
        assert word in str(err.value)
    with pytest.raises(TfpipeConfigError) as dag_err:
        _dag(**overrides)
    assert str(dag_err.value) == str(err.value)


def test_secrets_come_from_kubernetes_secrets_only():
    resources = {**SETTINGS["resources"], "private_environment": {"TOKEN": "s3cr3t"}}
    with pytest.raises(TfpipeConfigError, match="private_environment.*Fix:"):
        _dag(resources=resources)
    with pytest.raises(TfpipeConfigError, match="non-root"):
        _dag(resources={**SETTINGS["resources"], "user": "0:0"})


def _terminated(code, reason="Completed"):
    state = k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(exit_code=code, reason=reason))
    status = k8s.V1ContainerStatus(name="base", state=state, ready=False, restart_count=0, image="i", image_id="")
    return k8s.V1Pod(status=k8s.V1PodStatus(phase="Succeeded" if code == 0 else "Failed",
                                            container_statuses=[status]))


RESULT = contract.RESULT_PREFIX + '{"blessed": false, "value": 0.4}'
EXIT_TABLE = [
    # stage, exit code, reason, expected exception (None: success), retried by Airflow?
    ("evaluate", contract.ExitCode.NOT_BLESSED, "Error", DownstreamTasksSkipped, False),
    ("prep", contract.ExitCode.BAD_INPUT, "Error", StageRejectedError, False),
    ("train", contract.ExitCode.DIVERGED, "Error", StageRejectedError, False),
    ("evaluate", contract.ExitCode.DIRS_NOT_READY, "Error", StageRejectedError, False),
    ("train", 1, "Error", StageFailedError, True),
    ("train", 137, "OOMKilled", StageFailedError, True),
    ("train", 143, "Error", StageFailedError, True),
    ("train", contract.ExitCode.NOT_BLESSED, "Error", StageFailedError, True),
    ("export", 0, "Completed", None, None),
]


@pytest.mark.parametrize("stage,code,reason,expected,retried", EXIT_TABLE)
def test_exit_mapping_on_pod_statuses(stage, code, reason, expected, retried):
    dag = _dag()
    task = dag.get_task(stage)
    context = _context(dag, task)
    remote = _terminated(code, reason)
    assert pod_exit(remote, task.base_container_name) == (code, reason == "OOMKilled")
    if expected is None:
        task.raise_for_pod_exit(remote, ["log", contract.RESULT_PREFIX + '{"version": 3}'], context)
        assert task._result == {"version": 3}
        return
    with pytest.raises(expected) as err:
        task.raise_for_pod_exit(remote, ["working", RESULT], context)
    assert isinstance(err.value, AirflowFailException) is (not retried and expected is not DownstreamTasksSkipped)
    if expected is DownstreamTasksSkipped:
        assert err.value.tasks == ["export"] and context["pushed"]["return_value"]["blessed"] is False
    if reason == "OOMKilled":
        assert err.value.oom_killed and "out-of-memory" in str(err.value)


def test_a_pod_that_never_ran_is_left_to_kubernetes_pod_operator():
    dag = _dag()
    task = dag.get_task("train")
    pending = k8s.V1Pod(status=k8s.V1PodStatus(phase="Pending", container_statuses=None))
    assert pod_exit(pending, task.base_container_name) == (None, False)
    task.raise_for_pod_exit(pending, [], _context(dag, task))  # nothing to map: KPO's own error stands


def test_the_example_dag_is_a_kubernetes_pipeline(monkeypatch):
    from tests.conftest import REPO
    from tfpipe.compat import DagBag

    # the DAG names no image: its pods run the deployment's (the Airflow Variable tfpipe_image)
    monkeypatch.delenv("TFPIPE_K8S_IMAGE", raising=False)
    monkeypatch.setenv("AIRFLOW_VAR_TFPIPE_IMAGE", "registry.example:5000/tfpipe/trainer:3f2a9c1b7e4d")
    bag = DagBag(dag_folder=str(REPO / "dags" / "k8s_tfpipe_digits.py"))
    assert bag.import_errors == {}
    dag = bag.get_dag("k8s_tfpipe_digits")
    assert all(isinstance(t, TfpipeStagePodOperator) for t in dag.tasks)
    pod = _pod(dag, "train")
    assert pod["metadata"]["namespace"] == "ml-training"
    assert _stage_container(pod)["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert _stage_container(pod)["image"] == "registry.example:5000/tfpipe/trainer:3f2a9c1b7e4d"
    assert pod["spec"]["initContainers"][0]["image"] == _stage_container(pod)["image"]


def test_a_misspelt_conf_key_fails_the_pod_task_before_any_pod_is_built():
    """The pod operator checks the run's ``conf`` first thing in ``execute()``, with the Docker
    operators' message, and fails without retrying; no cluster is reachable here, so getting this
    error at all (not a connection error) shows no pod was built or sent."""
    dag = _dag()
    task = dag.get_task("train")
    context = {**_context(dag, task), "dag_run": SimpleNamespace(conf={"epoch": 3})}
    with pytest.raises(AirflowFailException) as err:
        task.execute(context)
    message = str(err.value)
    assert message.startswith("train: unknown run parameter 'epoch' (did you mean 'epochs'?). Fix:")
    assert message.endswith("Nothing ran.")
    assert task.name is None and contract.CONFIG_ENV not in task.env_vars, "the try was never prepared"
    # the Docker backend's task says the same about the same conf
    docker_settings = {k: v for k, v in SETTINGS.items() if k not in ("backend", "kubernetes")}
    docker_dag = training_pipeline(PipelineConfig.from_dict(copy.deepcopy(docker_settings)))
    docker_task = docker_dag.get_task("train")
    with pytest.raises(AirflowFailException) as docker_err:
        docker_task.execute({**_context(docker_dag, docker_task), "dag_run": SimpleNamespace(conf={"epoch": 3})})
    assert str(docker_err.value).split(". Fix:")[0] == message.split(". Fix:")[0]


@pytest.mark.parametrize("timezone, jemalloc", [("UTC", True), ("Europe/Berlin", False)])
def test_the_pod_environment_carries_the_time_zone_and_the_jemalloc_switch(timezone, jemalloc):
    """``resources.timezone`` becomes ``TZ`` and ``resources.jemalloc: false`` an empty ``LD_PRELOAD``
    (the image preloads jemalloc), as on Docker; left on, the image's ``LD_PRELOAD`` stands."""
    dag = _dag(resources={**SETTINGS["resources"], "timezone": timezone, "jemalloc": jemalloc})
    for stage in ("prep", "train"):
        env = {e["name"]: e.get("value") for e in _stage_container(_pod(dag, stage))["env"]}
        assert env["TZ"] == timezone
        if jemalloc:
            assert "LD_PRELOAD" not in env
        else:
            assert env["LD_PRELOAD"] == ""


def test_a_pod_task_records_no_run_location_so_the_report_route_says_it_cannot_serve_it(monkeypatch):
    """The docs (Monitoring): the plugin cannot read a Kubernetes run's volumes, so its report route answers 404
    for such runs. It finds a run's files through the location a Docker stage task records as an
    XCom; a pod task records none (the pod itself is not created here)."""
    from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator

    from tfpipe.plugins.paths import LOCATION_XCOM_KEY

    monkeypatch.setattr(KubernetesPodOperator, "execute", lambda self, context: None)
    dag = _dag()
    for task_id in ("prep", "train", "evaluate", "export"):
        task = dag.get_task(task_id)
        context = _context(dag, task)
        task.execute(context)
        assert LOCATION_XCOM_KEY not in context["pushed"], (task_id, context["pushed"])


def test_default_args_reach_every_pod_task_as_they_do_the_docker_ones():
    """Alerts on the Kubernetes backend: training_pipeline's default_args reach each pod task too."""
    def on_failure(context):
        return None

    dag = training_pipeline(PipelineConfig.from_dict(copy.deepcopy(SETTINGS)),
                            default_args={"owner": "ml-platform", "on_failure_callback": on_failure})
    assert {"prep", "train", "evaluate", "export"} <= set(dag.task_ids)
    for task in dag.tasks:
        assert isinstance(task, TfpipeStagePodOperator), task.task_id
        assert list(task.on_failure_callback) == [on_failure] and task.owner == "ml-platform", task.task_id


def test_a_real_table_s_settings_reach_the_prep_and_validate_pods_as_on_docker():
    """A Parquet table in date partitions, with typed columns, NA texts and the data gate's overrides:
    the prep and validate pods get the same data and validation sections as the Docker backend's
    containers (the stage config is the only backend boundary), and the run's window end."""
    import json
    from datetime import datetime, timezone

    from tfpipe.specs import config_template

    table = {"path": "events", "format": "parquet", "window_days": 7, "min_partitions": 5,
             "columns": {"customer_id": "ignore", "zip": "categorical"}, "na_values": ["", "n/a"],
             "drop_missing_labels": True}
    gate = {"on_anomaly": "warn", "columns": {"zip": {"categorical_drift": 0.3}}}
    dag = _dag(data=table, validation=gate)
    docker = PipelineConfig.from_dict({**copy.deepcopy(SETTINGS), "backend": "docker", "data": table,
                                       "validation": gate})
    for stage in ("prep", "validate"):
        task = dag.get_task(stage)
        context = _context(dag, task)
        context["ti"].data_interval_end = datetime(2026, 12, 7, tzinfo=timezone.utc)
        task.prepare_try(context)
        pod = ApiClient().sanitize_for_serialization(task.build_pod_request_obj(context, dry_run=True))
        env = {e["name"]: e for e in _stage_container(pod)["env"]}
        config = contract.validate_stage_config(json.loads(env[contract.CONFIG_ENV]["value"]))
        expected = config_template(docker, stage)
        assert config["data"] == expected["data"] and config["validation"] == expected["validation"]
        assert config["run"][contract.WINDOW_END_KEY] == "2026-12-07T00:00:00+00:00"
