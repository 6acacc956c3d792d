"""train_loop_ratio: tfpipe's training loop against Keras ``model.fit`` with ``steps_per_execution`` tuned.

Runs ``bench/in_image/train_loop.py`` in the trainer image twice: the ``mlp`` on the digits CSV
(30 epochs, batch 32) and the ``cnn`` on the bench's synthetic 64x64 RGB images (3 epochs, batch
32); both with per-epoch validation and a checkpoint every 20 steps and at every epoch end. The
headline is the model with the higher CPU-time ratio (the target holds for both); each model's
own figures are under ``models``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

#: (model, epochs, steps_per_execution values B is tuned over: each divides the checkpoint interval
#: of 20 steps, so that B saves on the same steps as A)
WORKLOADS = (("mlp", 30, "1,5,10,20"), ("cnn", 3, "1,10,20"))


def _bench():
    """bench/run.py's helpers: the running script (``python bench/run.py`` runs it as __main__)."""
    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, "ratio_stats") and hasattr(main, "Context"):
        return main
    import run  # imported from elsewhere (e.g. a test): bench/ is on sys.path then

    return run


def train_loop(ctx: Any) -> dict[str, Any]:
    """The figure: medians of per-pair A/B (wall and process CPU time) for each workload."""
    bench = _bench()
    digits = bench.fresh_home(ctx.tmp, "train-loop-digits")
    bench.chown_tree(digits)
    os.chmod(digits, 0o777)
    per_model: dict[str, dict[str, Any]] = {}
    for model, epochs, spe in WORKLOADS:
        root = digits if model == "mlp" else ctx.images_root()
        result = ctx.in_image("train_loop.py", ["--model", model, "--pairs", str(ctx.pairs), "--epochs", str(epochs),
                                                "--spe", spe],
                              logfile=bench.LOGS / "train_loop_ratio.log", timeout=1800, mount_root=root)
        stats = bench.ratio_stats(result["a"], result["b"], result["a_cpu"], result["b_cpu"])
        stats.update({key: result[key] for key in ("epochs", "batch_size", "steps", "steps_per_epoch",
                                                   "checkpoint_every_steps", "steps_per_execution", "saves_per_run",
                                                   "tuning_cpu_s", "val_accuracy_a", "val_accuracy_b")})
        stats["steps_per_s_a"] = round(result["steps"] / stats["a_median_s"], 1)
        stats["steps_per_s_b"] = round(result["steps"] / stats["b_median_s"], 1)
        per_model[model] = stats
        bench.log(f"train_loop_ratio {model}: wall {stats['ratio']}, CPU {stats.get('cpu_ratio')}")
    worst = max(per_model, key=lambda m: per_model[m].get("cpu_ratio", per_model[m]["ratio"]))
    stats = dict(per_model[worst], headline_model=worst, models=per_model)
    stats["info"] = stats["why"] = "; ".join(
        f"{m}: {s['steps_per_s_a']} vs {s['steps_per_s_b']} steps/s (wall {s['ratio']}, "
        f"{s['min']}-{s['max']}), CPU {s['a_cpu_median_s']} vs {s['b_cpu_median_s']} s (ratio {s['cpu_ratio']}), "
        f"{s['steps']} steps, fit's best steps_per_execution {s['steps_per_execution']}"
        for m, s in per_model.items())
    return stats
