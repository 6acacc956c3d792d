"""prep_rows_per_s: tfpipe's prep stage against the crude vectorised baseline, in the trainer image.

A is ``trainer.prep`` on the digits CSV repeated to 1,000,000 rows; B is ``numpy.loadtxt`` then
batched ``tf.io.serialize_tensor`` into one TFRecord file (see ``bench/in_image/prep_speed.py``).
Besides the ratio, the figure reports both sides' rows/s and peak RSS, and prep plus one training
epoch at 20,000, 200,000 and 1,000,000 rows with how each grows.
"""

from __future__ import annotations

import math
from typing import Any

ROWS = 1_000_000
SCAN = (20_000, 200_000, ROWS)


def growth(scan: list[dict[str, Any]], key: str) -> str:
    """``x1.0 -> x9.8 -> x48`` of ``key`` against the smallest size, with the exponent of the fit."""
    first, last = scan[0], scan[-1]
    steps = " -> ".join(f"x{row[key] / first[key]:.1f}" for row in scan)
    exponent = math.log(last[key] / first[key]) / math.log(last["rows"] / first["rows"])
    return f"{steps} (time ~ rows^{exponent:.2f})"


def prep_speed(ctx, ratio_stats, logs) -> dict[str, Any]:
    """Run the in-image script; return the figure's entry (``ratio`` = A/B wall time per pair)."""
    result = ctx.in_image("prep_speed.py", ["--pairs", str(ctx.pairs), "--rows", str(ROWS),
                                            "--scan", ",".join(map(str, SCAN))],
                          logfile=logs / "prep_rows_per_s.log", timeout=1800)
    stats = ratio_stats(result["a"], result["b"], result["a_cpu"], result["b_cpu"])
    a_rate, b_rate = ROWS / stats["a_median_s"], ROWS / stats["b_median_s"]
    stats.update(unit=result["unit"], rows=ROWS, a_rows_per_s=round(a_rate), b_rows_per_s=round(b_rate),
                 a_peak_rss_mb=max(result["a_rss_mb"]), a_workers_peak_rss_mb=max(result["a_workers_rss_mb"]),
                 b_peak_rss_mb=max(result["b_rss_mb"]), scan=result["scan"])
    scan = result["scan"]
    sizes = "; ".join(f"{row['rows']:,} rows: prep {row['prep_s']} s, one epoch {row['epoch_s']} s" for row in scan)
    stats["info"] = (
        f"A {a_rate:,.0f} rows/s vs B {b_rate:,.0f} rows/s on {ROWS:,} rows (wall A/B {stats['ratio']}, process "
        f"CPU A/B {stats['cpu_ratio']}); peak RSS A {stats['a_peak_rss_mb']} MiB (+ workers "
        f"{stats['a_workers_peak_rss_mb']} MiB each), B {stats['b_peak_rss_mb']} MiB. {sizes}. Growth from "
        f"{scan[0]['rows']:,} rows: prep {growth(scan, 'prep_s')}, epoch {growth(scan, 'epoch_s')}")
    stats["why"] = ("B skips validation, the split, the stats and the fingerprint, writes one record per 1,000 rows "
                    "and holds the whole table in memory; A does all of that in bounded memory")
    return stats
