"""``bench/run.py``'s verdict: each figure is judged on the time its target names.

``train_loop_ratio``'s target is CPU time on every model; the others are wall time. A run whose
training loop is quicker by the clock but dearer in CPU time must read "MISSED", not "ok".
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import run as bench  # noqa: E402


def _entry(name: str, *, ratio: float, cpu_ratio: float) -> dict:
    """The entry ``main`` writes to results.json for a figure that measured these ratios."""
    figure = next(f for f in bench.FIGURES if f.name == name)
    return bench.result_entry(figure, {"ratio": ratio, "cpu_ratio": cpu_ratio, "why": "the run's explanation"},
                              seconds=1.0, image="tfpipe/trainer:test")


def test_the_train_loop_is_judged_on_cpu_time_and_the_others_on_wall_time():
    assert {f.name for f in bench.FIGURES if f.judged_on == "cpu_ratio"} == {"train_loop_ratio"}
    # 2026-12-04 11:34's run: the CNN quicker by the clock (0.774), CPU 1.004 against a target of 1.00
    loop = _entry("train_loop_ratio", ratio=0.774, cpu_ratio=1.0041)
    assert loop["judged_on"] == "cpu_ratio" and loop["target"] == 1.0  # as results.json records it
    assert bench.verdict(loop) == "MISSED"
    assert bench.verdict({**loop, "cpu_ratio": 0.999}) == "ok"
    assert bench.verdict({**loop, "ratio": 1.2, "cpu_ratio": 0.999}) == "ok"
    parse = _entry("dag_parse_ratio", ratio=1.06, cpu_ratio=1.01)
    assert bench.verdict(parse) == "MISSED"
    assert bench.verdict({**parse, "ratio": 1.04, "cpu_ratio": 1.2}) == "ok"


def test_a_miss_is_printed_with_the_value_it_was_judged_on():
    results = {"train_loop_ratio": _entry("train_loop_ratio", ratio=0.774, cpu_ratio=1.0041),
               "dag_parse_ratio": _entry("dag_parse_ratio", ratio=1.1227, cpu_ratio=1.124)}
    lines = bench.explanations(results, list(results))
    assert "- `train_loop_ratio` misses its target (CPU ratio 1.0041 > 1.0): the run's explanation" in lines
    assert "- `dag_parse_ratio` misses its target (ratio 1.1227 > 1.05): the run's explanation" in lines
    table = bench.table(results, list(results))
    row = next(line for line in table.splitlines() if line.startswith("| train_loop_ratio"))
    assert "MISSED" in row


def test_an_entry_without_its_judged_value_has_no_verdict():
    assert bench.verdict({"ratio": 0.9, "cpu_ratio": None, "target": 1.0, "judged_on": "cpu_ratio"}) == "-"
    assert bench.verdict({"ratio": None, "target": 1.0}) == "-"  # results written before judged_on existed
    assert bench.verdict({"ratio": 0.9, "target": 1.0}) == "ok"
