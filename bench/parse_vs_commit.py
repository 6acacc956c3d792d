"""CPU time to parse ``dags/tfpipe_digits.py`` at an earlier commit against the working tree.

    .venv/bin/python bench/parse_vs_commit.py REV [--pairs N]

Each sample is a fresh interpreter that imports Airflow (untimed, as a DAG processor has it) and then
runs the DAG file, timing its process CPU time; the two sides alternate (A, B, A, B, ...). The earlier
commit's DAG file runs with that commit's ``provider/`` first on ``PYTHONPATH``, in this venv. The
commit is checked out into a temporary git worktree, removed at the end. It answers "did this change
make parsing worse?", which ``dag_parse_ratio`` (against a hand-written DAG) does not.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DAG = Path("dags") / "tfpipe_digits.py"
PROBE = r"""
import json, runpy, sys, time
import airflow, airflow.sdk
from airflow.sdk import DAG
started = time.process_time()
runpy.run_path(sys.argv[1], run_name="probe")
print(json.dumps({"cpu_s": time.process_time() - started}))
"""


def parse_cpu_s(provider: Path, dag_file: Path, home: Path) -> float:
    """CPU seconds one fresh interpreter spends running ``dag_file`` with ``provider`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(provider), "TFPIPE_HOME": str(home)}
    env.setdefault("AIRFLOW_HOME", str(REPO / ".airflow"))
    proc = subprocess.run([sys.executable, "-c", PROBE, str(dag_file)], capture_output=True, text=True,
                          env=env, cwd=str(provider.parent), timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        raise SystemExit(f"parsing {dag_file} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])["cpu_s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rev", help="the earlier commit, e.g. a tag or a hash")
    parser.add_argument("--pairs", type=int, default=10)
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="tfpipe-parse-"))
    old = tmp / "old"
    try:
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(old), args.rev], check=True)
        home = tmp / "home"
        (home / "data" / "digits").mkdir(parents=True)
        csv = REPO / ".demo" / "data" / "digits" / "digits.csv"
        if csv.exists():
            shutil.copy(csv, home / "data" / "digits" / "digits.csv")
        before, after = [], []
        for _ in range(args.pairs):
            before.append(parse_cpu_s(old / "provider", old / DAG, home))
            after.append(parse_cpu_s(REPO / "provider", REPO / DAG, home))
        ratios = [a / b for a, b in zip(after, before)]
        print(json.dumps({"rev": args.rev, "pairs": args.pairs,
                          "cpu_ms_before_median": round(statistics.median(before) * 1000, 1),
                          "cpu_ms_after_median": round(statistics.median(after) * 1000, 1),
                          "ratio": round(statistics.median(ratios), 3), "min": round(min(ratios), 3),
                          "max": round(max(ratios), 3)}))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
