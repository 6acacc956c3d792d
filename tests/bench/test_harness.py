"""The bench harness's pairing and its module layout."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import harness

BENCH = Path(harness.__file__).resolve().parent


def test_pairs_alternate_which_side_goes_first_and_keep_wall_and_cpu_apart():
    calls: list[str] = []

    def side(name: str, wall: float):
        def run(i: int) -> tuple[float, float]:
            calls.append(f"{name}{i}")
            return wall + i, wall / 10
        return run

    a, b, a_cpu, b_cpu = harness.interleave(SimpleNamespace(pairs=4), "test", side("A", 2.0), side("B", 1.0))
    assert calls == ["A0", "B0", "B1", "A1", "A2", "B2", "B3", "A3"]  # drift lands on both sides alike
    assert (a, b) == ([2.0, 3.0, 4.0, 5.0], [1.0, 2.0, 3.0, 4.0]) and (a_cpu[0], b_cpu[0]) == (0.2, 0.1)


def _bench_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names & {"run", "harness", "figures"}


def test_imports_run_one_way_from_run_to_the_figures_to_the_harness():
    assert _bench_imports(BENCH / "harness.py") == set()
    figures = [path for path in (BENCH / "figures").glob("*.py") if path.name != "__init__.py"]
    assert figures and all(_bench_imports(path) == {"harness"} for path in figures)
    assert _bench_imports(BENCH / "run.py") == {"harness", "figures"}
