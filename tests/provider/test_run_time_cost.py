"""What a run of a tfpipe pipeline asks Airflow, beyond the stages' own work, does not grow with the
DAG's history.

The engine-side half (a later run asks the engine nothing about its directories: no archive read)
is checked on a real engine by ``tests/integration/test_pipeline.py::test_digits_pipeline_end_to_end``.
"""

from __future__ import annotations

import logging

from tfpipe.operators.retention import active_run_ids


class RunStates:
    """The three run-time calls ``active_run_ids`` may use (``RuntimeTaskInstance``'s static methods,
    served by the metadata DB in a task), over a fixed table of runs, counting each call and how
    many runs each reply carries."""

    def __init__(self, run_id: str, runs: dict[str, tuple[str, dict[str, str]]]):
        self.run_id = run_id
        self.runs = runs  # run_id -> (run state, {task_id: task state})
        self.calls: list[tuple[str, int]] = []

    def get_dr_count(self, dag_id: str, states: list[str] | None = None, **_) -> int:
        self.calls.append(("get_dr_count", 1))
        return sum(1 for state, _tasks in self.runs.values() if states is None or state in states)

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        self.calls.append(("get_dagrun_state", 1))
        return self.runs[run_id][0]

    def get_task_states(self, dag_id: str, **_) -> dict[str, dict[str, str]]:
        self.calls.append(("get_task_states", len(self.runs)))
        return {run_id: dict(tasks) for run_id, (_state, tasks) in self.runs.items()}


def _history(finished: int) -> dict[str, tuple[str, dict[str, str]]]:
    runs = {f"scheduled__{i:04d}": ("success", {"prep": "success", "train": "success", "cleanup": "success"})
            for i in range(finished)}
    runs["manual__now"] = ("running", {"prep": "success", "train": "success", "cleanup": "running"})
    return runs


def test_active_runs_cost_the_same_small_calls_whatever_the_history():
    log = logging.getLogger(__name__)
    short, long = RunStates("manual__now", _history(3)), RunStates("manual__now", _history(3000))
    assert active_run_ids(short, "d", log) == active_run_ids(long, "d", log) == ["manual__now"]
    assert short.calls == long.calls
    # exactly the two small calls the docs (Scheduling: Retention) promise for this usual case: a count of the active
    # runs, then this run's state, each a one-value reply; a third call (or a read of every run's
    # task states) would be a cost paid on every run
    assert long.calls == [("get_dr_count", 1), ("get_dagrun_state", 1)], long.calls


def test_another_active_run_is_still_found_and_a_failed_one_is_not():
    runs = _history(5)
    runs["manual__retrying"] = ("running", {"prep": "success", "train": "up_for_retry", "cleanup": None})
    runs["manual__failed_long_ago"] = ("failed", {"prep": "failed", "train": None, "cleanup": "success"})
    states = RunStates("manual__now", runs)
    assert active_run_ids(states, "d", logging.getLogger(__name__)) == ["manual__now", "manual__retrying"]
