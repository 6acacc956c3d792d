"""Container hygiene against the real engine: leftovers of earlier tries, volume preparation."""

from __future__ import annotations

import os
import subprocess
import uuid
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG
from docker.errors import NotFound

from tfpipe import contract, reproduce
from tfpipe.compat import has_resumable_jobs
from tfpipe.config import PipelineConfig
from tests.integration.test_pipeline import CreatedContainers
from tfpipe.exceptions import ImageNotFoundError, StageRejectedError
from tfpipe.operators.docker import PREPARE_ROLE, PrepOperator, TrainOperator
from tfpipe.specs import config_template, container_labels, container_name
from tfpipe.tries import TryIdentity, resolve_try

pytestmark = pytest.mark.integration


def _train_operator(image: str, home) -> TrainOperator:
    cfg = PipelineConfig.from_dict({
        "dag_id": "hygiene", "image": {"ref": image}, "data": {"path": "digits/digits.csv"},
        "volumes": {"data": f"{home}/data", "work": f"{home}/work", "models": f"{home}/models"},
    })
    with DAG("hygiene", schedule=None):
        return TrainOperator(task_id="train", image=image, stage_config=config_template(cfg, "train"),
                             volumes=cfg.volumes)


def test_leftover_container_of_an_earlier_try_is_removed(trainer_image, tfpipe_home, docker_client):
    """A worker killed with SIGKILL never runs on_kill: its container is still running on retry."""
    op = _train_operator(trainer_image, tfpipe_home)
    run_id = "manual__2026-11-29T00:00:00+00:00"
    op.container_name = container_name("hygiene", run_id, "train")
    labels = container_labels(dag_id="hygiene", run_id=run_id, task_id="train", try_number=1, stage="train")
    leftover = docker_client.containers.run(trainer_image, ["sleep", "600"], name=op.container_name,
                                            labels=labels, detach=True)
    other_run = docker_client.containers.run(
        trainer_image, ["sleep", "600"], detach=True,
        labels=container_labels(dag_id="hygiene", run_id="another", task_id="train", try_number=1, stage="train"))
    try:
        op._remove_leftovers("hygiene", run_id, "train", -1)
        names = [c.name for c in docker_client.containers.list(all=True)]
        assert op.container_name not in names
        assert other_run.name in names, "containers of other runs must be left alone"
    finally:
        for c in (leftover, other_run):
            try:
                c.remove(force=True)
            except Exception:
                pass


def _remove(docker_client, *names: str) -> None:
    """Remove the test's containers, whichever of them are still there."""
    for name in names:
        try:
            docker_client.api.remove_container(name, force=True)
        except Exception:
            pass


def _open_shell(op: TrainOperator, run_id: str, home) -> str:
    """Start what ``tfpipe shell --detach`` starts for try 1 of the task (its own ``docker run`` line:
    the task's labels plus ``tfpipe.role=shell``, a ``tfpipe-shell-...`` name); return its name."""
    for volume in ("work", "models"):
        (home / volume).mkdir(exist_ok=True)  # bind mounts need their sources
    plan = reproduce.task_plan(op, dag_id="hygiene", run_id=run_id, try_number=1, params=None)
    name = f"tfpipe-shell-train-{uuid.uuid4().hex[:6]}"
    args = reproduce.shell_args(plan, dag_id="hygiene", run_id=run_id, task_id="train", name=name, detach=True,
                            gpus=False)
    subprocess.run(args, check=True, capture_output=True)
    return name


def _names(docker_client) -> list[str]:
    return [c.name for c in docker_client.containers.list(all=True)]


def test_a_new_try_removes_a_shell_left_open_on_the_task(trainer_image, tfpipe_home, docker_client):
    """A ``tfpipe shell`` container has another name than the task's container: a new try finds it by
    the task's labels and removes it before starting its own (one writer per run dir)."""
    op = _train_operator(trainer_image, tfpipe_home)
    run_id = f"manual__shell_{uuid.uuid4().hex[:8]}"
    shell = _open_shell(op, run_id, tfpipe_home)
    other_run = docker_client.containers.run(
        trainer_image, ["sleep", "600"], detach=True,
        labels=container_labels(dag_id="hygiene", run_id="another", task_id="train", try_number=1, stage="train"))
    try:
        inspected = docker_client.api.inspect_container(shell)
        assert inspected["Config"]["Labels"]["tfpipe.role"] == "shell" and inspected["State"]["Running"]
        plan = resolve_try(op.spec, TryIdentity("hygiene", run_id, "train", 2), image=trainer_image)
        assert shell != plan.name
        op._remove_leftovers_of(plan)  # what submit_job does before it creates the try's container
        names = _names(docker_client)
        assert shell not in names, "the shell open on the task must be removed before a new try starts"
        assert other_run.name in names, "containers of other runs must be left alone"
    finally:
        _remove(docker_client, *(shell, other_run.name))


