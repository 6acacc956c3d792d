"""Instructions executed to parse ``dags/tfpipe_digits.py`` against the hand-written DAG file.

    .venv/bin/python bench/parse_callgrind.py [--after-docker | --in-dag-processor] [--keep DIR]

Wall and CPU time of a 0.1 s parse swing by 20% and more on a shared 2-core machine; the number of
instructions executed does not. Each side runs once under valgrind's callgrind, in a fresh
interpreter with ``PYTHONHASHSEED=0`` and byte-compiled modules, exactly as ``dag_parse_ratio``'s
probe does: ``import airflow`` and ``from airflow.sdk import DAG`` first (not counted), then
``runpy.run_path(file)`` (counted: the file's imports, the Docker provider's included, and building
its DAG). The counted region is marked by two calls into CPython that nothing on the parse path
makes (``os.sched_get_priority_min``/``max``): callgrind zeroes its counters on entering the first
and dumps them on entering the second. ``--after-docker`` also imports the Docker provider before
the region, leaving the DAG file's own cost (tfpipe's modules and the DAG build against the DAG
build by hand). ``--in-dag-processor`` counts the parse as Airflow's DAG processor makes it: its
module loaded and the ``airflow.*`` modules the file names imported before the region, as its
manager does before it forks the parsing process (``parsing_pre_import_modules``). Prints one JSON
line: instructions per side (``a_ir``, ``b_ir``) and ``ratio`` = A/B.
Needs ``valgrind`` (Debian package ``valgrind``); takes about a minute per side.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TFPIPE_DAG = REPO / "dags" / "tfpipe_digits.py"
HANDWRITTEN_DAG = REPO / "bench" / "dags" / "handwritten_digits.py"

PROBE = r"""
import os, runpy, sys
import airflow
from airflow.sdk import DAG
if sys.argv[2] == "after-docker":
    import airflow.providers.docker.operators.docker
elif sys.argv[2] == "dag-processor":
    import importlib
    import airflow.dag_processing.processor
    from airflow.utils.file import iter_airflow_imports
    for module in iter_airflow_imports(sys.argv[1]):
        importlib.import_module(module)
os.sched_get_priority_min(os.SCHED_OTHER)  # callgrind: --zero-before (the region starts)
runpy.run_path(sys.argv[1], run_name="bench_dag_file")
os.sched_get_priority_max(os.SCHED_OTHER)  # callgrind: --dump-before (the region ends)
"""
START, END = "os_sched_get_priority_min", "os_sched_get_priority_max"


def instructions(dag_file: Path, mode: str, outdir: Path, env: dict[str, str]) -> int:
    """Instructions (callgrind's ``Ir``) executed between the probe's two markers for ``dag_file``."""
    out = outdir / f"callgrind.{dag_file.stem}.{mode}"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", f"--zero-before={START}",
           f"--dump-before={END}", sys.executable, "-c", PROBE, str(dag_file), mode]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(REPO), timeout=1800)
    if proc.returncode:
        raise SystemExit(f"callgrind of {dag_file} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    dumps = sorted(outdir.glob(f"{out.name}.*"))  # .1 = the dump at the end marker; the file = exit
    if len(dumps) != 1:
        raise SystemExit(f"expected one dump at the end marker for {dag_file}, found {len(dumps)}: "
                         "something on the parse path calls a marker function; pick others")
    for line in dumps[0].read_text().splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no instruction total in {dumps[0]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--after-docker", action="store_true",
                        help="import the Docker provider before the counted region (the DAG file's own cost)")
    parser.add_argument("--in-dag-processor", action="store_true",
                        help="pre-import as Airflow's DAG processor does before the counted region")
    parser.add_argument("--keep", type=Path, help="keep the callgrind output files in this directory "
                        "(for callgrind_annotate)")
    args = parser.parse_args(argv)
    if not shutil.which("valgrind"):
        raise SystemExit("valgrind not found. Fix: apt-get install valgrind")
    if args.after_docker and args.in_dag_processor:
        parser.error("--after-docker and --in-dag-processor count different regions: choose one")
    mode = "after-docker" if args.after_docker else "dag-processor" if args.in_dag_processor else "file"
    tmp = Path(tempfile.mkdtemp(prefix="tfpipe-callgrind-"))
    outdir = args.keep or tmp
    outdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "TFPIPE_HOME": str(tmp / "home")}
    env.setdefault("AIRFLOW_HOME", str(REPO / ".airflow"))
    try:
        # Byte-compiled, as pip installs a provider, so neither side counts compilation.
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "provider")],
                       check=True, env={k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"})
        a = instructions(TFPIPE_DAG, mode, outdir, env)
        b = instructions(HANDWRITTEN_DAG, mode, outdir, env)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"region": mode, "a_file": str(TFPIPE_DAG.relative_to(REPO)),
                      "b_file": str(HANDWRITTEN_DAG.relative_to(REPO)), "a_ir": a, "b_ir": b,
                      "ratio": round(a / b, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
