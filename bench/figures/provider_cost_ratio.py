"""``provider_cost_ratio``: a ``tfpipe_digits`` run / the same five containers as hand-written ``DockerOperator``\\ s.

Both sides are one ``tfpipe run DAG_ID --dags-folder DIR`` process (``dag.test``: the same task
runner, execution API and metadata DB), each folder holding only its own DAG file, on a fresh
``TFPIPE_HOME`` with a copy of the digits CSV whose volume directories were made for uid 1000
beforehand, untimed, as a user of hand-written non-root containers must. B is
``bench/dags/plain_docker_digits.py``: the same image, stage configs, mounts and user. A has
tfpipe's whole task (engine ping, leftover removal, directory checks, result parsing, lineage,
metrics, the ``cleanup`` teardown). One untimed run of each side first. CPU time is the machine's.
"""

import json
import os
import shutil
from typing import Any

from harness import BENCH, LOGS, REPO, Context, Figure, fresh_home, interleave, make_dirs, ratio_stats, timed, \
    tfpipe_run

#: A short run, so the provider's per-task cost is a visible share of it; the threshold lets it be
#: blessed, so export runs on both sides.
CONF = {"epochs": 2, "batch_size": 100, "threshold": 0.5}
SIDES = {"a": (REPO / "dags" / "tfpipe_digits.py", "tfpipe_digits", "digits"),
         "b": (BENCH / "dags" / "plain_docker_digits.py", "bench_plain_docker_digits", "digits_plain")}


def measure(ctx: Context) -> dict[str, Any]:
    logfile = LOGS / "provider_cost_ratio.log"
    parent = ctx.tmp / "provider-cost"
    for side, (source, _, _) in SIDES.items():  # one DAG file per folder: each side parses only its own
        (parent / f"dags-{side}").mkdir(parents=True)
        shutil.copy(source, parent / f"dags-{side}" / source.name)

    def one(side: str, i: int) -> tuple[float, float]:
        _, dag_id, model = SIDES[side]
        home = fresh_home(parent, f"{side}-{i}")
        work, models = home / "work", home / "models"
        make_dirs(work, work / "cache", work / "cache" / "cuda", work / "datasets", work / "runs", work / "runs" / dag_id,
                  models, models / model)
        env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(parent / f"dags-{side}"), "TFPIPE_HOME": str(home),
               "TFPIPE_IMAGE": ctx.image, "AIRFLOW_VAR_TFPIPE_IMAGE": ctx.image,
               "TFPIPE_BENCH_CONF": json.dumps(CONF), "TFPIPE_BENCH_USER": "1000:1000", "PYTHONUNBUFFERED": "1"}
        conf = CONF if side == "a" else {}  # B's stage configs carry the conf already (parse time)
        sample = timed(lambda: tfpipe_run(dag_id, env, logfile, ("--dags-folder", str(parent / f"dags-{side}"),
                                                                  "--conf", json.dumps(conf))))
        shutil.rmtree(home, ignore_errors=True)
        return sample

    one("a", -1), one("b", -1)  # untimed: first-run costs of the DB, the image and the page cache
    stats = ratio_stats(*interleave(ctx, "provider_cost_ratio", lambda i: one("a", i), lambda i: one("b", i)))
    stats["info"] = f"A-B = {stats['a_median_s'] - stats['b_median_s']:.1f} s per run; CPU = the machine's busy CPU time"
    return stats


FIGURE = Figure("provider_cost_ratio", 1.05, "tfpipe run tfpipe_digits / the same 5 containers as hand-written "
                "DockerOperators (same CLI, dag.test)", measure, seconds=360)