def test_a_re_attaching_try_keeps_its_container_and_removes_every_other_one(
        trainer_image, tfpipe_home, docker_client):
    """Re-attaching to the running container of an earlier try removes a shell open on the task and
    leaves that container running: the try then reads the result it prints after the removal."""
    op = _train_operator(trainer_image, tfpipe_home)
    run_id = f"manual__reattach_{uuid.uuid4().hex[:8]}"
    earlier = resolve_try(op.spec, TryIdentity("hygiene", run_id, "train", 1), image=trainer_image)
    shell = _open_shell(op, run_id, tfpipe_home)
    token = uuid.uuid4().hex
    try:
        # still running when the re-attaching try removes the others; its result line comes afterwards
        kept = docker_client.containers.run(
            trainer_image, ["sh", "-c", f"sleep 3; echo '{contract.RESULT_PREFIX}{{\"token\": \"{token}\"}}'"],
            name=earlier.name, labels=dict(earlier.labels), detach=True)
        op._plan = resolve_try(op.spec, TryIdentity("hygiene", run_id, "train", 2), image=trainer_image)
        op._fresh = False  # a container of an earlier try, as execute_resumable hands it over
        try:
            result = op.poll_until_complete(kept.id, {})
        except NotFound as err:
            pytest.fail(f"the container the try re-attached to was removed: {err}")
        assert result == {"token": token}, "the kept container must have run to its end"
        names = _names(docker_client)
        assert shell not in names, "a shell open on the task must go when a try re-attaches"
        assert earlier.name not in names, "the try removes its container once it has the result"
    finally:
        _remove(docker_client, *(shell, earlier.name))


def test_prepare_dirs_hands_directories_to_the_stage_user(trainer_image, tfpipe_home):
    op = _train_operator(trainer_image, tfpipe_home)
    op._prepare_dirs(("/work/runs/hygiene/r1", "/work/cache", "/models/m"))
    for path in (tfpipe_home / "work" / "runs" / "hygiene" / "r1", tfpipe_home / "models" / "m"):
        stat = path.stat()
        assert (stat.st_uid, stat.st_gid) == (1000, 1000)
    # the parents were created but not chowned recursively
    assert (tfpipe_home / "work" / "runs").stat().st_uid == 0


def _prep_operator(image: str, home, **kwargs) -> PrepOperator:
    cfg = PipelineConfig.from_dict({
        "dag_id": "hygiene", "image": {"ref": image}, "data": {"path": "digits/digits.csv"},
        "volumes": {"data": f"{home}/data", "work": f"{home}/work", "models": f"{home}/models"},
    })
    with DAG("hygiene", schedule=None):
        return PrepOperator(task_id="prep", image=image, stage_config=config_template(cfg, "prep"),
                            volumes=cfg.volumes, **kwargs)


def _start_try(op: PrepOperator, run_id: str, try_number: int) -> PrepOperator:
    """``op`` set up for one try of the run, as its execute() sets it up before it starts the stage."""
    plan = resolve_try(op.spec, TryIdentity("hygiene", run_id, "prep", try_number), image=op.image)
    op._plan, op.container_name, op.labels = plan, plan.name, dict(plan.labels)
    op._dirs_ready = not op.prepare_volumes
    return op


def _try_context(op: PrepOperator, run_id: str, try_number: int, store) -> dict:
    ti = SimpleNamespace(dag_id="hygiene", run_id=run_id, task_id=op.task_id, try_number=try_number, stats_tags={})
    return {"ti": ti, "task_state_store": store}


def _run_try(op: PrepOperator, run_id: str, try_number: int = 1) -> dict:
    """One try of a real prep stage through the operator's own start and follow path (submit_job,
    poll_until_complete); its result."""
    _start_try(op, run_id, try_number)
    return op.poll_until_complete(op.submit_job({}), {})


