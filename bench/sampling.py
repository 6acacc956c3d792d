"""Sampling helpers shared by figures whose single samples are too noisy to pair one to one."""

from __future__ import annotations

import statistics
from typing import Callable, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)


def alternating_medians(probe: Callable[[K], tuple[float, float]], a: K, b: K,
                        samples: int) -> dict[K, tuple[float, float]]:
    """``samples`` calls of ``probe`` on each of ``a`` and ``b``, alternating (A B, B A, A B, ...),
    so drift within the block lands on both sides alike; returns each side's median wall and median
    CPU seconds (``probe`` returns ``(wall_s, cpu_s)``), taken apart."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    taken: dict[K, list[tuple[float, float]]] = {a: [], b: []}
    for j in range(samples):
        for side in (a, b) if j % 2 == 0 else (b, a):
            taken[side].append(probe(side))
    return {side: (statistics.median(s[0] for s in got), statistics.median(s[1] for s in got))
            for side, got in taken.items()}
