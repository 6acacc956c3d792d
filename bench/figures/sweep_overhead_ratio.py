"""``sweep_overhead_ratio``: a 4-trial sweep in one run / the same 4 trainings as 4 runs of plain DAGs.

Target 1.10. A is ``tfpipe run`` of a sweep DAG (``tuning.parallel`` 1; ``tfpipe run`` runs one task at
a time anyway): prep, validate, 4 mapped trials, select, evaluate, export. B is what a user without
sweeps does: one plain DAG per trial, its training section that trial's settings, run one after
another. Each sample has a fresh ``TFPIPE_HOME`` with the digits CSV, so both sides prep once (B's
later runs hit the prep cache, as a user's would).
"""

import os
import shutil
from typing import Any

from harness import LOGS, Context, Figure, fresh_home, interleave, ratio_stats, timed, tfpipe_run

CONFIG = {
    "image": {"ref": None},
    "data": {"path": "digits/digits.csv"},
    "training": {"model": "mlp", "epochs": 4, "batch_size": 32},
    "evaluation": {"threshold": 0.5, "tolerance": 1.0},
    "tuning": {"space": {"learning_rate": {"low": 0.0003, "high": 0.01, "log": True},
                         "model_kwargs.hidden_units": [[32], [64, 32]]}, "trials": 4, "parallel": 1, "seed": 2},
}
DAG = '''import os
import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline
HOME = os.environ["TFPIPE_HOME"]
dag = training_pipeline(PipelineConfig.from_dict({{"dag_id": {dag_id!r}, **{config!r},
    "volumes": {{"data": f"{{HOME}}/data", "work": f"{{HOME}}/work", "models": f"{{HOME}}/models"}}}}))
'''


def measure(ctx: Context) -> dict[str, Any]:
    from tfpipe.config import PipelineConfig, trial_training

    logfile = LOGS / "sweep_overhead_ratio.log"
    dags = ctx.tmp / "sweep-dags"
    dags.mkdir()
    (dags / "bench_sweep.py").write_text(DAG.format(dag_id="bench_sweep", config=CONFIG))
    volumes = {"data": "/d", "work": "/w", "models": "/m"}
    plan = PipelineConfig.from_dict({**CONFIG, "dag_id": "x", "volumes": volumes}).tuning.trial_plan()
    plain = [f"bench_trial_{t['index']}" for t in plan]
    for dag_id, trial in zip(plain, plan):
        config = {**CONFIG, "tuning": None, "training": trial_training(CONFIG["training"], trial["params"])}
        (dags / f"{dag_id}.py").write_text(DAG.format(dag_id=dag_id, config=config))

    def side(dag_ids: list[str]):
        def run(i: int) -> tuple[float, float]:
            home = fresh_home(ctx.tmp, f"sweep-{dag_ids[0]}-{i}")
            env = {**os.environ, "TFPIPE_HOME": str(home), "AIRFLOW_VAR_TFPIPE_IMAGE": ctx.image,
                   "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "PYTHONUNBUFFERED": "1"}
            sample = timed(lambda: [tfpipe_run(d, env, logfile, ("--dags-folder", str(dags))) for d in dag_ids])
            shutil.rmtree(home, ignore_errors=True)
            return sample
        return run

    stats = ratio_stats(*interleave(ctx, "sweep_overhead_ratio", side(["bench_sweep"]), side(plain)))
    stats["info"] = f"A {stats['a_median_s']:.0f} s for the sweep, B {stats['b_median_s']:.0f} s for 4 plain runs"
    return stats


FIGURE = Figure("sweep_overhead_ratio", 1.10, "a 4-trial sweep in one tfpipe run / the 4 trainings as 4 runs of "
                "plain DAGs", measure, seconds=1300)