def test_volume_helper_runs_only_when_a_stage_finds_its_directories_not_ready(trainer_image, tfpipe_home,
                                                                              docker_client):
    """The helper container that prepares directories runs when the engine has no volume directory yet, or
    when the stage, checking in its own container as its user, finds one it cannot write (exit 13); the
    stage then runs again. When they are ready, no helper runs and the engine is asked nothing."""
    op = _prep_operator(trainer_image, tfpipe_home)
    run_id = f"manual__hygiene_{uuid.uuid4().hex[:8]}"
    run_dir = tfpipe_home / "work" / "runs" / "hygiene" / run_id

    def containers_of(action, of_run: str = run_id) -> tuple[int, int, int]:
        """(helpers, stage containers, archive reads) of ``of_run`` while ``action`` runs."""
        events = CreatedContainers(docker_client, "hygiene")
        events.start()
        try:
            action()
        finally:
            created = events.stop()
        mine = [a for a in created if a.get("tfpipe.run_id") == of_run]
        reads = [a for a in events.archive_reads if a.get("tfpipe.run_id") == of_run]
        return (sum(1 for a in mine if a.get("tfpipe.role") == PREPARE_ROLE),
                sum(1 for a in mine if "tfpipe.role" not in a), len(reads))

    # a fresh host: work/ and models/ do not exist yet; one helper prepares every stage's directories
    assert containers_of(lambda: _run_try(op, run_id)) == (1, 1, 0)
    for path in (run_dir, tfpipe_home / "work" / "cache" / "cuda", tfpipe_home / "work" / "datasets",
                 tfpipe_home / "models" / op.spec.config["export"]["model_name"]):
        assert (path.stat().st_uid, path.stat().st_gid) == (1000, 1000), path
    # the next try (or the next stage) of the run finds them ready: no helper container at all
    assert containers_of(lambda: _run_try(op, run_id, try_number=2)) == (0, 1, 0)
    # the helper handed the DAG's runs directory (not the whole tree) to the user, so a new run, whose
    # run dir does not exist yet, needs no helper either: its stage makes the run dir itself
    runs = run_dir.parent
    assert (runs.stat().st_uid, runs.stat().st_gid) == (1000, 1000) and runs.parent.stat().st_uid == 0
    next_run = f"manual__hygiene_{uuid.uuid4().hex[:8]}"
    assert containers_of(lambda: _run_try(op, next_run), of_run=next_run) == (0, 1, 0)
    assert (runs / next_run).stat().st_uid == 1000
    # ... unless one of those directories is not the user's: the stage exits 13 before writing anything,
    # the helper prepares them, and the stage runs again, once
    os.chown(runs, 0, 0)
    third_run = f"manual__hygiene_{uuid.uuid4().hex[:8]}"
    result = {}
    assert containers_of(lambda: result.update(_run_try(op, third_run)), of_run=third_run) == (1, 2, 0)
    assert result["num_classes"] == 10, result
    assert (runs.stat().st_uid, (runs / third_run).stat().st_uid) == (1000, 1000)
    cache = tfpipe_home / "work" / "cache"
    os.chown(cache, 0, 0)
    assert containers_of(lambda: _run_try(op, run_id, try_number=3)) == (1, 2, 0)
    assert (cache.stat().st_uid, cache.stat().st_gid) == (1000, 1000)


def test_a_stage_that_cannot_write_its_directories_fails_naming_them_when_nothing_prepares_them(
        trainer_image, tfpipe_home):
    """With ``prepare_volumes`` off (the user manages the volumes), a directory the stage cannot write
    fails the task without retrying, before the stage wrote anything, and says which one and how to fix it."""
    op = _prep_operator(trainer_image, tfpipe_home)
    run_id = f"manual__hygiene_{uuid.uuid4().hex[:8]}"
    _run_try(op, run_id)  # the helper makes the volumes ready once
    datasets = tfpipe_home / "work" / "datasets"
    os.chown(datasets, 0, 0)
    before = sorted(os.listdir(datasets))
    manual = _prep_operator(trainer_image, tfpipe_home, prepare_volumes=False)
    with pytest.raises(StageRejectedError) as err:
        _run_try(manual, f"manual__hygiene_{uuid.uuid4().hex[:8]}")
    assert err.value.exit_code == contract.ExitCode.DIRS_NOT_READY
    message = str(err.value)
    assert "/work/datasets (owned by 0:0, mode 755)" in message and "uid 1000" in message, message
    assert "chown" in message and "prepare_volumes" in message, message
    assert datasets.stat().st_uid == 0 and sorted(os.listdir(datasets)) == before, "nothing may be written"


class _WorkerLost(BaseException):
    """The worker process dying: nothing after it runs, the container it started keeps running."""


#: the key the docs (Resume and recovery) say the container id is kept under (operators find it there across tries)
README_KEY = "tfpipe_container_id"


