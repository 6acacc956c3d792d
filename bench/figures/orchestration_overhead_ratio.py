"""``orchestration_overhead_ratio``: ``tfpipe run tfpipe_digits`` / its five stage containers by plain ``docker run``.

Information, no target: Airflow's own cost (``provider_cost_ratio`` measures tfpipe's). Each sample
gets a fresh ``TFPIPE_HOME`` holding a copy of the digits CSV, so prep does real work on both sides.
A is the whole ``tfpipe run`` process. B parses ``dags/tfpipe_digits.py`` itself, resolves each stage
operator's spec into a try (:func:`tfpipe.tries.resolve_try`, with the bench's image: the DAG's image
is the Airflow Variable, read at run time), makes the directories it writes (untimed) and runs the
stages back to back with ``docker run`` and the operator's mounts, user, shm, network and
environment, skipping export when evaluate does not bless, as Airflow does.
"""

import os
import runpy
import shutil
import subprocess
from typing import Any
from unittest import mock

from harness import LOGS, REPO, BenchError, Context, Figure, fresh_home, host_path, interleave, make_dirs, \
    ratio_stats, timed, tfpipe_run

DAG_ID = "tfpipe_digits"
STAGES = ("prep", "validate", "train", "evaluate", "export")


def measure(ctx: Context) -> dict[str, Any]:
    from tfpipe import contract
    from tfpipe.tries import TryIdentity, resolve_try

    logfile = LOGS / "orchestration_overhead_ratio.log"
    parent = ctx.tmp / "orchestration"
    parent.mkdir()

    def airflow_run(i: int) -> tuple[float, float]:
        home = fresh_home(parent, f"airflow-{i}")
        env = {**os.environ, "TFPIPE_HOME": str(home), "TFPIPE_IMAGE": ctx.image, "AIRFLOW_VAR_TFPIPE_IMAGE": ctx.image,
               "PYTHONUNBUFFERED": "1"}
        sample = timed(lambda: tfpipe_run(DAG_ID, env, logfile))
        shutil.rmtree(home, ignore_errors=True)
        return sample

    def plain_run(i: int) -> tuple[float, float]:
        home = fresh_home(parent, f"plain-{i}")
        with mock.patch.dict(os.environ, TFPIPE_HOME=str(home)):  # read by the DAG file
            dag = runpy.run_path(str(REPO / "dags" / f"{DAG_ID}.py"), run_name="bench_dag")["dag"]
        specs = sorted((t.spec for t in dag.tasks if getattr(t, "spec", None) is not None),
                       key=lambda spec: STAGES.index(spec.stage))
        commands = []
        for spec in specs:  # configs and directories first: outside the timed span
            plan = resolve_try(spec, TryIdentity(DAG_ID, f"bench__plain_{ctx.session}_{i}", spec.task_id), image=ctx.image)
            make_dirs(*(host_path(spec, d) for d in plan.writable_dirs))
            commands.append((spec.stage, ctx.stage_run(f"plain-{spec.stage}", spec, plan.config)))

        def run() -> None:
            for stage, cmd in commands:
                with open(logfile, "a") as handle:
                    handle.write(f"\n$ docker run ... {stage} (TFPIPE_HOME={home})\n")
                    handle.flush()
                    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=handle, text=True, timeout=600)
                    handle.write(proc.stdout)
                if stage == "evaluate" and proc.returncode == contract.ExitCode.NOT_BLESSED:
                    return  # as Airflow does: export is skipped
                if proc.returncode != 0 or contract.parse_result_line(proc.stdout.splitlines()) is None:
                    raise BenchError(f"plain docker run of {stage} exited {proc.returncode} (see {logfile})")

        sample = timed(run)
        shutil.rmtree(home, ignore_errors=True)
        return sample

    stats = ratio_stats(*interleave(ctx, "orchestration_overhead_ratio", airflow_run, plain_run))
    stats["info"] = (f"A-B = {stats['a_median_s'] - stats['b_median_s']:.1f} s per run: Airflow's start, DAG parse, "
                     "task runner, execution API and metadata DB, and tfpipe's per-task work; CPU = the machine's")
    return stats


FIGURE = Figure("orchestration_overhead_ratio", None, "tfpipe run tfpipe_digits through Airflow / the 5 stage "
                "containers by plain docker run (information)", measure, seconds=300)
