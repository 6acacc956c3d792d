"""Sampling helpers shared by figures whose single samples are too noisy to pair one to one."""

from __future__ import annotations

import statistics
from typing import Callable, Hashable, Sequence, TypeVar

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


def stratified_means(probe: Callable[[K, int], tuple[float, float]], a: K, b: K,
                     strata: Sequence[int]) -> tuple[dict[K, tuple[float, float]], dict[K, list[tuple[float, float]]]]:
    """One call of ``probe(side, stratum)`` on each of ``a`` and ``b`` per stratum, the order
    alternating from one stratum to the next (A B, B A, ...); returns each side's mean wall and mean
    CPU seconds over the strata, and its readings in stratum order.

    For a cost that depends on a setting neither side chooses (``dag_parse_ratio``: the depth of
    the caller's stack, which decides where CPython's frame stack crosses into a new chunk), a
    fair pair gives both sides the same settings, spread over the whole range, and compares what
    each costs on average: the mean, because a setting that costs one side dearly is part of its
    expected cost, not an outlier."""
    if not strata:
        raise ValueError("strata must name at least one setting")
    taken: dict[K, list[tuple[float, float]]] = {a: [], b: []}
    for j, stratum in enumerate(strata):
        for side in (a, b) if j % 2 == 0 else (b, a):
            taken[side].append(probe(side, stratum))
    means = {side: (statistics.fmean(s[0] for s in got), statistics.fmean(s[1] for s in got))
             for side, got in taken.items()}
    return means, taken
