"""``sweep_overhead_ratio``: a 4-trial sweep / the same 4 trainings as plain train tasks, back to back.

Target 1.10: what mapping the trials costs. A is ``tfpipe run`` of a sweep DAG (``tuning.parallel`` 1;
``tfpipe run`` runs one task at a time anyway): prep, validate, ``train`` mapped over 4 trials, select,
evaluate, export. B is the same DAG written without mapping: the 4 trials as 4 plain ``TrainOperator``
tasks chained one after another, then the same select, evaluate and export. Each sample has a fresh
``TFPIPE_HOME`` holding the digits CSV. (The alternative without sweeps, one whole run per setting,
repeats prep, validate, evaluate, export and Airflow's start four times, so it is slower still.)
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
from dataclasses import replace
import airflow.providers.tfpipe  # noqa: F401
from airflow.sdk import DAG, chain
from tfpipe import PipelineConfig, training_pipeline
from tfpipe.dag_factory import operator_from_spec
from tfpipe.operators.docker import TrainOperator
from tfpipe.specs import plan_pipeline
HOME = os.environ["TFPIPE_HOME"]
cfg = PipelineConfig.from_dict({{"dag_id": {dag_id!r}, **{config!r},
    "volumes": {{"data": f"{{HOME}}/data", "work": f"{{HOME}}/work", "models": f"{{HOME}}/models"}}}})
if {mapped!r}:
    dag = training_pipeline(cfg)
else:  # the trials as plain tasks: the same specs, one TrainOperator per trial
    specs = {{spec.stage: spec for spec in plan_pipeline(cfg)}}
    with DAG(cfg.dag_id, schedule=None) as dag:
        stages = [operator_from_spec(specs[stage], cfg) for stage in ("prep", "validate", "select", "evaluate", "export")]
        trains = [TrainOperator(task_id=f"train_{{t['index']}}", spec=replace(specs["train"], task_id=f"train_{{t['index']}}"),
                                trial=t, docker_url=cfg.docker_url) for t in cfg.tuning.trial_plan()]
        chain(*stages[:2], *trains, *stages[2:])
'''


def measure(ctx: Context) -> dict[str, Any]:
    logfile = LOGS / "sweep_overhead_ratio.log"
    dags = ctx.tmp / "sweep-dags"
    dags.mkdir()
    for dag_id, mapped in (("bench_sweep", True), ("bench_sweep_plain", False)):
        (dags / f"{dag_id}.py").write_text(DAG.format(dag_id=dag_id, config=CONFIG, mapped=mapped))

    def side(dag_id: str):
        def run(i: int) -> tuple[float, float]:
            home = fresh_home(ctx.tmp, f"{dag_id}-{i}")
            env = {**os.environ, "TFPIPE_HOME": str(home), "AIRFLOW_VAR_TFPIPE_IMAGE": ctx.image,
                   "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "PYTHONUNBUFFERED": "1"}
            sample = timed(lambda: tfpipe_run(dag_id, env, logfile, ("--dags-folder", str(dags))))
            shutil.rmtree(home, ignore_errors=True)
            return sample
        return run

    stats = ratio_stats(*interleave(ctx, "sweep_overhead_ratio", side("bench_sweep"), side("bench_sweep_plain")))
    stats["info"] = f"A {stats['a_median_s']:.0f} s mapped, B {stats['b_median_s']:.0f} s as plain train tasks"
    return stats


FIGURE = Figure("sweep_overhead_ratio", 1.10, "a 4-trial sweep (mapped train) / the same 4 trainings as plain "
                "train tasks back to back, each through tfpipe run", measure, seconds=400)
