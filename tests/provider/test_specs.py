"""Pure builders: stage specs, configs, container names, labels, mounts, GPU requests."""

from __future__ import annotations

import pytest
from docker.types import DeviceRequest

from tfpipe import contract
from tfpipe.config import GpuRequest, PipelineConfig
from tfpipe.exceptions import TfpipeConfigError
from tfpipe.run_params import conf_only_keys
from tfpipe.specs import (
    container_labels,
    container_name,
    plan_pipeline,
    prepare_dirs_command,
    resolve_stage_config,
    run_writable_dirs,
    writable_dirs,
)
from tfpipe.tries import image_identity

from .test_config import GOOD


@pytest.fixture
def cfg() -> PipelineConfig:
    return PipelineConfig.from_dict({**GOOD, "resources": {"gpus": "all"}, "retries": 4})


def test_plan_is_five_chained_stages(cfg):
    specs = plan_pipeline(cfg)
    assert [s.stage for s in specs] == ["prep", "validate", "train", "evaluate", "export"]
    assert [s.upstream for s in specs] == [(), ("prep",), ("validate",), ("train",), ("evaluate",)]
    assert [s.command for s in specs] == [("python3", "-m", "trainer", s) for s in contract.STAGES]


def test_retries_and_pool_only_on_training(cfg):
    by_stage = {s.stage: s for s in plan_pipeline(cfg)}
    # no pool unless one is configured: a task in a pool that does not exist is never scheduled
    assert all(s.pool is None for s in by_stage.values())
    assert by_stage["train"].retries == 4 and by_stage["prep"].retries == 1
    pooled = {s.stage: s for s in plan_pipeline(cfg.model_copy(update={"gpu_pool": "gpu"}))}
    assert pooled["train"].pool == "gpu" and pooled["prep"].pool is None


def test_gpus_go_to_training_and_evaluation_only(cfg):
    by_stage = {s.stage: s for s in plan_pipeline(cfg)}
    assert by_stage["train"].gpus == GpuRequest(count=-1)
    assert by_stage["evaluate"].gpus == GpuRequest(count=-1)
    assert by_stage["prep"].gpus is None and by_stage["export"].gpus is None


def test_mounts_data_read_only_others_read_write(cfg):
    mounts = {m.target: m for m in plan_pipeline(cfg)[0].mounts}
    assert mounts["/data"].read_only and mounts["/data"].source == "/srv/tfpipe/data"
    assert not mounts["/work"].read_only and not mounts["/models"].read_only
    docker_mount = mounts["/data"].to_docker()
    assert docker_mount["ReadOnly"] is True and docker_mount["Type"] == "bind"


def test_tf_defaults_in_environment(cfg):
    env = plan_pipeline(cfg)[1].environment
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"
    assert env["CUDA_CACHE_PATH"].startswith("/work/")
    # the driver evicts the oldest JIT entries beyond this size: the cache on the work volume stays bounded
    assert 0 < int(env["CUDA_CACHE_MAXSIZE"]) <= 4 * 2**30


def test_cpus_timezone_and_jemalloc_reach_every_stage():
    default = plan_pipeline(PipelineConfig.from_dict(GOOD))
    assert all(s.environment["TZ"] == "UTC" and "LD_PRELOAD" not in s.environment and s.cpus is None
               for s in default)  # the image's own LD_PRELOAD (jemalloc) stays in force
    tuned = plan_pipeline(PipelineConfig.from_dict(
        {**GOOD, "resources": {"cpus": 2.5, "timezone": "Asia/Shanghai", "jemalloc": False,
                               "environment": {"TZ": "Europe/Berlin"}}}))
    for spec in tuned:
        assert spec.cpus == 2.5 and spec.environment["LD_PRELOAD"] == ""
        assert spec.environment["TZ"] == "Europe/Berlin"  # resources.environment has the last word


def test_image_identity_picks_the_references_own_repo_digest():
    digest = "sha256:" + "a" * 64
    inspected = {"Id": "sha256:" + "1" * 64,
                 "RepoDigests": [f"mirror.example/tfpipe/trainer@{digest}", f"127.0.0.1:5000/tfpipe/trainer@{digest}"]}
    assert image_identity("127.0.0.1:5000/tfpipe/trainer:3f2a", inspected) == {
        "image_id": inspected["Id"], "image_repo_digest": f"127.0.0.1:5000/tfpipe/trainer@{digest}"}
    pinned = f"mirror.example/tfpipe/trainer@{digest}"
    assert image_identity(pinned, inspected)["image_repo_digest"] == pinned
    # A local build never went through a registry: no digest, only the image ID.
    assert image_identity("tfpipe/trainer:3f2a", {"Id": inspected["Id"], "RepoDigests": []}) == {
        "image_id": inspected["Id"], "image_repo_digest": None}


