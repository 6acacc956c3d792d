"""The ``prep_shard`` stage: one slice of the input files of sharded prep (``data.shards`` > 1).

Every shard fingerprints all input files (reading is far cheaper than parsing), so that a data
set already prepared is a cache hit here too and no shard parses anything. Otherwise shard ``k``
parses, validates, splits and encodes its own slice of the CSV or Parquet files
(:func:`trainer.shards.slice_positions`) with the same batch workers as one prep task
(:func:`trainer.prep.prepare_batch`), and commits its part on its own (:mod:`trainer.shards`):
records, label histogram, distinct labels, the per-batch moments, the types it gave its inferred
columns (from its own slice's train rows) and its column profile (:meth:`trainer.prep.ColumnProfile.to_json`:
missing cells per split, histograms, the categorical counters, bounded by ``data.hash_threshold``
as in one prep task, and their crc32 buckets, the dropped rows), so that :mod:`trainer.prep_merge`
rebuilds exactly what one prep task writes.
"""

import os
import time
import uuid

from trainer import atomic, common, contract, prep, shards, sources
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
    if data["format"] not in contract.TABULAR_FORMATS:
        raise BadInput("config field data.shards is %d but data.format is %r: sharded prep reads CSV and "
                       "Parquet tables. Fix: set data.shards to 1" % (count, data["format"]))
    files = sources.input_files(config)
    scans = {}
    fp, inputs = prep.fingerprint(data, files, scans if data["format"] == "csv" else None)
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
    data = config["data"]
    writers = {split: prep.ShardWriter(tmp, split, PART_FILE_RECORDS) for split in ("train", "eval")}
    if not files:  # more shards than files: an empty part
        return {"counts": {split: 0 for split in writers},
                "shards": {split: writer.close() for split, writer in writers.items()},
                "hist": {"train": [], "eval": []}, "labels": [], "moments": [], "feature_names": None,
                "types": {}, "profile": None}
    scans = {rel: scans[rel] for rel, _ in files if rel in scans}  # this slice's: the progress counts them
    layout, batches, workers = prep.table_source(config, files, scans)
    plan = prep.label_plan(layout, data)
    with prep.Workers(workers) as pool:
        try:
            try:
                summary = prep.write_batches(pool, batches(), plan, layout, data, scans, writers, keep_batches=True)
            except sources.TypesNeedScan:
                LOG.info("prep_shard: a column holds cells that are not numbers: inferring the column types "
                         "from this slice's train split first")
                _, types = prep.scan_table(pool, batches(), plan)
                plan["layout"] = layout = prep.with_scanned_types(layout, types)
                for name in os.listdir(tmp):  # the files the first attempt began
                    os.remove(os.path.join(tmp, name))
                writers = {split: prep.ShardWriter(tmp, split, PART_FILE_RECORDS) for split in ("train", "eval")}
                summary = prep.write_batches(pool, batches(), plan, layout, data, scans, writers, keep_batches=True)
        except prep.LabelsNeedScan:
            raise BadInput(
                "config field data.shards is %d, and the label column %r of %s holds labels that are not "
                "class ids (0, 1, 2, ...): a shard cannot number names it has not all seen. Fix: list "
                "the class names in data.classes, write the labels as class ids, or set data.shards to 1"
                % (data["shards"], data["label"], ", ".join(rel for rel, _ in files)))
    counts = {split: writer.count for split, writer in writers.items()}
    inferred = [(kind, name) for kind, name, source in zip(layout["feature_types"], layout["feature_names"],
                                                            layout["sources"]) if source == "inferred"]
    return {"counts": counts, "shards": {split: writer.close() for split, writer in writers.items()},
            "hist": {split: [int(c) for c in h] for split, h in summary.hist.items()},
            "labels": sorted(summary.distinct), "moments": [shards.moments_to_json(m) for m in summary.batch_moments],
            "feature_names": layout["feature_names"],
            # a column still typed auto met numbers only: float, as one prep task calls it
            "types": {name: "float" if kind == "auto" else kind for kind, name in inferred},
            "profile": summary.profile.to_json()}


def _hold_for_test(config, index):
    if os.environ.get(HOLD_ENV) == str(index) and config["run"]["try_number"] == 1:
        LOG.warning("test hook %s=%d: shard %d holds before committing its part", HOLD_ENV, index, index)
        time.sleep(HOLD_SECONDS)
