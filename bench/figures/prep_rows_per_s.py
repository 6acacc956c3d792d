"""``prep_rows_per_s``: ``trainer.prep`` / the crude vectorised path, on the digits CSV repeated to 1,000,000 rows.

Runs ``bench/in_image/prep_speed.py`` in the trainer image (its docstring says what A and B are).
Information, no ratio target: the issue's target is A's rows/s (at least 50,000), reported with
both sides' peak RSS.
"""

from typing import Any

from harness import LOGS, Context, Figure, ratio_stats

ROWS = 1_000_000


def measure(ctx: Context) -> dict[str, Any]:
    result = ctx.in_image("prep_speed.py", ["--pairs", str(ctx.pairs), "--rows", str(ROWS)],
                          logfile=LOGS / "prep_rows_per_s.log", timeout=1800)
    stats = ratio_stats(result["a"], result["b"], result["a_cpu"], result["b_cpu"])
    stats.update({key: value for key, value in result.items() if key.endswith("peak_rss_mb")},
                 a_rows_per_s=round(ROWS / stats["a_median_s"]), b_rows_per_s=round(ROWS / stats["b_median_s"]))
    stats["info"] = (f"A {stats['a_rows_per_s']:,} rows/s vs B {stats['b_rows_per_s']:,} rows/s; peak RSS A "
                     f"{stats['a_peak_rss_mb']} MiB (+ workers {stats['a_workers_peak_rss_mb']} MiB each), B "
                     f"{stats['b_peak_rss_mb']} MiB")
    return stats


FIGURE = Figure("prep_rows_per_s", None, "trainer.prep on the digits CSV repeated to 1M rows / numpy.loadtxt + "
                "batched tf.io.serialize_tensor (rows/s, peak RSS)", measure, seconds=200)
