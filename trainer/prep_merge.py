"""The ``prep_merge`` stage: the one data set of sharded prep, made from the shards' parts.

It fingerprints the input files as one prep task does (a data set already prepared is a cache
hit, as there), checks every CSV header (or Parquet schema) against the config, then reads the
committed parts in shard order (:mod:`trainer.shards`): records are cut again into
``data.shard_size`` TFRecord files; label histograms, distinct labels and the column profiles
(missing cells, histograms, categorical counts, from which the vocabularies follow as one prep task
computes them, dropped rows) are added up; the per-batch moments are merged in the order one prep
task merges them. The inferred column types must be the same in every part (:func:`agreed_types`).
The data set is therefore the one a single prep task writes for the same input: same fingerprint,
records, split, ``schema.json`` and ``stats.json``.
``fingerprint.json`` also lists the parts it was made from (which try wrote each).
"""

import os

from trainer import atomic, common, prep, records, shards, sources
from trainer.common import LOG
from trainer.errors import BadInput


def run(config):
    """Merge the parts of every shard; return the prep result (``fingerprint``, ``dataset_dir``, ...)."""
    config = common.begin(config, "prep_merge")
    data = config["data"]
    count = data["shards"]
    files = sources.input_files(config)
    fp, inputs = prep.fingerprint(data, files)
    LOG.info("prep_merge: %d input file(s), %d shard(s), fingerprint %s", len(files), count, fp)
    window = prep.window_read(config, files)
    result = prep.reuse_cached(config, fp, window)
    if result is None:
        result = _merge(config, fp, inputs, files, window)
    shards.remove_parts(config)
    return dict(result, shards=count)


def _merge(config, fp, inputs, files, window=None):
    import numpy as np

    data = config["data"]
    count = data["shards"]
    sizes = [f["bytes"] for f in inputs]
    parts = []
    for index in range(count):
        part_dir, part, digest = shards.read_part(config, fp, index, count)
        expected = [files[i][0] for i in shards.slice_positions(sizes, index, count)]
        if part["files"] != expected:
            raise BadInput("prep_merge: shard %d read %s, but its slice of the input is %s. Fix: clear this "
                           "run's prep_shard tasks so every shard prepares the current input"
                           % (index, part["files"], expected))
        parts.append((part_dir, part, digest))
    # one header (or Parquet schema) for all files, as one prep task checks; the types the shards agree on
    layout = sources.with_types(prep.table_layout(config, files), agreed_types([part for _, part, _ in parts]))
    root = common.datasets_root(config)
    with atomic.temp_dir(root) as tmp:
        writers = {split: prep.ShardWriter(tmp, split, data["shard_size"]) for split in ("train", "eval")}
        summary = prep.TableSummary(layout, data)
        try:
            for part_dir, part, _ in parts:
                for split, writer in writers.items():
                    before = writer.count
                    for name in part["shards"][split]:
                        for read in records.read_tfrecords(os.path.join(part_dir, name)):
                            writer.write(read)
                    if writer.count - before != part["counts"][split]:
                        raise BadInput("prep_merge: %s holds %d %s records, its part.json says %d"
                                       % (part_dir, writer.count - before, split, part["counts"][split]))
                    summary.hist[split] = prep.merge_hist(summary.hist[split], np.asarray(part["hist"][split], np.int64))
                for batch in part["moments"]:  # in the order one prep task merges them: bit for bit
                    summary.moments.merge(shards.moments_from_json(batch, len(layout["numeric"])))
                summary.distinct.update(part["labels"])
                if part["profile"] is not None:
                    summary.profile.add_json(part["profile"])
        finally:
            for writer in writers.values():
                writer.close_shard()
        counts = {split: writer.count for split, writer in writers.items()}
        names = {split: writer.close() for split, writer in writers.items()}
        prepared = prep.finish_csv(layout, ", ".join(sorted(rel for rel, _ in files)), counts, names, summary.hist,
                                   summary.moments, summary.distinct, sources.declared_classes(data), summary.profile)
        provenance = {"parts": [
            {"index": part["index"], "files": part["files"], "examples": part["counts"], "id": part["id"],
             "try_number": part["run"]["try_number"], "task_id": part["run"]["task_id"],
             "part_sha256": digest} for _, part, digest in parts]}
        return prep.commit_dataset(config, fp, inputs, tmp, prepared, provenance, window)


def agreed_types(parts):
    """``{column: type}`` of the inferred columns, which every shard that read files must have typed
    alike (each infers them from its own slice); else :class:`BadInput` naming the column, who read
    it as what, and the fix."""
    found = {}
    for part in parts:
        for name, kind in sorted(part["types"].items()):
            found.setdefault(name, {}).setdefault(kind, []).append(part)
    for name, kinds in sorted(found.items()):
        if len(kinds) > 1:
            readings = "; ".join("%s by shard(s) %s (%s)" % (
                kind, ", ".join(str(p["index"]) for p in read), ", ".join(f for p in read for f in p["files"]))
                for kind, read in sorted(kinds.items()))
            raise BadInput("prep_merge: the shards inferred different types for column %r: %s. Each shard infers "
                           "the type from its own slice's train rows. Fix: declare its type in data.columns, e.g. "
                           "data.columns: {%r: \"%s\"}" % (name, readings, name,
                                                          "categorical" if "categorical" in kinds else "numeric"))
    return {name: next(iter(kinds)) for name, kinds in found.items()}