def test_export_emits_model_asset(cfg):
    assert plan_pipeline(cfg)[4].outlets == ("tfpipe://models/model",)


@pytest.mark.parametrize("value,expected", [
    (None, None), ("none", None), ("", None), (0, None),
    ("all", GpuRequest(count=-1)), (2, GpuRequest(count=2)), ("2", GpuRequest(count=2)),
    (["0", "1"], GpuRequest(device_ids=("0", "1"))), ("0,1", GpuRequest(device_ids=("0", "1"))),
    (["GPU-8a3c"], GpuRequest(device_ids=("GPU-8a3c",))),
])
def test_gpu_spec_parsing(value, expected):
    assert GpuRequest.parse(value) == expected


@pytest.mark.parametrize("value", ["many", -2, True, ["x"], 1.5, {"count": 1}])
def test_bad_gpu_specs(value):
    with pytest.raises(TfpipeConfigError, match="gpus"):
        GpuRequest.parse(value)


def test_gpu_requests_become_docker_device_requests():
    (req,) = GpuRequest(count=-1).to_docker()
    assert isinstance(req, DeviceRequest) and req["Count"] == -1 and req["Capabilities"] == [["gpu"]]
    (req,) = GpuRequest(device_ids=("0", "3")).to_docker()
    assert req["DeviceIDs"] == ["0", "3"]


def test_container_name_is_deterministic_per_run_and_task():
    a = container_name("tfpipe_digits", "manual__2026-11-29T18:00:00+00:00", "train")
    assert a == container_name("tfpipe_digits", "manual__2026-11-29T18:00:00+00:00", "train")
    assert a != container_name("tfpipe_digits", "manual__2026-11-29T18:00:01+00:00", "train")
    assert a != container_name("tfpipe_digits", "manual__2026-11-29T18:00:00+00:00", "prep")
    assert len(a) < 128 and all(c.isalnum() or c in "_.-" for c in a)


def test_labels_carry_identity():
    labels = container_labels(dag_id="d", run_id="r", task_id="train", try_number=3, stage="train")
    assert labels == {"tfpipe.dag_id": "d", "tfpipe.run_id": "r", "tfpipe.task_id": "train",
                      "tfpipe.map_index": "-1", "tfpipe.try_number": "3", "tfpipe.stage": "train"}


def test_resolved_config_follows_the_contract(cfg):
    spec = plan_pipeline(cfg)[1]
    config = resolve_stage_config(spec.config, dag_id="d", run_id="manual__x:y+z", task_id="train",
                                  try_number=2, image=cfg.image.ref, overrides={"epochs": 3, "gpus": "all"})
    assert contract.validate_stage_config(config) is config
    assert config["training"]["epochs"] == 3
    assert config["run"]["try_number"] == 2
    assert config["paths"]["run_dir"] == "/work/runs/d/manual__x_y_z"
    # keyed by run, never by try
    again = resolve_stage_config(spec.config, dag_id="d", run_id="manual__x:y+z", task_id="train",
                                 try_number=3, image=cfg.image.ref)
    assert again["paths"]["run_dir"] == config["paths"]["run_dir"]


def test_overrides_are_validated(cfg):
    spec = plan_pipeline(cfg)[1]
    with pytest.raises(TfpipeConfigError, match="training.epochs"):
        resolve_stage_config(spec.config, dag_id="d", run_id="r", task_id="train", try_number=1,
                             image=cfg.image.ref, overrides={"epochs": 0})


def test_writable_dirs_per_stage(cfg):
    spec = plan_pipeline(cfg)[0]
    run = "/work/runs/d/r"
    assert "/work/datasets" in writable_dirs("prep", spec.config, run)
    assert "/models/model" in writable_dirs("export", spec.config, run)
    assert "/models/model" not in writable_dirs("train", spec.config, run)
    assert run in writable_dirs("evaluate", spec.config, run)


def test_prepare_command_creates_and_chowns_only_listed_dirs():
    cmd = prepare_dirs_command(["/work/runs/d/r", "/work/datasets"], "1000:1000")
    assert cmd[:2] == ["sh", "-c"] and cmd[-2:] == ["/work/runs/d/r", "/work/datasets"]
    assert "chown 1000:1000" in cmd[2] and "-R" not in cmd[2]


def test_the_run_prepares_every_stage_directory_once(cfg):
    """The first stage of a run prepares what every stage writes, so the later ones find it ready."""
    spec = plan_pipeline(cfg)[1]
    run = "/work/runs/d/r"
    dirs = run_writable_dirs(spec.config, run)
    assert len(dirs) == len(set(dirs))
    assert set(dirs) == {d for stage in contract.STAGES for d in writable_dirs(stage, spec.config, run)}


