"""Retention of the work volume: which run and data set directories to keep, and removing the rest.

A nightly pipeline adds a run directory (checkpoints, TensorBoard events, reports) every night and a
data set directory every time the data changes; nothing else ever removes them. This program runs
at the end of every DAG run, in a short helper container of the trainer image that mounts the work
volume read-write and the models volume read-only (the Airflow worker never opens a volume itself),
and applies these rules for one DAG:

- **run dirs** ``<work>/runs/<dag>/<run>/`` are kept when the run is among the ``keep_runs`` most
  recently active, produced a model version still kept under ``<models>/<model_name>/``, is the
  current run, is active or retryable according to Airflow's metadata DB (the provider passes
  those run ids as ``protect_run_ids``), or was written to within ``min_idle_seconds`` (the last
  line of defence when the metadata DB does not know the run). TensorBoard event files live in the
  run dir and go with it.
- **data set dirs** ``<work>/datasets/<fingerprint>/`` are kept when a run dir still kept (of any
  DAG sharing the volume) points at it in its ``dataset.json``, when it is the newest one, or when
  it was prepared or reused within ``min_idle_seconds`` (prep touches a data set it reuses).

A directory is removed by renaming it to a hidden ``.tmp-deleted-*`` name first, so no reader ever
sees it half deleted. The program logs every removal with its size and prints the usual result line
(:data:`trainer.contract.RESULT_PREFIX`) with what it removed, what it kept and why, and the bytes
freed. Standard library only: it never imports TensorFlow, so it starts in well under a second.

Usage: ``python3 -m trainer.retention`` with the request JSON in ``$TFPIPE_RETENTION`` (or
``--request FILE``); ``--result FILE`` also writes the result there; ``--dry-run`` decides and
reports without removing anything.
"""

import argparse
import json
import os
import sys
import time

from trainer import atomic, contract
from trainer.errors import BadInput

#: Environment variable that carries the retention request JSON into the helper container.
REQUEST_ENV = "TFPIPE_RETENTION"

_REQUIRED = {"dag_id": str, "run_id": str, "model_name": str, "keep_runs": int,
             "min_idle_seconds": (int, float)}


def _log(message):
    print("retention: " + message, flush=True)


