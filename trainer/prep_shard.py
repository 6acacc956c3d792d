"""The ``prep_shard`` stage: one slice of the input files of sharded prep (``data.shards`` > 1).

Every shard fingerprints all input files (reading is far cheaper than parsing), so that a data
set already prepared is a cache hit here too and no shard parses anything. Otherwise shard ``k``
parses, validates, splits and encodes its own slice (:func:`trainer.shards.slice_positions`)
with the same batch workers as one prep task (:func:`trainer.prep.prepare_batch`), and commits
its part on its own (:mod:`trainer.shards`): records, label histogram, distinct labels and the
per-batch moments, so that :mod:`trainer.prep_merge` rebuilds exactly what one prep task writes.
"""

import os
import time
import uuid

from trainer import atomic, columns, common, prep, shards, sources
from trainer.common import LOG
from trainer.errors import BadInput

#: Records per TFRecord file of a part: one file per split (the merge re-cuts them).
PART_FILE_RECORDS = 1 << 62
#: Test hook: the shard whose index this names holds, on its first try, between writing its
#: part and committing it, so that a test can kill its container there (a real SIGKILL).
HOLD_ENV = "TFPIPE_TEST_HOLD_SHARD"
HOLD_SECONDS = 300


def run(config):
    """Run shard ``shard_index`` of sharded prep; return ``{fingerprint, shard, cache_hit, ...}``."""
    config = common.begin(config, "prep_shard")
    data = config["data"]
    index, count = shards.shard_of(config)
    if data["format"] != "csv":
        raise BadInput("config field data.shards is %d but data.format is %r: sharded prep reads CSV "
                       "files only. Fix: set data.shards to 1" % (count, data["format"]))
    files = sources.input_files(config)
    scans = {}
    fp, inputs = prep.fingerprint(data, files, scans)
    result = {"fingerprint": fp, "shard": index, "shards": count}
    dataset_dir = os.path.join(common.datasets_root(config), fp)
    if os.path.exists(os.path.join(dataset_dir, "_SUCCESS")):
        LOG.info("cache hit: data set %s already prepared; shard %d has nothing to do", dataset_dir, index)
        return dict(result, cache_hit=True, files=[])
    mine = [files[i] for i in shards.slice_positions([f["bytes"] for f in inputs], index, count)]
    names = [rel for rel, _ in mine]
    LOG.info("prep_shard %d of %d: %d of %d input file(s): %s", index, count, len(mine), len(files),
             ", ".join(names) or "none (more shards than files)")
    root = shards.parts_dir(config, fp)
    part_dir = os.path.join(root, shards.part_name(index, count))
    if os.path.exists(os.path.join(part_dir, "_SUCCESS")):
        part = atomic.read_json(os.path.join(part_dir, shards.PART_FILE))
        LOG.info("shard %d: its part was committed by try %s already; nothing to redo", index,
                 part["run"]["try_number"])
        return dict(result, cache_hit=False, files=names, examples=part["counts"], reused_part=True)
    # Any age: an earlier try of this shard is over (its container is removed before a retry
    # starts), and the prefix is this shard's alone, so no running shard loses its work.
    for name in atomic.clean_stale_temps(root, max_age_s=-1.0, prefix=shards.temp_prefix(index)):
        LOG.info("shard %d: removed %s/%s, left by an earlier try of this shard", index, root, name)
    with atomic.temp_dir(root, prefix=shards.temp_prefix(index)) as tmp:
        part = _write_part(config, mine, scans, tmp)
        part.update(fingerprint=fp, index=index, count=count, files=names, run=config["run"],
                    id=uuid.uuid4().hex, created=common.now_iso())
        atomic.write_json(os.path.join(tmp, shards.PART_FILE), part)
        _hold_for_test(config, index)
        with open(os.path.join(tmp, "_SUCCESS"), "w") as handle:
            handle.write(common.now_iso() + "\n")
        atomic.publish_dir(tmp, part_dir)
    LOG.info("shard %d: committed %s: %d train / %d eval examples", index, part_dir,
             part["counts"]["train"], part["counts"]["eval"])
    return dict(result, cache_hit=False, files=names, examples=part["counts"], reused_part=False)


