"""``resume_cost_ratio``'s breakdown of the seconds a kill costs (bench/resume_breakdown.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import resume_breakdown  # noqa: E402


def test_try_startup_reads_the_stage_record_and_adds_the_container_start(tmp_path):
    entries = [{"try_number": 1}, {"try_number": 2, "process_started_at": 1000.75,
                                   "startup_s": {"process": 3.0, "model": 0.5, "first_call": 1.25, "other": 9}}]
    (tmp_path / "attempts.json").write_text(json.dumps(entries))
    assert resume_breakdown.try_startup(tmp_path, launched_wall=1000.0) == {
        "process": 3.0, "model": 0.5, "first_call": 1.25, "container": 0.75}
    assert resume_breakdown.try_startup(tmp_path / "missing", 0.0) == {}


def test_summary_is_the_median_of_each_part_and_what_they_leave_unexplained():
    def kill(container, process, redone_s):
        return {"killed": True, "kill_to_exit_s": 0.5, "steps_redone_s": redone_s,
                "second_try_startup_s": {"container": container, "process": process}}
    kills = [kill(1.0, 3.0, 2.0), kill(2.0, 5.0, 0.0), kill(3.0, 4.0, 1.0), {"killed": False}]
    lost = [7.0, 8.0, 9.5, 0.2]
    summary = resume_breakdown.summarize(kills, lost)
    assert summary == {"container": 2.0, "process": 4.0, "kill_to_exit": 0.5, "steps_redone": 1.0,
                       "unexplained": 0.5}  # per pair: 0.5, 0.5, 1.0 (the unkilled pair is left out)
    assert resume_breakdown.summarize([{"killed": False}], [0.1]) == {}
    assert resume_breakdown.describe({"container": 2.0, "process": 4.04}) == "container 2.0 s, process 4.0 s"