def test_early_stopping_is_configured_in_the_dag_and_a_run_s_conf_may_change_its_patience(cfg):
    """The DAG's config sets the monitor and the patience; a run's conf may set another patience
    (not on the trigger form: an advanced override) and gets the same checks as the DAG file."""
    config = PipelineConfig.from_dict({**GOOD, "training": {
        "early_stopping_patience": 3, "early_stopping_monitor": "val_accuracy",
        "early_stopping_min_delta": 0.001}})
    spec = plan_pipeline(config)[1]
    assert "early_stopping_patience" in conf_only_keys()
    resolved = resolve_stage_config(spec.config, dag_id="d", run_id="r", task_id="train", try_number=1,
                                    image=config.image.ref, overrides={"early_stopping_patience": 5})
    assert contract.validate_stage_config(resolved) is resolved
    assert {k: v for k, v in resolved["training"].items() if k.startswith("early")} == {
        "early_stopping_patience": 5, "early_stopping_monitor": "val_accuracy", "early_stopping_min_delta": 0.001}
    with pytest.raises(TfpipeConfigError, match="training.early_stopping_patience"):
        resolve_stage_config(spec.config, dag_id="d", run_id="r", task_id="train", try_number=1,
                             image=config.image.ref, overrides={"early_stopping_patience": -2})
    # off unless configured
    assert plan_pipeline(cfg)[1].config["training"]["early_stopping_patience"] == 0


def test_a_run_s_conf_may_clip_the_gradients_of_a_dag_that_does_not(cfg):
    """After a diverged run (whose error suggests it), a retrigger's conf may set the clip without a
    DAG change; the DAG's class weight reaches the stage config as written."""
    config = PipelineConfig.from_dict({**GOOD, "training": {"class_weight": "balanced"}})
    spec = plan_pipeline(config)[1]
    assert spec.config["training"]["gradient_clip_norm"] == 0
    assert spec.config["training"]["class_weight"] == "balanced"
    assert "gradient_clip_norm" in conf_only_keys()
    resolved = resolve_stage_config(spec.config, dag_id="d", run_id="r", task_id="train", try_number=1,
                                    image=config.image.ref, overrides={"gradient_clip_norm": 1.0})
    assert contract.validate_stage_config(resolved) is resolved
    assert resolved["training"]["gradient_clip_norm"] == 1.0
    with pytest.raises(TfpipeConfigError, match="training.gradient_clip_norm"):
        resolve_stage_config(spec.config, dag_id="d", run_id="r", task_id="train", try_number=1,
                             image=config.image.ref, overrides={"gradient_clip_norm": -1})


def test_a_run_s_epochs_below_the_dag_s_warm_up_fail_the_try_naming_the_fix(cfg):
    config = PipelineConfig.from_dict({**GOOD, "training": {"epochs": 10, "learning_rate_warmup_epochs": 2}})
    spec = plan_pipeline(config)[1]
    resolved = resolve_stage_config(spec.config, dag_id="d", run_id="r", task_id="train", try_number=1,
                                    image=config.image.ref, overrides={"epochs": 3})
    assert (resolved["training"]["epochs"], resolved["training"]["learning_rate_warmup_epochs"]) == (3, 2)
    with pytest.raises(TfpipeConfigError, match=r"training.learning_rate_warmup_epochs: 2 warm-up epoch\(s\) "
                                                r"leave none of the 2 epoch\(s\).*Fix: make it fewer than training.epochs"):
        resolve_stage_config(spec.config, dag_id="d", run_id="r", task_id="train", try_number=1,
                             image=config.image.ref, overrides={"epochs": 2})


@pytest.mark.parametrize("training, named", [
    ({"learning_rate_schedule": "linear"}, "training.learning_rate_schedule"),
    ({"early_stopping_patience": -1}, "training.early_stopping_patience"),
    ({"early_stopping_patience": 1.5}, "training.early_stopping_patience"),
    ({"early_stopping_monitor": "loss"}, "training.early_stopping_monitor"),
    ({"early_stopping_min_delta": -0.1}, "training.early_stopping_min_delta"),
    ({"early_stopping_min_delta": 5000}, "training.early_stopping_min_delta"),
    ({"class_weight": "inverse"}, "training.class_weight"),
    ({"class_weight": None}, "training.class_weight"),
    ({"learning_rate_warmup_epochs": -1}, "training.learning_rate_warmup_epochs"),
    ({"learning_rate_warmup_epochs": 10, "epochs": 10}, "training.learning_rate_warmup_epochs"),
    ({"gradient_clip_norm": -0.5}, "training.gradient_clip_norm"),
    ({"gradient_clip_norm": "1"}, "training.gradient_clip_norm"),
    ({"gradient_clip_norm": 1e9}, "training.gradient_clip_norm"),
])
def test_bad_schedule_and_early_stopping_settings_fail_the_parse_naming_the_field(training, named):
    with pytest.raises(TfpipeConfigError, match=named) as info:
        PipelineConfig.from_dict({**GOOD, "training": training})
    assert "Fix: " in str(info.value)
