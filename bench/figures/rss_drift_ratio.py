"""``rss_drift_ratio``: the train container's peak RSS in its last (30th) epoch / in epoch 2, with jemalloc.

The train stage records its own peak RSS per epoch (``rss_peak_mb`` in ``metrics.json``: VmHWM, reset
at each epoch start). Two real train stage containers run side by side, so the machine's load hits
both: the default (jemalloc) and, for contrast, ``resources.jemalloc: false`` (glibc malloc), the
``cnn`` on the synthetic 64x64 RGB images, batch 64, checkpoints at epoch ends. One run of each: a
drift is a trend over epochs within the run, not a difference between two runs.
"""

import json
import subprocess
from typing import Any

from harness import LOGS, BenchError, Context, Figure

EPOCHS = 30


def measure(ctx: Context) -> dict[str, Any]:
    running = {}
    for label, jemalloc in (("jemalloc", True), ("glibc", False)):
        spec = ctx.image_train_spec("bench_rss", {"model": "cnn", "epochs": EPOCHS, "batch_size": 64,
                                                  "checkpoint_every_steps": 10000, "keep_checkpoints": 1},
                                    resources={"jemalloc": jemalloc})
        plan, run_dir = ctx.train_try(spec, "bench_rss", f"bench__rss_{label}_{ctx.session}")
        logfile = open(LOGS / f"rss_drift_ratio.{label}.log", "w")
        running[label] = (subprocess.Popen(ctx.stage_run(f"rss-{label}", spec, plan.config), stdout=logfile,
                                           stderr=subprocess.STDOUT), run_dir, logfile)
    curves: dict[str, list[float]] = {}
    for label, (proc, run_dir, logfile) in running.items():
        code = proc.wait(timeout=1800)
        logfile.close()
        if code != 0:
            raise BenchError(f"the {label} train container exited {code} (see {logfile.name})")
        curves[label] = [epoch.get("rss_peak_mb") for epoch in json.loads((run_dir / "metrics.json").read_text())]
        if len(curves[label]) != EPOCHS or not all(curves[label]):
            raise BenchError(f"{run_dir}/metrics.json has no rss_peak_mb for each of {EPOCHS} epochs")
    drift = {label: round(curve[-1] / curve[1], 4) for label, curve in curves.items()}
    return {"ratio": drift["jemalloc"], "min": drift["jemalloc"], "max": drift["jemalloc"], "pairs": 1,
            "without_jemalloc_ratio": drift["glibc"], "rss_mb_per_epoch": curves,
            "info": f"peak RSS last epoch / epoch 2: {drift['jemalloc']} with jemalloc ({curves['jemalloc'][1]:.0f} -> "
                    f"{curves['jemalloc'][-1]:.0f} MiB), {drift['glibc']} with glibc malloc ({curves['glibc'][1]:.0f} -> "
                    f"{curves['glibc'][-1]:.0f} MiB)"}


FIGURE = Figure("rss_drift_ratio", 1.05, "train container peak RSS at the last of 30 epochs / at epoch 2, with "
                "jemalloc (glibc malloc beside it)", measure, seconds=300)
