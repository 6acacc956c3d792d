"""``bench/sampling.py`` and ``dag_parse_ratio``'s probe: how a pair is made out of several noisy samples."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import run  # noqa: E402, F401  (figures_provider imports from it)
from figures_provider import PARSE_DEPTH_STEP, PARSE_DEPTH_STRATA, PARSE_PROBE, parse_depths  # noqa: E402
from sampling import alternating_medians, stratified_means  # noqa: E402


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


def test_each_stratum_gets_both_sides_alternating_and_the_means_count_every_stratum():
    calls: list[tuple[str, int]] = []
    cost = {("A", 0): (1.0, 0.5), ("B", 0): (2.0, 1.0), ("A", 7): (9.0, 4.5), ("B", 7): (2.0, 1.0),
            ("A", 3): (2.0, 1.0), ("B", 3): (5.0, 4.0)}

    def probe(side: str, stratum: int) -> tuple[float, float]:
        calls.append((side, stratum))
        return cost[side, stratum]

    means, readings = stratified_means(probe, "A", "B", [0, 7, 3])
    assert calls == [("A", 0), ("B", 0), ("B", 7), ("A", 7), ("A", 3), ("B", 3)]
    # means, not medians: A's one dear stratum (7) is part of what A costs
    assert means == {"A": (4.0, 2.0), "B": (3.0, 2.0)}
    assert readings["A"] == [(1.0, 0.5), (9.0, 4.5), (2.0, 1.0)]


def test_no_strata_is_refused():
    with pytest.raises(ValueError, match="at least one"):
        stratified_means(lambda side, stratum: (0.0, 0.0), "A", "B", [])


#: Counts the anonymous memory mapped into the process (/proc/self/maps: the lines without a path)
#: at the bottom of ``nested(depth)`` for growing depths, and prints the depths at which it grew by
#: one 16 kB frame-stack chunk. Recursion allocates nothing else, so those are the chunk ends.
_CHUNK_ENDS = r"""
import json

def anon():
    total = 0
    with open("/proc/self/maps", "rb") as maps:
        for line in maps.read().splitlines():
            parts = line.split()
            if len(parts) == 5:
                start, end = parts[0].split(b"-")
                total += int(end, 16) - int(start, 16)
    return total

{nested}
previous, ends = nested(0), []
for depth in range(700):
    now = nested(depth)
    if now - previous == 16384:
        ends.append(depth)
    previous = now
print(json.dumps(ends))
"""


def test_the_pairs_depths_span_one_frame_stack_chunk_of_the_probes_frames():
    # the probe's own nesting function, as it runs in the probe, calling the counter at the bottom
    nested = re.search(r"^def nested\(depth\):.*\n(?:    .*\n)+", PARSE_PROBE, re.M).group(0).replace("parse()", "anon()")
    out = subprocess.run([sys.executable, "-c", _CHUNK_ENDS.format(nested=nested)], check=True,
                         capture_output=True, text=True).stdout
    ends = json.loads(out)
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    # a new chunk every so many frames (one frame either way: where the first one started)
    assert len(ends) >= 3 and max(gaps) - min(gaps) <= 1, ends
    frames_per_chunk = max(gaps)
    assert 130 <= frames_per_chunk <= 160, frames_per_chunk  # "about 146" (figures_provider.py)
    # each pair has one depth in every stratum of PARSE_DEPTH_STEP frames, shifted per pair, and the
    # strata span one chunk
    depths = [parse_depths(pair) for pair in range(6)]
    for d in depths:
        assert [x // PARSE_DEPTH_STEP for x in d] == list(range(PARSE_DEPTH_STRATA))
    assert len({d[0] for d in depths}) == 6
    assert abs(PARSE_DEPTH_STEP * PARSE_DEPTH_STRATA - frames_per_chunk) <= 0.05 * frames_per_chunk


def test_the_probe_parses_the_file_that_many_frames_deeper(tmp_path):
    dag_file = tmp_path / "depth_probe.py"
    dag_file.write_text("import sys\nf = sys._getframe()\nn = 0\nwhile f is not None:\n"
                        "    n += 1\n    f = f.f_back\nprint('DEPTH', n)\n")
    depth = {}
    for asked in (0, 30):
        out = subprocess.run([sys.executable, "-c", PARSE_PROBE, str(dag_file), str(asked)], check=True,
                             capture_output=True, text=True, cwd=REPO).stdout.splitlines()
        depth[asked] = int(next(line for line in out if line.startswith("DEPTH")).split()[1])
        assert set(json.loads(out[-1])) == {"seconds", "cpu"}
    assert depth[30] - depth[0] == 30
