"""What the stage container runs with: jemalloc, the CPU limit and the time zone, seen from
inside a container the operator creates (its real host config and environment) and through
``docker inspect``."""

from __future__ import annotations

import json
import re
import uuid

import pytest
from airflow.sdk import DAG

from tfpipe.config import PipelineConfig
from tfpipe.operators import PrepOperator, TrainOperator
from tfpipe.specs import config_template
from tfpipe.tries import TryIdentity, resolve_try

pytestmark = pytest.mark.integration

# Runs as the stage does (same image, user, environment, host config); prints what it sees.
PROBE = ("import json, subprocess; from trainer import common; "
         "date = subprocess.check_output(['date', '+%Z %z']).decode().strip(); "
         "print('PROBE ' + json.dumps({'malloc': common.allocator(), 'date': date, "
         "'cpus': common.cpu_limit()}))")


def _stage_operator(operator, stage, image, home, **resources):
    """A ``stage`` operator of a one-task DAG "runtime" on ``home``'s volumes with ``resources``."""
    cfg = PipelineConfig.from_dict({
        "dag_id": "runtime", "image": {"ref": image}, "data": {"path": "digits/digits.csv"},
        "volumes": {"data": f"{home}/data", "work": f"{home}/work", "models": f"{home}/models"},
        "resources": resources,
    })
    with DAG("runtime", schedule=None):
        return operator(task_id=stage, image=image, stage_config=config_template(cfg, stage), volumes=cfg.volumes,
                        cpus=cfg.resources.cpus, timezone=cfg.resources.timezone, jemalloc=cfg.resources.jemalloc)


# How many parse workers prep starts (one per usable CPU) beside the CPUs its affinity mask allows.
WORKERS_PROBE = ("import json, os; from trainer import prep; "
                 "print('PROBE ' + json.dumps({'workers': prep.usable_cpus(), "
                 "'affinity': len(os.sched_getaffinity(0))}))")


def _probe(image, home, docker_client, probe=PROBE, **resources):
    op = _stage_operator(TrainOperator, "train", image, home, **resources)
    op.container_name = f"tfpipe-test-runtime-{uuid.uuid4().hex[:8]}"
    op.labels = {"tfpipe.test": "runtime"}
    op.command = ["python3", "-c", probe]
    op.entrypoint = None
    op.mounts = []  # the probe reads no volume
    try:
        # the operator's own container creation, as submit_job uses it
        container = op._create_and_start()
        op.cli.wait(container["Id"])
        lines = op.cli.logs(container["Id"]).decode("utf-8", "replace").splitlines()
        inspected = docker_client.api.inspect_container(op.container_name)
    finally:
        docker_client.api.remove_container(op.container_name, force=True)
    line = next(str(x) for x in lines if str(x).startswith("PROBE "))
    return json.loads(line[len("PROBE "):]), inspected


def test_default_stage_has_jemalloc_utc_and_no_cpu_limit(trainer_image, tfpipe_home, docker_client):
    seen, inspected = _probe(trainer_image, tfpipe_home, docker_client)
    assert seen == {"malloc": "jemalloc", "date": "UTC +0000", "cpus": None}
    env = dict(e.split("=", 1) for e in inspected["Config"]["Env"])
    assert env["TZ"] == "UTC" and env["LD_PRELOAD"].endswith("/libjemalloc.so.2")
    assert inspected["HostConfig"]["NanoCpus"] == 0


def test_cpus_timezone_and_jemalloc_off_reach_the_container(trainer_image, tfpipe_home, docker_client):
    seen, inspected = _probe(trainer_image, tfpipe_home, docker_client,
                             cpus=1.5, timezone="Asia/Shanghai", jemalloc=False)
    assert seen == {"malloc": "glibc", "date": "CST +0800", "cpus": 1.5}
    env = dict(e.split("=", 1) for e in inspected["Config"]["Env"])
    assert env["TZ"] == "Asia/Shanghai" and env["LD_PRELOAD"] == ""
    assert inspected["HostConfig"]["NanoCpus"] == 1_500_000_000


def test_prep_starts_a_worker_per_cpu_of_its_affinity_capped_by_the_cpu_quota(trainer_image, tfpipe_home,
                                                                              docker_client):
    free, _ = _probe(trainer_image, tfpipe_home, docker_client, probe=WORKERS_PROBE)
    assert free["workers"] == free["affinity"] >= 1
    half, _ = _probe(trainer_image, tfpipe_home, docker_client, probe=WORKERS_PROBE, cpus=0.5)
    # --cpus 0.5 on any number of cores: one worker (a quota rounds up to whole CPUs)
    assert half == {"workers": 1, "affinity": free["affinity"]}


def test_the_image_itself_preloads_jemalloc_and_has_tzdata(trainer_image, docker_client):
    # Outside tfpipe too (docker run IMAGE ...): the image's own config preloads jemalloc.
    out = docker_client.containers.run(
        trainer_image, ["sh", "-c", "grep -c libjemalloc /proc/self/maps; TZ=Europe/Berlin date +%Z"],
        remove=True, environment={}).decode().split()
    assert int(out[0]) >= 1 and out[1] in ("CET", "CEST")


# A line the trainer logs (``2026-11-29 18:00:00 INFO message``), not TensorFlow's or Python's.
TRAINER_LINE = re.compile(r"\b\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO (.*?)(?: \[airflow\.task\S*\].*)?$")


def _first_stage_lines(image, home, capfd, count=3, **resources):
    """The first ``count`` lines the trainer logged in a real prep stage, as the task log shows them
    (Airflow's task logger writes them to the test's output): the operator's own start and follow path
    (submit_job, poll_until_complete)."""
    op = _stage_operator(PrepOperator, "prep", image, home, **resources)
    plan = resolve_try(op.spec, TryIdentity("runtime", f"manual__runtime_{uuid.uuid4().hex[:8]}", "prep"),
                       image=image)
    op._plan, op.container_name, op.labels = plan, plan.name, dict(plan.labels)
    op._dirs_ready = False
    capfd.readouterr()
    result = op.poll_until_complete(op.submit_job({}), {})
    assert result["num_classes"] == 10, result  # the stage ran to its end
    logged = [m.group(1) for m in map(TRAINER_LINE.search, "\n".join(capfd.readouterr()).splitlines()) if m]
    return logged[:count]


def test_a_stage_first_logs_its_allocator_time_zone_and_cpu_limit(trainer_image, tfpipe_home, capfd):
    """A real prep stage says, among its first lines in the task log, which allocator, time zone and
    CPU limit it runs with: the defaults, then the config's ``timezone``, ``cpus`` and ``jemalloc``."""
    first = _first_stage_lines(trainer_image, tfpipe_home, capfd)
    assert "process: malloc jemalloc, time zone UTC (UTC +0000), all CPUs" in first, first
    first = _first_stage_lines(trainer_image, tfpipe_home, capfd, cpus=1.5, timezone="Asia/Shanghai",
                               jemalloc=False)
    assert "process: malloc glibc, time zone Asia/Shanghai (CST +0800), 1.5 CPUs" in first, first
