"""``prep_mixed_rows_per_s``: ``trainer.prep`` of a mixed table of 1,000,000 rows / of 250,000 rows.

Runs ``bench/in_image/prep_speed.py --table mixed`` in the trainer image (its docstring says what
the table is), once with CSV and once with Parquet files. Information, no ratio target: the
issue's targets are A's rows/s (at least 50,000) and a peak RSS that does not grow with the rows
(A's against B's). The headline is CSV; Parquet's figures are under ``parquet``.
"""

from typing import Any

from harness import LOGS, Context, Figure, ratio_stats

ROWS, SMALL_ROWS = 1_000_000, 250_000


def measure(ctx: Context) -> dict[str, Any]:
    formats = {}
    for fmt in ("csv", "parquet"):
        result = ctx.in_image("prep_speed.py", ["--table", "mixed", "--format", fmt, "--pairs", str(ctx.pairs),
                                                "--rows", str(ROWS), "--b-rows", str(SMALL_ROWS)],
                              logfile=LOGS / "prep_mixed_rows_per_s.log", timeout=1800)
        formats[fmt] = s = ratio_stats(result["a"], result["b"], result["a_cpu"], result["b_cpu"])
        s.update({key: value for key, value in result.items() if key.endswith("peak_rss_mb")},
                 a_rows_per_s=round(ROWS / s["a_median_s"]), b_rows_per_s=round(SMALL_ROWS / s["b_median_s"]))
    return dict(formats["csv"], parquet=formats["parquet"], info="; ".join(
        f"{fmt}: {s['a_rows_per_s']:,} rows/s at 1M rows ({s['b_rows_per_s']:,} at 250k), peak RSS {s['a_peak_rss_mb']} "
        f"vs {s['b_peak_rss_mb']} MiB (workers {s['a_workers_peak_rss_mb']} vs {s['b_workers_peak_rss_mb']} MiB each)"
        for fmt, s in formats.items()))


FIGURE = Figure("prep_mixed_rows_per_s", None, "trainer.prep of a 1M-row table of 20 numeric and 10 text columns, "
                "5% empty, CSV and Parquet / the same at 250k rows (rows/s, peak RSS)", measure, seconds=1000)