class _TaskStateStore:
    """The try's ``task_state_store`` as the mixin uses it (``get``/``set`` of the container id; Airflow
    keeps it in its metadata DB across tries), recording each id it is given and checking, as it is
    given, that the id names a container of this task that the engine still has."""

    def __init__(self, docker_client, run_id: str, lose_worker_after: int | None = None):
        self.client, self.run_id, self.lose_worker_after = docker_client, run_id, lose_worker_after
        self.values: dict[str, str] = {}
        self.history: list[str] = []

    def get(self, key: str):
        assert key == README_KEY, key
        return self.values.get(key)

    def set(self, key: str, value: str) -> None:
        assert key == README_KEY, key
        labels = self.client.api.inspect_container(value)["Config"]["Labels"]
        assert (labels["tfpipe.run_id"], labels["tfpipe.task_id"]) == (self.run_id, "prep"), labels
        self.values[key] = value
        self.history.append(value)
        if len(self.history) == self.lose_worker_after:
            raise _WorkerLost


@pytest.mark.skipif(not has_resumable_jobs(), reason="Airflow before 3.3 has no task_state_store to record it in")
def test_a_stage_started_again_after_preparing_directories_is_the_one_a_lost_worker_re_attaches_to(
        trainer_image, tfpipe_home, docker_client):
    """When the stage exits 13 and starts again in a new container, the try records the new container's id,
    as it recorded the first one's: a worker lost while that container runs leaves a next try that takes
    its result, with no third stage container."""
    run_id = f"manual__hygiene_{uuid.uuid4().hex[:8]}"
    op = _prep_operator(trainer_image, tfpipe_home)
    _run_try(op, run_id)  # the volumes exist; then the DAG's runs directory stops being the user's
    os.chown(tfpipe_home / "work" / "runs" / "hygiene", 0, 0)
    run_id = f"manual__hygiene_{uuid.uuid4().hex[:8]}"
    store = _TaskStateStore(docker_client, run_id, lose_worker_after=2)
    events = CreatedContainers(docker_client, "hygiene")
    events.start()
    try:
        with pytest.raises(_WorkerLost):
            _start_try(op, run_id, 1).execute_resumable(_try_context(op, run_id, 1, store))
        first, again = store.history
        assert first != again
        with pytest.raises(NotFound):  # the container that exited 13 is gone ...
            docker_client.api.inspect_container(first)
        # ... and the one started again keeps running without its worker
        assert docker_client.api.inspect_container(again)["State"]["Status"] in ("created", "running", "exited")
        next_try = _prep_operator(trainer_image, tfpipe_home)
        result = _start_try(next_try, run_id, 2).execute_resumable(_try_context(next_try, run_id, 2, store))
    finally:
        created = events.stop()
    assert result["num_classes"] == 10, result
    assert store.history == [first, again], "the next try must take the recorded container, not start one"
    stages = [a for a in created if a.get("tfpipe.run_id") == run_id and "tfpipe.role" not in a]
    helpers = [a for a in created if a.get("tfpipe.run_id") == run_id and a.get("tfpipe.role") == PREPARE_ROLE]
    assert (len(helpers), len(stages)) == (1, 2), created
    with pytest.raises(NotFound):
        docker_client.api.inspect_container(again)


def test_image_the_engine_lacks_and_cannot_pull_names_the_fix(trainer_image, tfpipe_home):
    op = _train_operator(trainer_image, tfpipe_home)
    assert op._ensure_image()["Id"].startswith("sha256:")  # present: its inspect, no pull
    op.image = "127.0.0.1:1/tfpipe/absent:0"  # a registry nobody listens on: the pull fails at once
    with pytest.raises(ImageNotFoundError) as raised:
        op._ensure_image()
    message = str(raised.value)
    # the engine it asked, the image it lacks, and the same fix as a pipeline with no image at all
    assert f"engine at {op.docker_url} has no image 127.0.0.1:1/tfpipe/absent:0" in message, message
    assert "Fix: build it (`make image`)" in message and "tfpipe_image" in message, message


def test_gpu_device_requests_on_an_engine_speaking_an_api_older_than_1_40_name_the_upgrade(trainer_image):
    """Device requests came with API 1.40 (Docker 19.03): a client held to 1.39 stands in for an older
    engine, since the engine answers in the version the client asks for."""
    from tfpipe.exceptions import GpuUnavailableError
    from tfpipe.hooks.docker import TfpipeDockerHook

    old = TfpipeDockerHook(version="1.39")
    with pytest.raises(GpuUnavailableError) as raised:
        old.require_api("1.40", "train: GPU device requests")
    assert str(raised.value) == (
        f"train: GPU device requests needs Docker API >= 1.40; the engine at {old.docker_url} speaks 1.39. "
        "Fix: upgrade Docker to 19.03 or newer.")
    TfpipeDockerHook(version="1.40").require_api("1.40", "train: GPU device requests")
    TfpipeDockerHook().require_api("1.40", "train: GPU device requests")  # this engine, negotiated