def human_bytes(count):
    """``1536`` -> ``'1.5 KiB'``."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return ("%d %s" % (value, unit)) if unit == "B" else ("%.1f %s" % (value, unit))
        value /= 1024.0
    return "%.1f TiB" % value


def tree_usage(path):
    """``(bytes on disk, newest mtime)`` of a directory tree; hard links are counted once."""
    seen, total, newest = set(), 0, 0.0
    for root, dirs, files in os.walk(path):
        for name in [""] + dirs + files:
            full = os.path.join(root, name) if name else root
            try:
                info = os.lstat(full)
            except OSError:  # removed meanwhile
                continue
            newest = max(newest, info.st_mtime)
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            total += info.st_blocks * 512
    return total, newest


def check_request(request):
    """Validate the request; return it with defaults filled in. BadInput names the field."""
    if not isinstance(request, dict):
        raise BadInput("retention request: must be a JSON object, got %s" % type(request).__name__)
    for key, kind in _REQUIRED.items():
        value = request.get(key)
        if value is None or isinstance(value, bool) or not isinstance(value, kind):
            raise BadInput("retention request: %s is missing or not a %s (got %r). Fix: build the request "
                           "with the provider's retention settings" % (key, getattr(kind, "__name__", "number"),
                                                                       value))
    if request["keep_runs"] < 1:
        raise BadInput("retention request: keep_runs must be >= 1, got %r. Fix: keep at least the newest run"
                       % request["keep_runs"])
    if request["min_idle_seconds"] < 0:
        raise BadInput("retention request: min_idle_seconds must be >= 0, got %r"
                       % request["min_idle_seconds"])
    protect = request.get("protect_run_ids", [])
    if not isinstance(protect, list) or not all(isinstance(r, str) for r in protect):
        raise BadInput("retention request: protect_run_ids must be a list of run ids, got %r" % (protect,))
    filled = dict(request)
    filled.setdefault("work", contract.CONTAINER_WORK)
    filled.setdefault("models", contract.CONTAINER_MODELS)
    filled["protect_run_ids"] = list(protect)
    return filled


def _run_dir_name(run_id):
    # The same mapping the stages use for their run dir (contract.run_dir).
    return contract.safe_name(run_id, 120)


def kept_model_runs(models_root, dag_id):
    """``{run dir name: version}`` of the runs of ``dag_id`` that produced a version still kept."""
    runs = {}
    if not os.path.isdir(models_root):
        return runs
    for name in os.listdir(models_root):
        if not name.isdigit():
            continue
        try:
            meta = atomic.read_json(os.path.join(models_root, name, "metadata.json")) or {}
        except ValueError:
            meta = {}
        if meta.get("dag_id") == dag_id and isinstance(meta.get("run_id"), str):
            runs[_run_dir_name(meta["run_id"])] = int(name)
    return runs


def _dataset_of(run_dir):
    try:
        pointer = atomic.read_json(os.path.join(run_dir, "dataset.json")) or {}
    except ValueError:
        return None
    return pointer.get("fingerprint")


def _entries(parent):
    """Directories in ``parent`` that are published (not ``.tmp-*``), sorted by name."""
    if not os.path.isdir(parent):
        return []
    return sorted(n for n in os.listdir(parent)
                  if not n.startswith(atomic.TMP_PREFIX) and os.path.isdir(os.path.join(parent, n))
                  and not os.path.islink(os.path.join(parent, n)))


def plan(request, now=None):
    """Decide what to keep and what to remove; touch nothing.

    Returns ``{"runs": [...], "datasets": [...]}``, each entry ``{"name", "path", "bytes",
    "last_active", "keep": bool, "reasons": [...]}`` (``reasons`` say why it is kept, or why not).
    """
    now = time.time() if now is None else now
    work, dag_id = request["work"], request["dag_id"]
    runs_root = os.path.join(work, "runs", contract.safe_name(dag_id))
    versions = kept_model_runs(os.path.join(request["models"], request["model_name"]), dag_id)
    active = set(_run_dir_name(r) for r in request["protect_run_ids"])
    current = _run_dir_name(request["run_id"])

    runs = []
    for name in _entries(runs_root):
        path = os.path.join(runs_root, name)
        size, newest = tree_usage(path)
        runs.append({"name": name, "path": path, "bytes": size, "last_active": newest,
                     "dataset": _dataset_of(path)})
    runs.sort(key=lambda r: (r["last_active"], r["name"]), reverse=True)
    for rank, entry in enumerate(runs):
        reasons = []
        if entry["name"] == current:
            reasons.append("the current run")
        if entry["name"] in active:
            reasons.append("active or retryable in the metadata DB")
        if rank < request["keep_runs"]:
            reasons.append("among the newest %d runs" % request["keep_runs"])
        if entry["name"] in versions:
            reasons.append("produced kept model version %d" % versions[entry["name"]])
        if now - entry["last_active"] < request["min_idle_seconds"]:
            reasons.append("written to %ds ago (< min_idle_seconds %s)"
                           % (now - entry["last_active"], request["min_idle_seconds"]))
        entry["keep"] = bool(reasons)
        entry["reasons"] = reasons or ["not among the newest %d runs, no kept model version, idle %.1f h"
                                       % (request["keep_runs"], (now - entry["last_active"]) / 3600.0)]

    # Data sets are shared by every DAG on the volume: any run dir that stays pins its data set.
    pinned = {}
    all_runs = os.path.join(work, "runs")
    doomed = set(r["path"] for r in runs if not r["keep"])
    for dag_dir in _entries(all_runs):
        for name in _entries(os.path.join(all_runs, dag_dir)):
            path = os.path.join(all_runs, dag_dir, name)
            if path in doomed:
                continue
            fingerprint = _dataset_of(path)
            if fingerprint:
                pinned.setdefault(fingerprint, "%s/%s" % (dag_dir, name))
    datasets_root = os.path.join(work, "datasets")
    datasets = []
    for name in _entries(datasets_root):
        path = os.path.join(datasets_root, name)
        size, _newest = tree_usage(path)
        # The directory's own mtime: set when prep published it, refreshed when prep reuses it.
        datasets.append({"name": name, "path": path, "bytes": size,
                         "last_active": os.lstat(path).st_mtime})
    datasets.sort(key=lambda d: (d["last_active"], d["name"]), reverse=True)
    for rank, entry in enumerate(datasets):
        reasons = []
        if rank == 0:
            reasons.append("the newest data set")
        if entry["name"] in pinned:
            reasons.append("used by kept run %s" % pinned[entry["name"]])
        if now - entry["last_active"] < request["min_idle_seconds"]:
            reasons.append("prepared or reused %ds ago (< min_idle_seconds %s)"
                           % (now - entry["last_active"], request["min_idle_seconds"]))
        entry["keep"] = bool(reasons)
        entry["reasons"] = reasons or ["no kept run uses it and it is not the newest"]
    return {"runs": runs, "datasets": datasets}


def _relative(path, work):
    return os.path.relpath(path, work)


def run(request, dry_run=False, now=None):
    """Apply retention for one DAG; return the result (also for ``dry_run``, which removes nothing)."""
    request = check_request(request)
    work = request["work"]
    decided = plan(request, now=now)
    removed, kept, freed = [], [], 0
    for kind in ("runs", "datasets"):
        for entry in decided[kind]:
            record = {"kind": kind[:-1], "path": _relative(entry["path"], work), "bytes": entry["bytes"],
                      "reasons": entry["reasons"]}
            if entry["keep"]:
                kept.append(record)
                continue
            if not dry_run:
                atomic.remove_dir(entry["path"])
            freed += entry["bytes"]
            removed.append(record)
            _log("%s %s %s (%s): %s" % ("would remove" if dry_run else "removed", record["kind"].replace("_", " "),
                                        record["path"], human_bytes(entry["bytes"]), "; ".join(entry["reasons"])))
    # A removal interrupted after its rename leaves a hidden .tmp-deleted-* dir; finish it later.
    runs_root = os.path.join(work, "runs", contract.safe_name(request["dag_id"]))
    if not dry_run:
        for name in atomic.clean_stale_temps(runs_root):
            _log("removed stale temporary directory %s" % _relative(os.path.join(runs_root, name), work))
    counts = {kind: sum(1 for r in removed if r["kind"] == kind) for kind in ("run", "dataset")}
    kept_counts = {kind: sum(1 for r in kept if r["kind"] == kind) for kind in ("run", "dataset")}
    _log("%s %d run dir(s) and %d data set(s), %s %s; kept %d run dir(s) and %d data set(s)"
         % ("would remove" if dry_run else "removed", counts["run"], counts["dataset"],
            "would free" if dry_run else "freed", human_bytes(freed), kept_counts["run"], kept_counts["dataset"]))
    return {"dag_id": request["dag_id"], "dry_run": bool(dry_run), "removed": removed, "kept": kept,
            "freed_bytes": freed, "keep_runs": request["keep_runs"],
            "min_idle_seconds": request["min_idle_seconds"]}


def _parser():
    parser = argparse.ArgumentParser(prog="python3 -m trainer.retention",
                                     description="Remove old run and data set directories of one DAG.")
    parser.add_argument("--request", metavar="FILE", help="request JSON file (default: $%s)" % REQUEST_ENV)
    parser.add_argument("--result", metavar="FILE", help="also write the result JSON to FILE (atomically)")
    parser.add_argument("--dry-run", action="store_true", help="decide and report, remove nothing")
    return parser


def main(argv=None):
    """Read the request, apply retention, print the result line; exit codes as for the stages."""
    args = _parser().parse_args(argv)
    try:
        if args.request:
            with open(args.request) as handle:
                text = handle.read()
        else:
            text = os.environ.get(REQUEST_ENV)
            if not text:
                raise BadInput("no retention request: set %s or pass --request" % REQUEST_ENV)
        try:
            request = json.loads(text)
        except ValueError as error:
            raise BadInput("the retention request is not valid JSON: %s" % error)
        result = run(request, dry_run=args.dry_run or bool(request.get("dry_run")))
    except BadInput as error:
        print("ERROR (BadInput, exit %d): %s" % (error.exit_code, error), file=sys.stderr, flush=True)
        return error.exit_code
    if args.result:
        atomic.write_json(args.result, result)
    sys.stdout.write(contract.RESULT_PREFIX + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()
    return contract.ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
