"""A tfpipe DAG run by the release's own scheduler, on every supported Airflow release.

Everything else in ``make test-compat`` runs DAGs through ``dag.test()``, which runs tasks in one
process without the execution API's tokens or the DAG processor. Here the release's
``airflow api-server`` (with the execution API), ``airflow dag-processor`` and ``airflow scheduler``
with the LocalExecutor run as separate processes on loopback, on a copy of the release's metadata
DB, as on a one-machine deployment: the DAG is parsed by the DAG processor, unpaused and triggered
through the REST API with a conf, and its tasks run as the executor's task processes, each with its
own token, the Cloud Storage tasks included (stage-in from the emulator, publish to it); then a
training container is killed and the scheduler's retry resumes it from its checkpoint, and a run
that fails on bad input sends its task's and its own failure alerts.
(The same with a Celery worker: ``test_release_celery.py``. ``make up``'s deployment, with
PostgreSQL, a TLS engine and several workers, is tested on the newest release.)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import quote

import pytest

from tests.airflow_servers import QUICK_BLESSED, AirflowProcess, ApiServer, release_home
from tests.conftest import write_dag
from tests.integration.conftest import digits_bucket, gcs_emulator  # noqa: F401  (the session's emulator fixture)
from tests.integration.test_alerts import (
    SMTP_CONN_ID,
    SMTP_CONNECTION,
    alert_mails,
    assert_prep_alert,
    assert_run_alert,
    write_alerting_dag,
)
from tests.integration.test_alerts import smtp_relay  # noqa: F401  (the relay fixture)
from tests.integration.test_resume import (
    TRAINING,
    _checkpointed_mid_training,
    _checkpoints_on_disk,
    _training_container,
    _wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.compat, pytest.mark.older_releases, pytest.mark.gcs]

DAG_ID = "tfpipe_release_scheduler"
RESUME_DAG = "tfpipe_release_resume"
ALERT_DAG = "tfpipe_release_alert"
STAGES = ("stage_in", "prep", "validate", "train", "evaluate", "export", "publish", "cleanup")


def _logs(root: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(root.glob("*.log")))


def _trigger(server: ApiServer, root: Path, dag_id: str, conf: dict) -> str:
    """Wait until the DAG processor has parsed ``dag_id``, unpause it and trigger a run with ``conf``;
    the run's REST path."""
    deadline = time.monotonic() + 180
    while server.get(f"/api/v2/dags/{dag_id}", user="admin")[0] != 200:
        assert time.monotonic() < deadline, f"the DAG processor did not parse {dag_id} in 180 s\n{_logs(root)}"
        time.sleep(2)
    server.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    run = server.call("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
    return f"/api/v2/dags/{dag_id}/dagRuns/{quote(run['dag_run_id'], safe='')}"


def _wait_for_run(server: ApiServer, root: Path, path: str, *, seconds: float,
                  components: Sequence[AirflowProcess] = ()) -> str:
    """The run's state once it is ``success`` or ``failed`` (the test fails after ``seconds``, or as
    soon as one of ``components`` has exited: a crashed scheduler would leave the run waiting)."""
    deadline = time.monotonic() + seconds
    while True:
        status, _, body = server.get(path, user="admin")
        state = json.loads(body)["state"] if status == 200 else None
        if state in ("success", "failed"):
            return state
        exited = [" ".join(c.proc.args[1:2]) for c in components if c.proc.poll() is not None]
        assert not exited, f"run still {state}: {exited} exited\n{_logs(root)}"
        assert time.monotonic() < deadline, f"run still {state} after {seconds:g} s\n{_logs(root)}"
        time.sleep(3)


def scheduler_env(settings: dict[str, str], home: Path, image: str, emulator: str, **executor: str) -> dict[str, str]:
    """The environment of a test's scheduler, DAG processor, api-server and workers: this process's,
    the release home's ``settings``, the ``executor`` settings, and the run's image and emulator."""
    env = {**os.environ, **settings, **executor,
           "AIRFLOW__CORE__PARALLELISM": "2",
           # every process signs and checks the tasks' and the users' tokens with the same key
           "AIRFLOW__API_AUTH__JWT_SECRET": "tfpipe-release-scheduler-test-" * 3,  # 64 bytes or more for HS512
           "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
           "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
           "TFPIPE_HOME": str(home), "TFPIPE_IMAGE": image, "AIRFLOW_VAR_TFPIPE_IMAGE": image,
           "TFPIPE_RETRY_DELAY": "1", "STORAGE_EMULATOR_HOST": emulator}
    for name in ("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", "GOOGLE_APPLICATION_CREDENTIALS"):
        env.pop(name, None)  # the emulator, with anonymous credentials
    return env


def start_scheduler(env: dict[str, str], root: Path) -> tuple[ApiServer, list[AirflowProcess]]:
    """The api-server (with the execution API), then the DAG processor and the scheduler, logging under ``root``;
    the caller stops them."""
    server = ApiServer(env, root / "api-server.log")
    env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"{server.url}/execution/"
    return server, [AirflowProcess(["dag-processor"], env, root / "dag-processor.log"),
                    AirflowProcess(["scheduler"], env, root / "scheduler.log")]


@pytest.fixture(scope="module")
def scheduled_run(tmp_path_factory, trainer_image, gcs_emulator):  # noqa: F811  (the fixture)
    """One run of a small tfpipe DAG, triggered through the REST API and run by the scheduler."""
    import airflow

    root = tmp_path_factory.mktemp("release-scheduler")
    home, dags, settings = release_home(root, DAG_ID, "admin:admin", **QUICK_BLESSED, gcs_tasks=True,
                                        local_data=False)
    bucket, conf = digits_bucket(gcs_emulator, "tfpipe-release")
    env = scheduler_env(settings, home, trainer_image, gcs_emulator, AIRFLOW__CORE__EXECUTOR="LocalExecutor")
    server, components = start_scheduler(env, root)
    try:
        path = _trigger(server, root, DAG_ID, conf)
        _wait_for_run(server, root, path, seconds=600, components=components)  # the tests judge its end state
        status, _, body = server.get(path + "/taskInstances", user="admin")
        tasks = {ti["task_id"]: ti for ti in json.loads(body)["task_instances"]}
        yield {"run": json.loads(server.get(path, user="admin")[2]), "tasks": tasks, "server": server,
               "home": home, "dags": dags, "root": root, "bucket": bucket, "components": components,
               "release": airflow.__version__, "logs": lambda: _logs(root)}
    finally:
        for component in components:
            component.stop()
        server.stop()


def test_the_scheduler_runs_every_stage_as_the_executor_s_task_processes(scheduled_run):
    run, tasks = scheduled_run["run"], scheduled_run["tasks"]
    states = {task: ti["state"] for task, ti in tasks.items()}
    assert run["state"] == "success", f"{scheduled_run['release']}: {states}\n{scheduled_run['logs']()}"
    assert states == {**dict.fromkeys(STAGES, "success"), "register": "skipped"}, states  # no MLflow connection
    assert all(ti["try_number"] == 1 for ti in tasks.values()), tasks
    # the model the export stage wrote, on the volume, with the run's id
    model = scheduled_run["home"] / "models" / DAG_ID / "1"
    metadata = json.loads((model / "metadata.json").read_text())
    assert metadata["run_id"] == run["dag_run_id"] and (model / "saved_model.pb").is_file()
    # the data came from the bucket, and the model went back to it
    staged = scheduled_run["home"] / "data" / "digits" / "digits.csv"
    assert staged.read_bytes() == scheduled_run["bucket"].blob("raw/digits.csv").download_as_bytes()
    published = {b.name for b in scheduled_run["bucket"].client.list_blobs(scheduled_run["bucket"].name,
                                                                          prefix=f"models/{DAG_ID}/1/")}
    assert f"models/{DAG_ID}/1/saved_model.pb" in published, sorted(published)


def test_the_scheduler_s_run_gets_its_note(scheduled_run):
    note = scheduled_run["run"]["note"]
    assert note and note.startswith("tfpipe: blessed, accuracy "), f"{scheduled_run['release']}: {note!r}"
    assert f"model {DAG_ID} v1" in note and "train 1 try" in note


def test_a_trigger_with_a_bad_param_is_refused_naming_it_and_starts_nothing(scheduled_run):
    """What a user gets from the REST API (and the UI's trigger form) of each release for a conf
    the DAG's Params reject: a 4xx naming the parameter, and no new run."""
    import urllib.error

    server = scheduled_run["server"]
    before = json.loads(server.get(f"/api/v2/dags/{DAG_ID}/dagRuns", user="admin")[2])["total_entries"]
    with pytest.raises(urllib.error.HTTPError) as err:
        server.call("POST", f"/api/v2/dags/{DAG_ID}/dagRuns", {"logical_date": None, "conf": {"epochs": "many"}})
    body = err.value.read().decode()
    assert 400 <= err.value.code < 500, f"{scheduled_run['release']}: {err.value.code} {body[:800]}"
    assert "epochs" in body, body[:800]
    after = json.loads(server.get(f"/api/v2/dags/{DAG_ID}/dagRuns", user="admin")[2])["total_entries"]
    assert after == before


@pytest.mark.resume
def test_a_killed_training_container_is_retried_by_the_scheduler_and_resumes(scheduled_run, docker_client):
    """The promise of the product on each release's own scheduler: the training container dies
    (SIGKILL), Airflow's scheduler retries ``train``, and the retry resumes from the newest
    checkpoint instead of starting over; prep is not run again."""
    server, home, root = scheduled_run["server"], scheduled_run["home"], scheduled_run["root"]
    # the first run staged the digits CSV in where this DAG reads it
    write_dag(scheduled_run["dags"], RESUME_DAG, training=TRAINING, retries=2)
    path = _trigger(server, root, RESUME_DAG, {})
    container = _wait_for(lambda: _training_container(docker_client, RESUME_DAG), 240, "the training container")
    _wait_for(lambda: _checkpointed_mid_training(home, RESUME_DAG), 240, "a checkpoint mid-training")
    container.kill()
    container.wait(timeout=60)
    # what a retry can resume from: read before the retry's own saves prune older ones
    on_disk = _checkpoints_on_disk(home, RESUME_DAG)
    assert on_disk, "no checkpoint on disk once the container died"
    assert _wait_for_run(server, root, path, seconds=600,
                         components=scheduled_run["components"]) == "success", scheduled_run["logs"]()
    status, _, body = server.get(path + "/taskInstances", user="admin")
    tries = {ti["task_id"]: ti["try_number"] for ti in json.loads(body)["task_instances"]}
    assert tries["train"] == 2 and tries["prep"] == 1, tries
    (run_dir,) = (home / "work" / "runs" / RESUME_DAG).iterdir()
    first, second = json.loads((run_dir / "attempts.json").read_text())
    assert (first["status"], second["status"]) == ("interrupted", "completed"), (first, second)
    assert second["resumed_from"]["step"] > 0 and second["start_step"] == second["resumed_from"]["step"]
    # the newest checkpoint, or (when the kill landed inside its index write, which the retry sets
    # aside in corrupt/) the one before it; never an older one
    set_aside = _checkpoints_on_disk(home, RESUME_DAG, under="corrupt")
    assert set_aside in ([], on_disk[-1:]), (set_aside, on_disk)
    assert second["resumed_from"]["step"] == max(set(on_disk) - set(set_aside)), (second["resumed_from"], on_disk)
    assert second["end_step"] == second["target_steps"]


def test_a_failed_run_mails_its_task_s_error_and_the_run_s_failure_through_the_release_s_notifiers(
        scheduled_run, smtp_relay):  # noqa: F811
    """Alerts where a deployment runs them, on every release: the executor's task process runs the
    task's failure callback, reads its SMTP connection from the metadata DB through the execution
    API and puts prep's error in the mail; the DAG processor runs the DAG's own callback and mails
    the run's failure (`tfpipe run` differs on both: test_alerts.py)."""
    server, root = scheduled_run["server"], scheduled_run["root"]
    connection = {"connection_id": SMTP_CONN_ID, "conn_type": SMTP_CONNECTION["conn_type"],
                  "host": SMTP_CONNECTION["host"], "port": smtp_relay.server_address[1],
                  "extra": json.dumps(SMTP_CONNECTION["extra"])}
    server.call("POST", "/api/v2/connections", connection)
    # the first run staged the digits CSV in where this DAG reads it; its label column is misnamed
    write_alerting_dag(scheduled_run["dags"], ALERT_DAG)
    path = _trigger(server, root, ALERT_DAG, {})
    assert _wait_for_run(server, root, path, seconds=300, components=scheduled_run["components"]) == "failed"
    status, _, body = server.get(path + "/taskInstances", user="admin")
    states = {ti["task_id"]: (ti["state"], ti["try_number"]) for ti in json.loads(body)["task_instances"]}
    assert states["prep"] == ("failed", 1) and states["train"][0] == "upstream_failed", states
    # the run's own callback runs in the DAG processor once the scheduler has sent it there
    deadline = time.monotonic() + 120
    while len(smtp_relay.messages) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    mails = alert_mails(smtp_relay)
    assert_prep_alert(mails, ALERT_DAG, with_error=True, why=scheduled_run["logs"]())
    assert_run_alert(mails, ALERT_DAG, json.loads(server.get(path, user="admin")[2])["dag_run_id"])
