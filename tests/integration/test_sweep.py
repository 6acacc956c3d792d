"""The example sweep, ``dags/tfpipe_digits_sweep.py``, through Airflow with real containers.

On a scheduler (``airflow scheduler`` with the LocalExecutor, the api-server and the DAG processor as
separate processes, as on a one-machine deployment): 4 mapped trials, at most 2 at once; a trial
SIGKILLed mid-training is the only one retried, and resumes from its own checkpoint; the export's
metadata names the trial with the best validation metric. Through ``tfpipe run`` (``dag.test()``):
the same 4 trials, one after another, and the same choice.
"""

from __future__ import annotations

import json
import shutil
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.airflow_servers import release_home
from tests.conftest import REPO, run_dag
from tests.integration.test_release_scheduler import _logs, _trigger, _wait_for_run, scheduler_env, start_scheduler
from tests.integration.test_resume import _wait_for

pytestmark = [pytest.mark.integration]

DAG_ID = "tfpipe_digits_sweep"
EXAMPLE = REPO / "dags" / f"{DAG_ID}.py"
#: fewer epochs than the example's 8 (a run Param reaches every trial): enough to kill one mid-training
CONF = {"epochs": 4}


def _plan() -> list[dict]:
    import runpy

    return runpy.run_path(str(EXAMPLE))["dag"].get_task("train").expand_input.value["trial"]


def _trial_dir(home: Path, k: int) -> Path:
    (run_dir,) = (home / "work" / "runs" / DAG_ID).iterdir()
    return run_dir / "trials" / f"trial-{k}"


def _running_trial(client) -> tuple[object, int] | None:
    """A running trial's container and its index."""
    found = client.containers.list(filters={"label": [f"tfpipe.dag_id={DAG_ID}", "tfpipe.stage=train"],
                                            "status": "running"})
    found = [c for c in found if "tfpipe.role" not in c.labels]
    return (found[0], int(found[0].labels["tfpipe.map_index"])) if found else None


def _checkpointed(home: Path, k: int) -> bool:
    try:
        attempts = json.loads((_trial_dir(home, k) / "attempts.json").read_text())
    except (OSError, ValueError):
        return False
    current = attempts[-1] if attempts else {}
    return current.get("status") == "running" and bool(current.get("last_checkpoint")) and \
        current.get("epochs_run", 0) >= 2


def _best_trial(home: Path, trials: int) -> int:
    """The trial with the highest validation accuracy at its final weights, read from each trial's files."""
    scores = {k: json.loads((_trial_dir(home, k) / "train" / "final" / "final.json").read_text())
              ["final_val_accuracy"] for k in range(trials)}
    return max(sorted(scores), key=lambda k: scores[k])


