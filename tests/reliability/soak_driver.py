"""Drive N pipeline runs back to back in ONE interpreter, the data changing before each run.

    python tests/reliability/soak_driver.py DAG_ID RUNS HOME DAGS_FOLDER

Each run is a full Airflow run through ``tfpipe.cli.run.run`` (``dag.test``: real task runner,
metadata DB, every stage a real container, the cleanup task included). Running them in one
process saves the interpreter start, Airflow imports and DAG parsing of a fresh ``tfpipe run``
per night (about 6 s each), which the 30-run soak test could not afford on two cores; nothing of
the pipeline itself is skipped. Before each run the data set is regenerated with a new seed (a
different sample of the digits, same size): a new fingerprint every night, as from a data feed.

Prints one JSON line per run: state, bytes of work and models, the kept model versions before
and after, and the baseline the blessing gate compared against.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

ROWS = 300


def write_data(home: Path, seed: int, source: list[str]) -> None:
    """A fresh sample of ROWS digits (header kept), written atomically."""
    header, rows = source[0], source[1:]
    sample = random.Random(seed).sample(rows, ROWS)
    target = home / "data" / "digits" / "digits.csv"
    tmp = target.with_suffix(".tmp")
    tmp.write_text("\n".join([header, *sample]) + "\n")
    os.replace(tmp, target)


def disk_bytes(path: Path) -> int:
    """Bytes on disk of a tree (allocated blocks, hard links once), as ``du`` counts them."""
    seen, total = set(), 0
    for root, dirs, files in os.walk(path):
        for name in [*dirs, *files]:
            info = os.lstat(os.path.join(root, name))
            if (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                total += info.st_blocks * 512
    return total


def versions(models: Path) -> list[int]:
    return sorted(int(p.name) for p in models.iterdir() if p.name.isdigit()) if models.is_dir() else []


def main(dag_id: str, runs: int, home: Path, dags_folder: str) -> int:
    from tfpipe import contract
    from tfpipe.cli.run import run as run_dag

    source = (home / "data" / "digits" / "digits.csv").read_text().splitlines()
    models = home / "models" / dag_id
    for night in range(1, runs + 1):
        write_data(home, night, source)
        before = versions(models)
        started = time.monotonic()
        summary = run_dag(dag_id, None, dags_folder)
        run_dir = home / "work" / "runs" / contract.safe_name(dag_id) / contract.safe_name(summary["run_id"], 120)
        blessing_file = run_dir / "blessing.json"
        blessing = json.loads(blessing_file.read_text()) if blessing_file.exists() else None
        print(json.dumps({
            "run": night, "state": summary["state"], "tasks": summary["tasks"],
            "seconds": round(time.monotonic() - started, 1),
            "work_bytes": disk_bytes(home / "work"), "models_bytes": disk_bytes(home / "models"),
            "versions_before": before, "versions_after": versions(models),
            "baseline": (blessing or {}).get("baseline"), "blessed": (blessing or {}).get("blessed"),
            "run_dirs": len([p for p in run_dir.parent.iterdir() if not p.name.startswith(".")]),
            "datasets": len([p for p in (home / "work" / "datasets").iterdir() if not p.name.startswith(".")]),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]))
