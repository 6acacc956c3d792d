"""``dag_parse_ratio``: the exec time of ``dags/tfpipe_digits.py`` / the same DAG written by hand.

B is ``bench/dags/handwritten_digits.py``, which a test keeps the same DAG.
Each sample is a fresh interpreter that imports ``airflow`` and ``airflow.sdk.DAG`` untimed (every
DAG processor has them) and then times ``runpy.run_path(file)``: the file's own imports (the Docker
provider on both sides, tfpipe's modules on A's) and its DAG build, wall and process CPU time. tfpipe
is byte-compiled first, as pip compiles an installed provider. A pair is one sample of each file, in
alternating order.
"""

import json
import os
import sys
from typing import Any

from harness import BENCH, LOGS, REPO, Context, Figure, interleave, ratio_stats, run_logged

A_FILE = REPO / "dags" / "tfpipe_digits.py"
B_FILE = BENCH / "dags" / "handwritten_digits.py"
PROBE = r'''
import json, runpy, sys, time
import airflow
from airflow.sdk import DAG
cpu, started = time.process_time(), time.perf_counter()
runpy.run_path(sys.argv[1], run_name="bench_dag_file")
print(json.dumps([time.perf_counter() - started, time.process_time() - cpu]))
'''


def measure(ctx: Context) -> dict[str, Any]:
    logfile = LOGS / "dag_parse_ratio.log"
    env = {**os.environ, "TFPIPE_HOME": str(ctx.tmp / "parse-home")}
    run_logged([sys.executable, "-m", "compileall", "-q", str(REPO / "provider")], logfile, timeout=300, env=env)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the tree stays as it is

    def parse(path):
        out = run_logged([sys.executable, "-c", PROBE, str(path)], logfile, timeout=120, env=env)
        return tuple(json.loads(out.strip().splitlines()[-1]))

    parse(A_FILE), parse(B_FILE)  # untimed: the page cache
    stats = ratio_stats(*interleave(ctx, "dag_parse_ratio", lambda i: parse(A_FILE), lambda i: parse(B_FILE)))
    stats["info"] = (f"{A_FILE.name} {1000 * stats['a_median_s']:.0f} ms ({1000 * stats['a_cpu_median_s']:.0f} ms CPU) "
                     f"against {1000 * stats['b_median_s']:.0f} ms ({1000 * stats['b_cpu_median_s']:.0f} ms CPU) by hand")
    return stats


FIGURE = Figure("dag_parse_ratio", 1.05, "exec time of dags/tfpipe_digits.py / the same DAG written by hand "
                "(bench/dags/handwritten_digits.py), fresh interpreters", measure, seconds=90)
