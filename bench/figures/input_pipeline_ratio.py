"""``input_pipeline_ratio``: train step time fed by ``trainer.data``'s pipeline / by the same batches in memory.

Runs ``bench/in_image/input_pipeline.py`` in the trainer image (its docstring says what A and B are):
the ``cnn`` on the synthetic 64x64 RGB images, CPU, process CPU time beside wall time.
"""

from typing import Any

from harness import LOGS, Context, Figure, ratio_stats


def measure(ctx: Context) -> dict[str, Any]:
    result = ctx.in_image("input_pipeline.py", ["--pairs", str(ctx.pairs), "--epochs", "2"],
                          logfile=LOGS / "input_pipeline_ratio.log", timeout=900, mount_root=ctx.images_root())
    stats = ratio_stats(result["a"], result["b"], result["a_cpu"], result["b_cpu"])
    stats["info"] = (f"{1000 * stats['a_median_s']:.0f} vs {1000 * stats['b_median_s']:.0f} ms per step (batch "
                     f"{result['batch_size']}, {result['steps_per_loop']} steps per compiled call)")
    return stats


FIGURE = Figure("input_pipeline_ratio", 1.10, "train step time fed by trainer.data's TFRecord pipeline / by "
                "in-memory tensors (cnn, 64x64, CPU)", measure, seconds=180)