def _most_at_once(intervals: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


@pytest.fixture(scope="module")
def scheduled_sweep(tmp_path_factory, trainer_image, docker_client):
    """One run of the example sweep by a scheduler, with one trial's container killed mid-training."""
    root = tmp_path_factory.mktemp("sweep")
    home, dags, settings = release_home(root, "tfpipe_unused", "admin:admin")
    (dags / "tfpipe_unused.py").unlink()
    shutil.copy(EXAMPLE, dags / EXAMPLE.name)
    env = scheduler_env(settings, home, trainer_image, "http://127.0.0.1:9", AIRFLOW__CORE__EXECUTOR="LocalExecutor")
    env["AIRFLOW__CORE__PARALLELISM"] = "8"  # the sweep's own cap, not the executor's, must hold trials to 2
    server, components = start_scheduler(env, root)
    try:
        path = _trigger(server, root, DAG_ID, CONF)
        container, killed = _wait_for(lambda: _running_trial(docker_client), 300, "a running trial")
        _wait_for(lambda: _checkpointed(home, killed), 240, f"trial {killed} checkpointed mid-training")
        container.kill()
        killed_at = datetime.now(timezone.utc)
        container.wait(timeout=60)
        state = _wait_for_run(server, root, path, seconds=900, components=components)
        tis = json.loads(server.get(path + "/taskInstances", user="admin")[2])["task_instances"]
        yield {"state": state, "run": json.loads(server.get(path, user="admin")[2]), "tis": tis, "home": home,
               "killed": killed, "killed_at": killed_at, "logs": lambda: _logs(root)}
    finally:
        for component in components:
            component.stop()
        server.stop()


def test_the_scheduler_runs_the_4_trials_as_mapped_train_instances_2_at_a_time(scheduled_sweep):
    """The example's 4 trials are the 4 mapped instances of train, each named after its settings in the UI;
    the run's own cap holds them to 2 at once (the executor could run 8), and it does run 2 at once."""
    assert scheduled_sweep["state"] == "success", scheduled_sweep["logs"]()
    trains = sorted((ti for ti in scheduled_sweep["tis"] if ti["task_id"] == "train"), key=lambda ti: ti["map_index"])
    assert [ti["map_index"] for ti in trains] == [0, 1, 2, 3]
    assert all(ti["state"] == "success" for ti in trains), trains
    plan = _plan()
    for ti, trial in zip(trains, plan):
        settings = ", ".join(f"{key}={value}" for key, value in trial["params"].items())
        assert ti["rendered_map_index"] == f"trial {trial['index']}: {settings}"
    intervals = [(datetime.fromisoformat(ti["start_date"]), datetime.fromisoformat(ti["end_date"])) for ti in trains]
    assert _most_at_once(intervals) == 2, intervals
    attempts = [json.loads((_trial_dir(scheduled_sweep["home"], k) / "attempts.json").read_text()) for k in range(4)]
    # a killed attempt records no end: it ended when the test killed it
    spans = [(datetime.fromisoformat(a["start_time"]),
              datetime.fromisoformat(a["end_time"]) if a["end_time"] else scheduled_sweep["killed_at"])
             for trial in attempts for a in trial]
    assert _most_at_once(spans) <= 2, spans
    states = {ti["task_id"]: ti["state"] for ti in scheduled_sweep["tis"] if ti["task_id"] != "train"}
    assert states == {"prep": "success", "validate": "success", "select": "success", "evaluate": "success",
                      "export": "success", "cleanup": "success", "register": "skipped"}, states


def test_a_killed_trial_is_the_only_one_retried_and_resumes_from_its_own_checkpoint(scheduled_sweep):
    killed, home = scheduled_sweep["killed"], scheduled_sweep["home"]
    tries = {ti["map_index"]: ti["try_number"] for ti in scheduled_sweep["tis"] if ti["task_id"] == "train"}
    assert tries == {k: 2 if k == killed else 1 for k in range(4)}, (killed, tries)
    first, second = json.loads((_trial_dir(home, killed) / "attempts.json").read_text())
    assert (first["status"], second["status"]) == ("interrupted", "completed"), (first, second)
    assert second["resumed_from"]["step"] > 0 and second["start_step"] == second["resumed_from"]["step"]
    assert str(_trial_dir(home, killed).name) in second["resumed_from"]["checkpoint"]
    prep = next(ti for ti in scheduled_sweep["tis"] if ti["task_id"] == "prep")
    assert prep["try_number"] == 1, "every trial reads the one data set prep made"


def test_the_export_names_the_trial_with_the_best_validation_metric_and_its_settings(scheduled_sweep):
    home = scheduled_sweep["home"]
    best = _best_trial(home, 4)
    (version,) = (home / "models" / "digits_sweep").iterdir()
    selection = json.loads((version / "metadata.json").read_text())["selection"]
    assert selection["trial"] == best and selection["params"] == _plan()[best]["params"]
    assert selection["metric"] == "val_accuracy" and selection["trials"] == 4
    final = json.loads((_trial_dir(home, best) / "train" / "final" / "final.json").read_text())
    assert selection["value"] == pytest.approx(final["final_val_accuracy"])
    assert f"trial {best} of 4 chosen: " in scheduled_sweep["run"]["note"], scheduled_sweep["run"]["note"]


def test_tfpipe_run_runs_the_example_s_4_trials_one_after_another_and_exports_the_best(tmp_path, tfpipe_home,
                                                                                      trainer_image):
    """``tfpipe run`` drives the run with ``dag.test()``, one task at a time: the 4 trials run in turn, and
    the export names the best of them, as on a scheduler."""
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(EXAMPLE, dags / EXAMPLE.name)
    started = time.time()
    summary, log = run_dag(DAG_ID, {"epochs": 1}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    assert summary["state"] == "success", log[-6000:]
    assert {k: v["state"] for k, v in summary["tasks"].items() if k.startswith("train")} == {
        f"train[{k}]": "success" for k in range(4)}
    spans = []
    for k in range(4):
        (attempt,) = json.loads((_trial_dir(tfpipe_home, k) / "attempts.json").read_text())
        spans.append((datetime.fromisoformat(attempt["start_time"]), datetime.fromisoformat(attempt["end_time"])))
    assert _most_at_once(spans) == 1, spans
    assert min(s for s, _ in spans).timestamp() >= started - 1
    selection = json.loads((Path(summary["model_dir"]) / "metadata.json").read_text())["selection"]
    best = _best_trial(tfpipe_home, 4)
    assert selection["trial"] == best and selection["params"] == _plan()[best]["params"]
