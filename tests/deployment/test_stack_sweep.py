"""``make up``'s stack runs the example sweep, ``tfpipe_digits_sweep``, on its Celery workers: 4 mapped
trials, 2 at a time, and the export names the best."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.deployment]

DAG_ID = "tfpipe_digits_sweep"


def test_the_stack_runs_the_example_sweep_s_4_trials_2_at_a_time_and_exports_the_best(stack, rest):
    """The deployed example DAG: its 4 trials are the mapped instances of train, each named after its
    settings; the stack's two worker slots run two of them at once and never more; select, the gate and
    the export follow, and the exported version's metadata names the trial with the best validation
    accuracy and its settings."""
    rest.wait_for_dag(DAG_ID)
    run_id = rest.trigger(DAG_ID, {"epochs": 2})
    run = rest.wait_for_run(DAG_ID, run_id, timeout=900)
    tis = rest.task_instances(DAG_ID, run_id)
    states = {(ti["task_id"], ti["map_index"]): ti["state"] for ti in tis}
    assert run["state"] == "success", states
    trains = sorted((ti for ti in tis if ti["task_id"] == "train"), key=lambda ti: ti["map_index"])
    assert [(ti["map_index"], ti["state"]) for ti in trains] == [(k, "success") for k in range(4)]
    assert all(ti["rendered_map_index"].startswith(f"trial {ti['map_index']}: learning_rate=") for ti in trains)

    # the task instances' spans: two at once, never three (their training loops alone may be too short to meet)
    events = sorted([(datetime.fromisoformat(ti["start_date"]), 1) for ti in trains]
                    + [(datetime.fromisoformat(ti["end_date"]), -1) for ti in trains])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    assert most == 2, events
    run_dir = stack.volumes / "work" / "runs" / DAG_ID / run_id
    finals = {k: json.loads((run_dir / "trials" / f"trial-{k}" / "train" / "final" / "final.json").read_text())
              ["final_val_accuracy"] for k in range(4)}

    export = rest.xcom(DAG_ID, run_id, "export")
    version_dir = stack.volumes / "models" / "digits_sweep" / str(export["version"])
    selection = json.loads((version_dir / "metadata.json").read_text())["selection"]
    best = max(sorted(finals), key=lambda k: finals[k])
    assert selection["trial"] == best and selection["trials"] == 4, (selection, finals)
    assert selection["params"] == rest.xcom(DAG_ID, run_id, "select")["params"]
    assert f"trial {best} of 4 chosen" in rest.run(DAG_ID, run_id)["note"]
