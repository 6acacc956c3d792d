"""Sharded prep: which input files each ``prep_shard`` task reads, and where its part lives.

With ``data.shards: N`` the prep stage runs as N ``prep_shard`` tasks and one ``prep_merge``
(:mod:`trainer.prep_shard`, :mod:`trainer.prep_merge`). Shard ``k`` reads a contiguous slice of
the sorted input files (:func:`slice_positions`), so concatenating the parts in shard order
gives the rows in the order one prep task reads them, and the merged data set is the one that
task would have written, byte for byte.

A shard's output, its *part*, is committed on its own under the run directory:
``<run_dir>/prep_shards/<fingerprint>/shard-KKKKK-of-NNNNN/`` holding one TFRecord file per
split, ``part.json`` (what the merge needs to rebuild the stats exactly) and ``_SUCCESS``, written
in a ``.tmp-shard-KKKKK-*`` directory and renamed into place. A retried shard finds its own
committed part (nothing to redo) or removes only its own temporary directories; it never
touches another shard's. The merge removes ``prep_shards/`` once the data set is published.
"""

import hashlib
import json
import os

from trainer import atomic, contract, prep
from trainer.errors import BadInput

#: Under the run dir: the committed parts of sharded prep, by data set fingerprint.
PARTS_SUBDIR = "prep_shards"
PART_FILE = "part.json"


def shard_of(config):
    """``(index, count)`` of a ``prep_shard`` config; BadInput when the index is missing or out of range."""
    count = config["data"]["shards"]
    index = config.get(contract.SHARD_INDEX_KEY)
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < count:
        raise BadInput("config field %s must be a shard index in 0..%d (data.shards is %d), got %r"
                       % (contract.SHARD_INDEX_KEY, count - 1, count, index))
    return index, count


def slice_positions(sizes, index, count):
    """Positions (in the sorted file list) of the files shard ``index`` of ``count`` reads.

    ``sizes`` are the files' byte sizes, in order. A file belongs to the shard in whose
    ``1/count`` of the total bytes it starts, so every file goes to exactly one shard, each shard
    reads a contiguous run of files, and the shards get about the same bytes when the files are
    many (a single file is never split). With no bytes at all, files are dealt by position.
    """
    total = sum(sizes)
    owned, start = [], 0
    for position, size in enumerate(sizes):
        if total:
            owner = min(count - 1, start * count // total)
        else:
            owner = position * count // max(1, len(sizes))
        if owner == index:
            owned.append(position)
        start += size
    return owned


def part_name(index, count):
    """The directory name of shard ``index``'s part."""
    return "shard-%05d-of-%05d" % (index, count)


def temp_prefix(index):
    """Prefix of shard ``index``'s temporary directories (so a retry finds only its own)."""
    return "%sshard-%05d-" % (atomic.TMP_PREFIX, index)


def parts_root(config):
    """``<run_dir>/prep_shards``: every part of this run, whatever the fingerprint."""
    return os.path.join(config["paths"]["run_dir"], PARTS_SUBDIR)


def parts_dir(config, fp):
    """Where the parts of data set ``fp`` are committed for this run."""
    return os.path.join(parts_root(config), fp)


def read_part(config, fp, index, count):
    """``(part_dir, part, sha256 of part.json)`` of a committed part; BadInput when it is missing."""
    part_dir = os.path.join(parts_dir(config, fp), part_name(index, count))
    path = os.path.join(part_dir, PART_FILE)
    if not os.path.exists(os.path.join(part_dir, "_SUCCESS")):
        raise BadInput(
            "prep_merge: shard %d of %d has no committed output for data set %s (looked for %s). The input "
            "files changed after the prep_shard tasks read them, the run directory was cleaned, or the shard "
            "ran on an engine (shard_docker_urls) that does not mount this work volume. Fix: give every engine "
            "in shard_docker_urls the same volumes (one host, or a shared filesystem mounted alike), then clear "
            "this run's prep_shard tasks (or start a new run) so every shard prepares the current "
            "input" % (index, count, fp, part_dir))
    with open(path, "rb") as handle:
        raw = handle.read()
    return part_dir, json.loads(raw.decode("utf-8")), hashlib.sha256(raw).hexdigest()


def remove_parts(config):
    """Remove this run's parts (after the data set they made is published)."""
    root = parts_root(config)
    if os.path.isdir(root):
        atomic.remove_dir(root)


def moments_to_json(moments):
    """A batch's :class:`~trainer.prep.Moments` as JSON (Python's floats round-trip exactly). Its
    ``count`` is one number, or one per column when the batch had missing values."""
    count = moments.count
    return {"count": [int(c) for c in count] if hasattr(count, "__len__") else int(count),
            **{name: [float(v) for v in getattr(moments, name)] for name in _MOMENT_ARRAYS}}


def moments_from_json(batch, width):
    """The :class:`~trainer.prep.Moments` of :func:`moments_to_json`'s output, bit for bit."""
    import numpy as np

    moments = prep.Moments(width)
    count = batch["count"]
    moments.count = np.asarray(count, dtype=np.int64) if isinstance(count, list) else count
    for name in _MOMENT_ARRAYS:
        setattr(moments, name, np.asarray(batch[name], dtype=np.float64))
    return moments


_MOMENT_ARRAYS = ("mean", "m2", "min", "max")
