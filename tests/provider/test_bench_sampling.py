"""``bench/sampling.py``: how ``dag_parse_ratio`` makes one pair out of several noisy samples."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from sampling import alternating_medians  # noqa: E402


def test_the_sides_alternate_and_each_gets_its_own_wall_and_cpu_medians():
    calls: list[str] = []
    readings = {"A": iter([(1.0, 0.5), (5.0, 0.1), (2.0, 0.9)]), "B": iter([(3.0, 3.5), (4.0, 2.0), (9.0, 1.0)])}

    def probe(side: str) -> tuple[float, float]:
        calls.append(side)
        return next(readings[side])

    medians = alternating_medians(probe, "A", "B", 3)
    assert calls == ["A", "B", "B", "A", "A", "B"]  # drift within the block lands on both sides
    # wall and CPU medians are taken apart: A's median wall (2.0, third sample) and median CPU
    # (0.5, first sample) come from different samples
    assert medians == {"A": (2.0, 0.5), "B": (4.0, 2.0)}


def test_no_samples_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        alternating_medians(lambda side: (0.0, 0.0), "A", "B", 0)
