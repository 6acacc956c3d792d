"""Where the seconds a killed-and-resumed train try loses go (``resume_cost_ratio``'s breakdown).

The train stage records its own start-up in its ``attempts.json`` entry (``startup_s``: the
phases ``process`` (interpreter and imports), ``dataset``, ``model``, ``restore``,
``first_call`` (the first compiled call, which traces), ``first_save`` and ``first_eval``, and
``process_started_at`` on the host's clock). The bench adds what only it sees: the container's
start (``docker run`` launched to the process running) and the killed try's end (kill to the
``docker run`` client's exit, container removal included). The rest of what a kill costs is the
steps redone and what none of these explain.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

#: The train stage's start-up phases, in the order they happen.
STAGE_PHASES = ("process", "dataset", "model", "restore", "first_call", "first_save", "first_eval")


def try_startup(run_dir: Path, launched_wall: float) -> dict[str, float]:
    """The start-up seconds of the run's newest try, by phase, plus ``container`` (launch to process
    start); empty when the try left no record."""
    try:
        entry = json.loads((run_dir / "attempts.json").read_text())[-1]
    except (OSError, ValueError, IndexError):
        return {}
    phases = {k: float(v) for k, v in (entry.get("startup_s") or {}).items() if k in STAGE_PHASES}
    started = entry.get("process_started_at")
    if started:
        phases["container"] = round(max(0.0, float(started) - launched_wall), 3)
    return phases


def summarize(kills: list[dict[str, Any]], seconds_lost: list[float]) -> dict[str, Any]:
    """Medians over the killed tries of each part of the seconds lost (``restart_breakdown_s``),
    with ``unexplained`` = seconds lost minus the parts, per pair."""
    killed = [(k, lost) for k, lost in zip(kills, seconds_lost) if k.get("killed")]
    if not killed:
        return {}
    keys = ["container", *STAGE_PHASES, "kill_to_exit", "steps_redone"]
    parts: dict[str, list[float]] = {key: [] for key in keys}
    unexplained = []
    for kill, lost in killed:
        row = dict(kill.get("second_try_startup_s") or {})
        row["kill_to_exit"] = kill.get("kill_to_exit_s", 0.0)
        row["steps_redone"] = kill.get("steps_redone_s", 0.0)
        for key in keys:
            if key in row:
                parts[key].append(float(row[key]))
        unexplained.append(lost - sum(float(row.get(key, 0.0)) for key in keys))
    out = {key: round(statistics.median(values), 2) for key, values in parts.items() if values}
    out["unexplained"] = round(statistics.median(unexplained), 2)
    return out


def describe(breakdown: dict[str, Any]) -> str:
    """``container 0.6 s, process 3.1 s, ...`` for the figure's ``why``."""
    return ", ".join(f"{key} {value:.1f} s" for key, value in breakdown.items())
