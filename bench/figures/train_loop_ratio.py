"""``train_loop_ratio``: the train stage's ``Loop.fit`` / Keras ``model.fit`` with ``steps_per_execution`` tuned.

Runs ``bench/in_image/train_loop.py`` in the trainer image for two models: the ``mlp`` on the digits
CSV (30 epochs, batch 32) and the ``cnn`` on the synthetic 64x64 RGB images (3 epochs, batch 32),
both with per-epoch validation, checkpoints every 20 steps and at every epoch end, and per-epoch
TensorBoard scalars. The target is process CPU time, for each model: the headline is the model
with the higher CPU ratio; each model's own figures are under ``models``.
"""

from typing import Any

from harness import LOGS, Context, Figure, fresh_home, make_dirs, ratio_stats

#: (model, epochs, the steps_per_execution values B is tuned over: each divides the checkpoint
#: interval of 20 steps, so B saves on the same steps as A)
WORKLOADS = (("mlp", 30, "1,5,10,20"), ("cnn", 3, "1,10,20"))


def measure(ctx: Context) -> dict[str, Any]:
    digits = fresh_home(ctx.tmp, "train-loop-digits")
    make_dirs(digits)  # the container's user writes work/ there
    models: dict[str, dict[str, Any]] = {}
    for model, epochs, spe in WORKLOADS:
        result = ctx.in_image("train_loop.py", ["--model", model, "--pairs", str(ctx.pairs), "--epochs", str(epochs),
                                                "--spe", spe], logfile=LOGS / "train_loop_ratio.log", timeout=1800,
                              mount_root=digits if model == "mlp" else ctx.images_root())
        stats = ratio_stats(result["a"], result["b"], result["a_cpu"], result["b_cpu"])
        stats.update(steps=result["steps"], steps_per_execution=result["steps_per_execution"],
                     val_accuracy_a=result["val_accuracy_a"], val_accuracy_b=result["val_accuracy_b"])
        models[model] = stats
    worst = max(models, key=lambda m: models[m]["cpu_ratio"])
    stats = dict(models[worst], headline_model=worst, models=models)
    stats["info"] = "; ".join(f"{m}: CPU {s['cpu_ratio']} ({s['cpu_min']}-{s['cpu_max']}), wall {s['ratio']}, "
                              f"{s['steps']} steps, fit's best steps_per_execution {s['steps_per_execution']}"
                              for m, s in models.items())
    return stats


FIGURE = Figure("train_loop_ratio", 1.00, "the train stage's Loop.fit / Keras model.fit with steps_per_execution "
                "tuned (mlp on digits, cnn on 64x64 images), CPU time", measure, seconds=300, judged_on="cpu_ratio")
