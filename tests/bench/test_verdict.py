"""The bench's verdict: a figure is judged against its own noise, on the time its target names.

A target is met when the median of the pairs is within it, or when the pairs' range spans it; it is
missed only when every pair is over it. ``train_loop_ratio``'s target is CPU time, the others' wall time.
"""

from __future__ import annotations

import harness
import run


def _entry(name: str, **measured: float) -> dict:
    """The ``results.json`` entry the harness writes for a figure that measured these values."""
    figure = next(f for f in run.FIGURES if f.name == name)
    return {"target": figure.target, "judged_on": figure.judged_on, **measured}


def test_the_median_within_the_target_meets_it():
    assert harness.verdict(_entry("dag_parse_ratio", ratio=1.04, min=0.98, max=1.30)) == "ok"
    assert harness.verdict(_entry("dag_parse_ratio", ratio=1.05, min=1.05, max=1.05)) == "ok"


def test_a_median_over_the_target_meets_it_when_the_pairs_range_spans_the_target():
    assert harness.verdict(_entry("dag_parse_ratio", ratio=1.08, min=1.02, max=1.15)) == "ok (noise)"


def test_a_figure_is_missed_when_every_pair_is_over_its_target():
    assert harness.verdict(_entry("dag_parse_ratio", ratio=1.08, min=1.06, max=1.15)) == "MISSED"


def test_the_train_loop_is_judged_on_its_cpu_ratio_and_cpu_range():
    assert {f.name for f in run.FIGURES if f.judged_on == "cpu_ratio"} == {"train_loop_ratio"}
    # quicker by the clock, dearer in CPU time in every pair: missed
    assert harness.verdict(_entry("train_loop_ratio", ratio=0.77, min=0.7, max=0.8, cpu_ratio=1.004,
                                  cpu_min=1.001, cpu_max=1.01)) == "MISSED"
    assert harness.verdict(_entry("train_loop_ratio", ratio=1.2, min=1.1, max=1.3, cpu_ratio=0.99,
                                  cpu_min=0.95, cpu_max=1.02)) == "ok"
    assert harness.verdict(_entry("train_loop_ratio", ratio=0.9, min=0.8, max=1.0, cpu_ratio=1.01,
                                  cpu_min=0.97, cpu_max=1.05)) == "ok (noise)"


def test_information_figures_failures_and_missing_values_have_no_pass_or_miss():
    assert harness.verdict(_entry("orchestration_overhead_ratio", ratio=1.8, min=1.7, max=2.0)) == "-"
    assert harness.verdict(_entry("dag_parse_ratio", ratio=None)) == "-"
    assert harness.verdict({**_entry("dag_parse_ratio"), "error": "the image is missing"}) == "ERROR"


def test_the_table_shows_the_median_and_the_range_of_wall_and_cpu_ratios():
    results = {"train_loop_ratio": _entry("train_loop_ratio", ratio=0.774, min=0.7, max=0.8, cpu_ratio=1.0041,
                                          cpu_min=1.001, cpu_max=1.01, pairs=5)}
    row = next(line for line in harness.table(results, list(results)).splitlines() if "train_loop_ratio" in line)
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells == ["train_loop_ratio", "0.774", "0.700-0.800", "1.004", "1.001-1.010", "5", "<= 1.0 (CPU)", "MISSED"]


def test_stats_are_the_median_and_range_of_the_per_pair_ratios():
    stats = harness.ratio_stats([2.0, 3.0, 4.0], [2.0, 2.0, 2.0], [1.0, 1.0, 3.0], [1.0, 2.0, 1.0])
    assert (stats["ratio"], stats["min"], stats["max"], stats["pairs"]) == (1.5, 1.0, 2.0, 3)
    assert (stats["cpu_ratio"], stats["cpu_min"], stats["cpu_max"]) == (1.0, 0.5, 3.0)