def _write_part(config, files, scans, tmp):
    """Prepare ``files`` into ``tmp``; return the part's summary (without identity)."""
    import numpy as np

    data = config["data"]
    layout = sources.csv_layout(config, files) if files else None
    if layout is not None:
        typed = [name for name, kind in zip(layout["feature_names"], layout["feature_types"])
                 if kind in ("categorical", "boolean")]
        if typed:
            raise _tables_need_one_task(data, "data.columns types %s as text or boolean" % ", ".join(map(repr, typed)))
    while True:
        writers = {split: prep.ShardWriter(tmp, split, PART_FILE_RECORDS) for split in ("train", "eval")}
        hist = {"train": np.zeros(0, np.int64), "eval": np.zeros(0, np.int64)}
        moments, distinct = [], set()
        if layout is None:
            break
        plan = prep.label_plan(layout, data)
        batches = sources.csv_batches(files, layout, scans, prep.BATCH_BYTES)
        with prep.Workers(prep.worker_count(files, layout, scans)) as pool:
            try:
                for done in pool.map(prep.prepare_batch, ((b, plan) for b in batches)):
                    if done["dropped"] or any(m.any() for m in done["missing"].values()):
                        raise _tables_need_one_task(data, "%s has missing values (empty or data.na_values "
                                                    "cells, or labels)" % ", ".join(rel for rel, _ in files))
                    for split, writer in writers.items():
                        writer.write(done[split])
                        hist[split] = prep.merge_hist(hist[split], done["hist"][split])
                    if done["moments"].count:  # an all-eval batch adds nothing (and has no min/max)
                        moments.append(shards.moments_to_json(done["moments"]))
                    distinct |= done["labels"]
                break
            except sources.TypesNeedScan:
                layout = _numeric_types(pool, files, layout, scans, plan, data)
            except prep.LabelsNeedScan:
                raise BadInput(
                    "config field data.shards is %d, and the label column %r of %s holds labels that are not "
                    "class ids (0, 1, 2, ...): a shard cannot number names it has not all seen. Fix: list "
                    "the class names in data.classes, write the labels as class ids, or set data.shards to 1"
                    % (data["shards"], data["label"], ", ".join(rel for rel, _ in files)))
            finally:
                for writer in writers.values():
                    writer.close_shard()
        for name in os.listdir(tmp):  # what the pass that met a text began
            os.remove(os.path.join(tmp, name))
    counts = {split: writer.count for split, writer in writers.items()}
    return {"counts": counts, "shards": {split: writer.close() for split, writer in writers.items()},
            "hist": {split: [int(c) for c in h] for split, h in hist.items()},
            "labels": sorted(distinct), "moments": moments,
            "feature_names": layout["feature_names"] if layout else None}


def _numeric_types(pool, files, layout, scans, plan, data):
    """The layout with its inferred columns typed from this slice's train rows, when all of them
    are numeric (a few texts there are typos, which the next pass names); else the refusal."""
    profiles = {}
    for _, found in pool.map(prep.scan_batch, ((b, plan) for b in sources.csv_batches(
            files, layout, scans, prep.BATCH_BYTES))):
        for name, profile in found.items():
            profiles.setdefault(name, columns.Profile()).merge(profile)
    types = {name: columns.infer_type(profile) for name, profile in profiles.items()}
    texts = sorted(name for name, kind in types.items() if kind != "float")
    if texts:
        raise _tables_need_one_task(data, "the column(s) %s of %s hold text" % (
            ", ".join(map(repr, texts)), ", ".join(rel for rel, _ in files)))
    return sources.with_types(layout, types)


def _tables_need_one_task(data, what):
    # Vocabularies need every shard's counts before any top-k, and missing-value statistics
    # per-column counts the parts do not carry: one prep task does both.
    return BadInput("config field data.shards is %d, and %s: sharded prep reads numeric tables without missing "
                    "values only. Fix: set data.shards to 1 (one prep task infers types, vocabularies and missing "
                    "values)" % (data["shards"], what))


def _hold_for_test(config, index):
    if os.environ.get(HOLD_ENV) == str(index) and config["run"]["try_number"] == 1:
        LOG.warning("test hook %s=%d: shard %d holds before committing its part", HOLD_ENV, index, index)
        time.sleep(HOLD_SECONDS)
