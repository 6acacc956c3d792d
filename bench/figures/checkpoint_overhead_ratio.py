"""``checkpoint_overhead_ratio``: ``Loop.fit`` with its checkpoints / with the save a no-op.

Runs ``bench/in_image/checkpoint_overhead.py`` in the trainer image: the ``cnn`` on the synthetic
64x64 RGB images, a checkpoint every 20 steps and at every epoch end. Beside the pairs it reports
the saves' own time as a share of a run without them (``direct_estimate``).
"""

from typing import Any

from harness import LOGS, Context, Figure, ratio_stats


def measure(ctx: Context) -> dict[str, Any]:
    result = ctx.in_image("checkpoint_overhead.py", ["--pairs", str(ctx.pairs), "--epochs", "2", "--every", "20"],
                          logfile=LOGS / "checkpoint_overhead_ratio.log", timeout=900, mount_root=ctx.images_root())
    stats = ratio_stats(result["a"], result["b"], result["a_cpu"], result["b_cpu"])
    share = result["saves_per_run"] * result["ms_per_save"] / 1000.0 / stats["b_median_s"]
    stats["direct_estimate"] = round(1 + share, 4)
    stats["info"] = (f"{result['saves_per_run']} saves x {result['ms_per_save']} ms = {100 * share:.1f}% of the "
                     f"median run without checkpoints ({result['steps']} steps)")
    return stats


FIGURE = Figure("checkpoint_overhead_ratio", 1.05, "Loop.fit wall time with per-epoch + per-20-step checkpoints / "
                "with the save a no-op", measure, seconds=150)
