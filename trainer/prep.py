"""The prep stage: validate raw inputs and write a fingerprinted, sharded TFRecord data set.

Output: ``<work>/datasets/<fingerprint>/`` with ``train-*.tfrecord``/``eval-*.tfrecord`` shards,
``schema.json``, ``stats.json``, ``fingerprint.json`` and a ``_SUCCESS`` marker written last. The
directory is built under ``datasets/.tmp-<random>`` and renamed into place, so a data set is
either complete or absent. The fingerprint is the sha256 of the input files (relative paths and
bytes) and of the prep-relevant config; a data set with that fingerprint is reused ("cache hit").

Record layout (``tf.train.Example``): ``label`` int64, ``key`` bytes (the split key); tables:
``features`` float list of the numeric and boolean columns in schema order (NaN: missing), and,
when the table has categorical columns, ``categories`` bytes list of their stripped texts in
schema order (``""``: missing); images: ``image`` raw uint8 bytes of shape
``[height, width, channels]``.

CSV column types, missing values and vocabularies (:mod:`trainer.columns`): every feature of
``schema.json``'s ``features`` has its ``name``, ``type`` (``float``, ``int``, ``boolean`` or
``categorical``), ``source`` (``inferred``, ``data.columns`` or ``data.features``), ``missing``
(``{"train": n, "eval": n}`` cells), and, when categorical, ``encoding`` (``vocabulary`` with
``vocabulary``, ``distinct`` and ``oov_train``, or ``hash`` with ``hash_bins``). Columns typed
``ignore`` are listed in ``ignored``; rows dropped for a missing label are counted in
``dropped_rows``.

``stats.json`` holds per feature the train split's profile, made in the same pass (the data gate,
:mod:`trainer.validate`, compares two nights' profiles): the numeric, int and boolean features have
``mean``, ``std``, ``min``, ``max``, ``count``, ``missing`` and ``histogram``, their non-missing
values counted in fixed bins (:mod:`trainer.profile`); the categorical ones ``count``,
``missing``, ``distinct`` and ``frequencies`` (:meth:`trainer.columns.Counts.frequencies`: the
most frequent values and their counts, or a hashed column's crc32 buckets).

Parquet inputs (``data.format`` parquet: a file or a folder of ``*.parquet`` files with one schema)
take the same way: :func:`sources.parquet_batches` reads them a batch of rows at a time; the
workers read a batch's number and boolean columns straight into floats and its other cells as the
texts a CSV file would hold (:func:`sources.parse_batch`): the values its cells' texts give as CSV
rows (:func:`sources.arrow_rows`: nulls and float NaNs empty), which the row-by-row reader parses
when the direct read cannot take a batch (an infinite number, say), so types, missing values, vocabularies,
the split and the records are the CSV ones. A feature whose type is inferred takes its Parquet
type (numbers numeric, booleans boolean, texts categorical); errors name the file, the row
(counted from 1 in each file) and the column.

CSV inputs are read as a stream of batches (a few MiB of rows each, :func:`sources.csv_batches`)
that worker processes, one per CPU the container may use, parse, validate, split and encode
(:func:`prepare_batch`); this process writes their records to the shards in input order. At
most two batches per worker are in flight, so memory stays the same whatever the input size.
"""

import collections
import concurrent.futures
import concurrent.futures.process
import hashlib
import json
import math
import multiprocessing
import os
import time

from trainer import atomic, columns, common, contract, partitions, records, sources
from trainer import profile as histograms
from trainer.common import LOG
from trainer.errors import BadInput, WorkerDied

#: Bumped whenever the data set layout changes, so old data sets are not reused.
PREP_VERSION = 1
#: Bytes read at a time while fingerprinting; each read records one newline position at which
#: the CSV may be cut into batches.
READ_BYTES = 1 << 20
#: Bytes of CSV per batch: large enough to amortise a batch's fixed costs, small enough that
#: two batches per worker stay a few tens of MiB.
BATCH_BYTES = 4 << 20
#: Batches in flight per worker: one being parsed, one waiting, while this process writes.
_WINDOW_PER_WORKER = 2


def prep_settings(data):
    """The part of the ``data`` config that changes the prepared data set."""
    settings = {k: data[k] for k in ("format", "label", "features", "key", "eval_fraction",
                                     "split_seed", "shard_size")}
    if data.get("classes") is not None:
        # only when declared: the data sets of configs without it keep their fingerprints
        settings["classes"] = data["classes"]
    if data["format"] == "images":
        settings.update(image_size=data["image_size"], channels=data["channels"])
    if data["format"] in contract.TABULAR_FORMATS:
        # only when set: the data sets of configs without them keep their fingerprints
        defaults = contract.section_defaults("data")
        for key in ("columns", "na_values", "drop_missing_labels", "max_vocabulary", "min_frequency",
                    "hash_threshold", "hash_bins"):
            if data.get(key, defaults[key]) != defaults[key]:
                settings[key] = data[key]
    settings["prep_version"] = PREP_VERSION
    return settings


def fingerprint(data, files, scans=None):
    """Return ``(fingerprint, inputs)``: sha256 over the settings and every input file.

    Logs progress for large inputs. ``scans``, a dict, receives per relative path what the CSV
    reader plans its batches with (:func:`sources.csv_batches`): ``bytes``, ``lines`` (text
    lines), ``quoted`` (a ``"`` anywhere) and ``marks`` (newline positions, one per MiB read).
    """
    total = hashlib.sha256()
    total.update(json.dumps(prep_settings(data), sort_keys=True).encode("utf-8"))
    progress = common.Progress("prep: fingerprint", sum(os.path.getsize(p) for _, p in files),
                               "MiB", scale=1 << 20)
    inputs = []
    for rel, path in files:
        one = hashlib.sha256()
        size = newlines = 0
        quoted, marks = False, []
        last = b"\n"
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(READ_BYTES), b""):
                one.update(chunk)
                if scans is not None:
                    quoted = quoted or b'"' in chunk
                    end = chunk.rfind(b"\n") + 1
                    if end:
                        newlines += chunk.count(b"\n")
                        marks.append((size + end, newlines))
                    last = chunk[-1:]
                size += len(chunk)
                progress.add(len(chunk))
        if scans is not None:
            scans[rel] = {"bytes": size, "lines": newlines + (last != b"\n"), "quoted": quoted,
                          "marks": marks}
        total.update(b"\0%s\0%d\0%s" % (rel.encode("utf-8"), size, one.hexdigest().encode()))
        inputs.append({"path": rel, "bytes": size, "sha256": one.hexdigest()})
    progress.finish()
    return total.hexdigest(), inputs


def is_eval(key, seed, fraction):
    """Deterministic split: an example is in eval iff hash(seed, key) falls below ``fraction``.

    Depends only on the example's own key, so adding data never moves existing examples.
    """
    digest = hashlib.sha256(("%d:%s" % (seed, key)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / float(1 << 64) < fraction


class ShardWriter(object):
    """Writes one split's records as ``<split>-NNNNN-of-MMMMM.tfrecord``, ``shard_size`` each.

    Shards are opened as records arrive; :meth:`close` renames them to their final names (the
    shard count is known only at the end) and returns those names.
    """

    def __init__(self, out_dir, split, shard_size):
        self.out_dir, self.split, self.shard_size = out_dir, split, shard_size
        self._writer, self._in_shard, self._paths, self.count = None, 0, [], 0

    def write(self, batch):
        """Append serialized records, opening a new shard every ``shard_size`` of them."""
        start = 0
        while start < len(batch):
            if self._writer is None or self._in_shard == self.shard_size:
                self.close_shard()
                path = os.path.join(self.out_dir, ".%s-%05d" % (self.split, len(self._paths)))
                self._writer = records.TFRecordFile(path)
                self._paths.append(path)
            end = min(len(batch), start + self.shard_size - self._in_shard)
            self._writer.write(batch[start:end])
            self._in_shard += end - start
            start = end
        self.count += len(batch)

    def close_shard(self):
        """Close the shard being written, if any."""
        if self._writer is not None:
            self._writer.close()
        self._writer, self._in_shard = None, 0

    def close(self):
        """Close the last shard, give every shard its final name; return the names."""
        self.close_shard()
        if not self._paths:  # an empty split still gets its one (empty) shard
            path = os.path.join(self.out_dir, ".%s-00000" % self.split)
            records.TFRecordFile(path).close()
            self._paths.append(path)
        names = []
        for shard, path in enumerate(self._paths):
            name = "%s-%05d-of-%05d.tfrecord" % (self.split, shard, len(self._paths))
            os.rename(path, os.path.join(self.out_dir, name))
            names.append(name)
        return names


class Moments(object):
    """Count, mean, standard deviation, min and max per column, merged batch by batch.

    Batches combine with Chan et al.'s pairwise update, which keeps the variance as accurate
    as a single pass over all rows held in memory. NaN cells (missing values) are left out:
    ``count`` is then one count per column instead of one for all.
    """

    def __init__(self, width):
        import numpy as np

        self.count = 0
        self.mean = np.zeros(width)
        self.m2 = np.zeros(width)
        self.min = np.full(width, np.inf)
        self.max = np.full(width, -np.inf)

    @staticmethod
    def of(matrix):
        """The moments of the rows of a float64 matrix ``[n, width]``."""
        import numpy as np

        part = Moments(matrix.shape[1])
        missing = np.isnan(matrix)
        if missing.any():
            present = ~missing
            part.count = present.sum(axis=0)
            part.mean = np.where(present, matrix, 0.0).sum(axis=0) / np.maximum(part.count, 1)
            part.m2 = np.where(present, (matrix - part.mean) ** 2, 0.0).sum(axis=0)
            part.min = np.where(present, matrix, np.inf).min(axis=0)
            part.max = np.where(present, matrix, -np.inf).max(axis=0)
        elif len(matrix):
            part.count = len(matrix)
            part.mean = matrix.mean(axis=0)
            part.m2 = ((matrix - part.mean) ** 2).sum(axis=0)
            part.min, part.max = matrix.min(axis=0), matrix.max(axis=0)
        return part

    def merge(self, other):
        """Add another batch's moments to these."""
        import numpy as np

        if not np.any(other.count):
            return
        total = self.count + other.count
        share = np.where(total > 0, total, 1).astype(np.float64)  # per column when NaNs were left out
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (other.count / share)
        self.m2 = self.m2 + other.m2 + delta ** 2 * (self.count * other.count / share)
        self.count = total
        self.min, self.max = np.minimum(self.min, other.min), np.maximum(self.max, other.max)

    def summary(self, i):
        """``{count, mean, std, min, max}`` of column ``i`` (its non-missing cells; a column
        without any has mean and std 0, min and max None)."""
        count = int(self.count if not hasattr(self.count, "__len__") else self.count[i])
        if not count:
            return {"count": 0, "mean": 0.0, "std": 0.0, "min": None, "max": None}
        return {"count": count, "mean": float(self.mean[i]),
                "std": float(math.sqrt(max(self.m2[i], 0.0) / count)),
                "min": float(self.min[i]), "max": float(self.max[i])}


class LabelsNeedScan(Exception):
    """A label that is not a class id (a name, or negative): the mapping needs every label."""


def prepare_batch(task):
    """In a worker: parse, validate, split, summarise and encode one CSV batch.

    ``task`` is ``(batch, plan)``; ``plan["ids"]`` maps label texts to class ids, or is None
    while labels are taken to be class ids (``plan["labels_known"]`` false: the first label
    that is not one asks for a label scan instead of failing). A label the mapping lacks is
    one outside ``data.classes`` (a mapping made by a label scan has every label).
    """
    import numpy as np

    batch, plan = task
    rows = sources.parse_batch(batch, plan["layout"])
    unit = plan["layout"].get("unit", "line")
    ids = plan["ids"]
    if ids is None:
        ids, label_ids = {}, []
        for raw, line in zip(rows.labels, rows.lines):
            value = ids.get(raw)
            if value is None:
                try:
                    value = ids[raw] = int(raw)
                except ValueError:
                    raise LabelsNeedScan()
                if value < 0:
                    if not plan["labels_known"]:
                        raise LabelsNeedScan()
                    raise BadInput("%s %s %d column %r: class id %d is negative (expected 0 or "
                                   "more)" % (batch[1], unit, line, plan["layout"]["label"], value))
            label_ids.append(value)
    else:
        try:
            label_ids = [ids[raw] for raw in rows.labels]
        except KeyError:
            line, raw = next((n, r) for n, r in zip(rows.lines, rows.labels) if r not in ids)
            raise BadInput(sources.undeclared_label(batch[1], line, plan["layout"]["label"], raw,
                                                    plan["classes"], unit))
    label_ids = np.asarray(label_ids, dtype=np.int64)
    held_out = np.array([is_eval(key, plan["seed"], plan["fraction"]) for key in rows.keys],
                        dtype=bool).reshape(len(rows.keys))
    encoder = records.ExampleEncoder("floats")
    packed = rows.values.astype("<f4")
    texts = rows.texts
    out = {"train": [], "eval": []}
    for i, key in enumerate(rows.keys):
        out["eval" if held_out[i] else "train"].append(
            encoder.encode(packed[i].tobytes(), int(label_ids[i]), key, None if texts is None else texts[i]))
    train_values = rows.values[~held_out]
    out["moments"] = Moments.of(train_values)
    # sparse: the dense bins are mostly empty, and each result is pickled back to the main process
    dense = histograms.column_counts(train_values).reshape(-1)
    bins = np.flatnonzero(dense)
    out["histogram"] = (bins, dense[bins])
    out["hist"] = {"train": np.bincount(label_ids[~held_out]),
                   "eval": np.bincount(label_ids[held_out])}
    out["labels"] = set(rows.labels)
    out["lines"] = rows.physical_lines
    out["missing"], out["counts"] = _missing_and_counts(rows, plan["layout"], held_out)
    # here, before the main process's columns.Counts may drop a counter that passed the threshold
    out["buckets"] = [columns.profile_buckets(counter) for counter in out["counts"]]
    out["dropped"] = rows.dropped
    return out


def _missing_and_counts(rows, layout, held_out):
    """Per split, the missing cells of each feature (schema order); per categorical column, the
    counts of its train values."""
    import numpy as np

    width = len(layout["index"])
    missing = {"train": np.zeros(width, np.int64), "eval": np.zeros(width, np.int64)}
    numeric, categorical = layout["numeric"], layout["categorical"]
    nan = np.isnan(rows.values)
    for split, rows_of in (("train", ~held_out), ("eval", held_out)):
        if numeric:
            missing[split][numeric] = nan[rows_of].sum(axis=0)
    counts = [collections.Counter() for _ in categorical]
    if categorical:
        for row, out in zip(rows.texts, held_out):
            split = "eval" if out else "train"
            for c, text in enumerate(row):
                if text == "":
                    missing[split][categorical[c]] += 1
                elif split == "train":
                    counts[c][text] += 1
    return missing, counts


def scan_batch(task):
    """In a worker: the distinct label texts of one CSV batch, and per ``auto`` column a
    :class:`~trainer.columns.Profile` of its train cells. Rows with a missing label or the wrong
    column count are passed over: the write pass drops or refuses them."""
    batch, plan = task
    layout = plan["layout"]
    rel, rows, _ = sources.batch_rows(batch)
    na, ncols = layout["na"], layout["ncols"]
    auto = [(col, name) for col, kind, name in layout["index"] if kind == "auto"]
    profiles = {name: columns.Profile() for _, name in auto}
    labels = set()
    for _, row in rows:
        if len(row) != ncols:
            continue
        label = row[layout["label_at"]].strip()
        if label in na:
            continue
        labels.add(label)
        key = "%s:%s" % (rel, ",".join(row)) if layout["key_at"] is None else row[layout["key_at"]]
        if is_eval(key, plan["seed"], plan["fraction"]):
            continue
        for col, name in auto:
            text = row[col].strip()
            if text not in na:
                profiles[name].add(text)
    return labels, profiles


def usable_cpus():
    """CPUs this process may run on: its affinity mask, capped by the cgroup's CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:
        count = os.cpu_count() or 1
    quota = common.cpu_limit()
    if quota:
        count = min(count, max(1, int(math.ceil(quota))))
    return max(1, count)


class Workers(object):
    """A pool of ``count`` parse workers (none: the work runs in this process).

    Workers are forked: they start at once and import nothing again. They run numpy and the
    standard library only, never TensorFlow, so forking is safe even from a process that holds
    TensorFlow's threads (the in-image tests import it first; the stage itself never does).

    A ``concurrent.futures`` pool, not ``multiprocessing.Pool``: a worker that dies abruptly (the
    out-of-memory killer picks the process with the most memory, often a worker parsing a large
    batch) leaves ``Pool`` waiting for its batch forever; here every pending batch fails at once
    and the stage exits with :class:`~trainer.errors.WorkerDied`.
    """

    def __init__(self, count):
        self.count = count
        self._pool = None
        self._in_flight = []  # one deque of futures per map() call, so exit can wait for them
        if count > 1:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                count, mp_context=multiprocessing.get_context("fork"))
            # Every worker forked now, while the stage is small: Python 3.9 and 3.10 fork a
            # worker only when a task finds none idle, so one quick task would start one. Tasks
            # that outlast the submitting loop find none idle.
            for started in [self._pool.submit(time.sleep, 0.05) for _ in range(count)]:
                started.result()

    def map(self, function, tasks):
        """``function`` over ``tasks``; results in task order, at most two per worker pending."""
        if self._pool is None:
            for task in tasks:
                yield function(task)
            return
        pending = collections.deque()
        self._in_flight.append(pending)
        for task in tasks:
            try:
                pending.append(self._pool.submit(function, task))
            except concurrent.futures.process.BrokenProcessPool:  # a worker died since the last result
                raise self._died() from None
            if len(pending) >= _WINDOW_PER_WORKER * self.count:
                yield self._result(pending.popleft())
        while pending:
            yield self._result(pending.popleft())

    def _result(self, future):
        try:
            return future.result()
        except concurrent.futures.process.BrokenProcessPool:
            raise self._died() from None

    @staticmethod
    def _died():
        # Which signal ended it is not kept reliably (the pool forgets its dead workers).
        return WorkerDied(
            "prep: a parse worker process died abruptly, most likely killed by the out-of-memory "
            "killer; nothing was written. Fix: give the stage more memory (resources.mem_limit) or "
            "fewer workers (resources.cpus)")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._pool is None:
            return
        # Never kill the workers with tasks in flight (multiprocessing.Pool.terminate() could hang
        # for good there: seen within a few runs of a CSV with a bad line, where one batch's error
        # leaves the others in flight). They are at most two per worker and take a batch's time:
        # let them finish (or fail, with a dead worker), then shut the pool down the ordinary way.
        for pending in self._in_flight:
            concurrent.futures.wait(pending)
        self._pool.shutdown(wait=True)


def worker_count(files, layout, scans):
    """Parse workers for ``files``: one per usable CPU, but no more than there are batches."""
    count = sum(1 for _ in sources.csv_batches(
        [f for f in files if not scans[f[0]]["quoted"]], layout, scans, BATCH_BYTES))
    count += sum(int(math.ceil(scans[rel]["bytes"] / float(BATCH_BYTES)))
                 for rel, _ in files if scans[rel]["quoted"])
    workers = max(1, min(usable_cpus(), count))
    LOG.info("prep: about %d batch(es) on %d worker process(es)", count, workers)
    return workers


def merge_hist(total, part):
    """Add the label histogram ``part`` to ``total`` (either may be the longer); return the sum."""
    import numpy as np

    if len(part) > len(total):
        total = np.pad(total, (0, len(part) - len(total)))
    total[:len(part)] += part
    return total


def table_layout(config, files):
    """The layout of a CSV or Parquet table (:func:`sources.csv_layout`, :func:`sources.parquet_layout`)."""
    if config["data"]["format"] == "parquet":
        return sources.parquet_layout(config, files)
    return sources.csv_layout(config, files)


def table_source(config, files, scans):
    """``(layout, batches, workers)`` of a CSV or Parquet table: its layout, a function that
    returns a fresh iterator of its batches, and the parse workers it takes. ``scans`` is the
    fingerprint's (CSV); a Parquet table's row counts are added to it (the progress counts them)."""
    if config["data"]["format"] == "parquet":
        layout = sources.parquet_layout(config, files)
        scans.update((rel, {"lines": rows}) for rel, rows in layout["rows"].items())

        def batches():
            return sources.parquet_batches(files, layout)
        workers = max(1, min(usable_cpus(), sources.parquet_batch_count(layout)))
        LOG.info("prep: %d Parquet row(s) on %d worker process(es)", sum(layout["rows"].values()), workers)
        return layout, batches, workers
    layout = sources.csv_layout(config, files)

    def batches():  # a generator: a quoted file's batches hold rows, made only as needed
        return sources.csv_batches(files, layout, scans, BATCH_BYTES)
    return layout, batches, worker_count(files, layout, scans)


def scan_table(pool, batches, plan):
    """``(distinct label texts, {column: type})`` of a table's batches: the types of its inferred
    columns, from their train cells (:func:`scan_batch`, :func:`columns.infer_type`)."""
    distinct, profiles = set(), {}
    for labels, found in pool.map(scan_batch, ((b, plan) for b in batches)):
        distinct |= labels
        for name, profile in found.items():
            profiles.setdefault(name, columns.Profile()).merge(profile)
    return distinct, {name: columns.infer_type(profile) for name, profile in profiles.items()}


def _prep_csv(config, files, scans, tmp):
    """Write the table's shards into ``tmp``; return ``(parsed, counts, shards, stats)``.

    A Parquet table takes the same way as a CSV one: the workers parse its batches of rows
    (:func:`sources.parse_batch`) into the rows its cell texts would give as CSV rows.
    """
    data = config["data"]
    layout, batches, workers = table_source(config, files, scans)
    plan = label_plan(layout, data)
    with Workers(workers) as pool:
        try:
            return _write_csv(pool, batches(), plan, layout, data, scans, tmp, plan["classes"])
        except LabelsNeedScan:
            LOG.info("prep: labels are not all class ids: reading every label first")
        except sources.TypesNeedScan:
            LOG.info("prep: a column holds cells that are not numbers: inferring the column types "
                     "from the train split first")
        distinct, types = scan_table(pool, batches(), plan)
        plan["layout"] = layout = with_scanned_types(layout, types)
        class_names = plan["classes"]
        if not plan["labels_known"]:
            class_names, plan["ids"] = sources.label_mapping(distinct) if distinct else ([], None)
            plan["labels_known"] = True
        for name in os.listdir(tmp):  # the shards the first attempt began
            os.remove(os.path.join(tmp, name))
        return _write_csv(pool, batches(), plan, layout, data, scans, tmp, class_names)


def with_scanned_types(layout, types):
    """``layout`` with the types a scan inferred (:func:`sources.with_types`), logged."""
    layout = sources.with_types(layout, types)
    LOG.info("prep: column types: %s", ", ".join(
        "%s %s" % (name, kind) for name, kind in zip(layout["feature_names"], layout["feature_types"])))
    return layout


def label_plan(layout, data):
    """What :func:`prepare_batch` needs besides a batch: the layout, the split and the labels'
    ids: ``data.classes`` when declared (one pass, whatever the labels), else none yet (labels
    are taken for class ids until one is not)."""
    classes = sources.declared_classes(data)
    return {"layout": layout, "seed": data["split_seed"], "fraction": data["eval_fraction"], "classes": classes,
            "ids": {name: i for i, name in enumerate(classes)} if classes is not None else None,
            "labels_known": classes is not None}


class TableSummary(object):
    """What one pass over a table's batches adds up besides the records: label histograms per
    split, the train moments (merged, and, with ``keep_batches``, each batch's in order: a part
    of sharded prep hands them to the merge), the distinct labels and the :class:`ColumnProfile`."""

    def __init__(self, layout, data, keep_batches=False):
        import numpy as np

        self.hist = {"train": np.zeros(0, np.int64), "eval": np.zeros(0, np.int64)}
        self.moments = Moments(len(layout["numeric"]))
        self.batch_moments = [] if keep_batches else None
        self.distinct = set()
        self.profile = ColumnProfile(layout, data)

    def add(self, result):
        """Add one :func:`prepare_batch` result."""
        import numpy as np

        for split in self.hist:
            self.hist[split] = merge_hist(self.hist[split], result["hist"][split])
        self.moments.merge(result["moments"])
        if self.batch_moments is not None and np.any(result["moments"].count):
            self.batch_moments.append(result["moments"])  # an all-eval batch adds nothing (and has no min/max)
        self.distinct |= result["labels"]
        self.profile.add(result)


def write_batches(pool, batches, plan, layout, data, scans, writers, keep_batches=False):
    """One pass over the batches: workers prepare them, this process writes their records in order
    to ``writers`` (one :class:`ShardWriter` per split); returns the :class:`TableSummary`. A failure
    closes the shard being written."""
    lines = sum(s["lines"] for s in scans.values())
    headers = sum(first_line - 1 for _, first_line in layout["starts"].values())
    reading = common.Progress("prep: read", lines, "lines")
    reading.add(headers)
    # at most one example per data line; the exact total is known at the end
    writing = common.Progress("prep: wrote", lines - headers, "examples")
    summary = TableSummary(layout, data, keep_batches)
    try:
        for result in pool.map(prepare_batch, ((b, plan) for b in batches)):
            for split, writer in writers.items():
                writer.write(result[split])
            summary.add(result)
            reading.add(result["lines"])
            writing.add(len(result["train"]) + len(result["eval"]))
    except BaseException:
        for writer in writers.values():
            writer.close_shard()
        raise
    reading.finish()
    writing.total = writing.done
    writing.finish()
    return summary


def _write_csv(pool, batches, plan, layout, data, scans, tmp, class_names=None):
    """One pass over the batches into the data set's shards in ``tmp``; the data set's summary."""
    writers = {split: ShardWriter(tmp, split, data["shard_size"]) for split in ("train", "eval")}
    summary = write_batches(pool, batches, plan, layout, data, scans, writers)
    counts = {split: writer.count for split, writer in writers.items()}
    shards = {split: writer.close() for split, writer in writers.items()}
    return finish_csv(layout, ", ".join(sorted(scans)), counts, shards, summary.hist, summary.moments,
                      summary.distinct, class_names, summary.profile)


class ColumnProfile(object):
    """Per feature, over all batches: missing cells per split, the train histogram of a numeric or
    boolean column (:mod:`trainer.profile`), the train value counts and crc32 buckets of a
    categorical one (:class:`columns.Counts`), and the rows dropped for a missing label."""

    def __init__(self, layout, data):
        import numpy as np

        self.layout, self.data = layout, data
        width = len(layout["index"])
        self.missing = {"train": np.zeros(width, np.int64), "eval": np.zeros(width, np.int64)}
        self.histogram = np.zeros((len(layout["numeric"]), 2 * histograms.SPAN + 1), np.int64)
        self.counts = columns.Counts(len(layout["categorical"]), data["hash_threshold"])
        self.dropped, self.dropped_lines = 0, []

    def add(self, result):
        """Add one :func:`prepare_batch` result."""
        for split in self.missing:
            self.missing[split] += result["missing"][split]
        bins, counts = result["histogram"]
        self.histogram.reshape(-1)[bins] += counts  # bins are distinct: a plain indexed add
        self.counts.merge(result["counts"], result["buckets"])
        self._drop(len(result["dropped"]), result["dropped"])

    def _drop(self, count, lines):
        self.dropped += count
        self.dropped_lines.extend(lines[:max(0, 10 - len(self.dropped_lines))])

    def to_json(self):
        """This profile as JSON, for a part of sharded prep (:meth:`add_json` adds it back exactly).
        A counter that passed ``data.hash_threshold`` is left out, as :class:`columns.Counts` drops it."""
        return {"missing": {split: [int(m) for m in counts] for split, counts in self.missing.items()},
                "histograms": [histograms.to_json(row) for row in self.histogram],
                "categories": [{"hashed": hashed, "counts": dict(counter), "buckets": buckets}
                               for hashed, counter, buckets in zip(self.counts.hashed, self.counts.counters,
                                                                   self.counts.buckets)],
                "dropped": {"count": self.dropped, "first_lines": self.dropped_lines}}

    def add_json(self, part):
        """Add a part's profile (:meth:`to_json`)."""
        import numpy as np

        for split in self.missing:
            self.missing[split] += np.asarray(part["missing"][split], np.int64)
        for row, histogram in zip(self.histogram, part["histograms"]):
            for bin_id, count in histograms.from_json(histogram).items():
                row[bin_id + histograms.SPAN] += count
        categories = part["categories"]
        self.counts.merge([c["counts"] for c in categories], [c["buckets"] for c in categories],
                          [c["hashed"] for c in categories])
        self._drop(part["dropped"]["count"], part["dropped"]["first_lines"])

    def features(self):
        """The schema's ``features`` entries (see the module docstring)."""
        layout, out = self.layout, []
        where = {j: c for c, j in enumerate(layout["categorical"])}
        for j, (_, kind, name) in enumerate(layout["index"]):
            entry = {"name": name, "type": "float" if kind == "auto" else kind,
                     "source": layout["sources"][j],
                     "missing": {split: int(m[j]) for split, m in self.missing.items()}}
            if kind == "categorical":
                entry.update(self.counts.entry(where[j], self.data))
            out.append(entry)
        return out

    def stats(self):
        """Per feature name, its profile in ``stats.json``: ``histogram`` (numeric, int and boolean
        features) or ``frequencies`` (categorical ones): see :meth:`columns.Counts.frequencies`."""
        names = self.layout["feature_names"]
        out = {names[j]: {"histogram": histograms.to_json(self.histogram[i])}
               for i, j in enumerate(self.layout["numeric"])}
        out.update((names[j], {"frequencies": self.counts.frequencies(c, self.data)})
                   for c, j in enumerate(self.layout["categorical"]))
        return out


def finish_csv(layout, where, counts, shards, hist, moments, distinct, class_names=None, profile=None):
    """The class names, checks and stats of a CSV data set whose shards are written.

    ``hist`` maps each split to its label-id histogram, ``moments`` is the train split's
    :class:`Moments`, ``distinct`` the label texts seen, ``profile`` the :class:`ColumnProfile`.
    Returns ``(parsed, counts, shards, stats)``; shared by one-task prep and the merge of sharded
    prep (:mod:`trainer.prep_merge`).
    """
    import numpy as np

    if class_names is None:
        class_names, _ = sources.label_mapping(distinct) if distinct else ([], None)
    if not counts["train"] + counts["eval"]:
        raise BadInput("the data set is empty: %s contain(s) a header but no data rows" % where)
    hist = {split: merge_hist(np.zeros(len(class_names), np.int64), part) for split, part in hist.items()}
    sources.check_classes(class_names, list(hist["train"] + hist["eval"]), where)
    names = layout["feature_names"]
    stats = {"class_histogram": {s: [int(c) for c in h] for s, h in hist.items()},
             "features": {names[j]: moments.summary(i) for i, j in enumerate(layout["numeric"])}}
    parsed = {"class_names": class_names, "feature_names": names,
              "feature_types": [("float" if kind == "auto" else kind) for kind in layout["feature_types"]]}
    if profile is not None:
        parsed["features"] = profile.features()
        parsed["ignored"] = layout["ignored"]
        parsed["na_values"] = sorted(layout["na"])
        parsed["dropped_rows"] = {"count": profile.dropped, "first_lines": profile.dropped_lines}
        for feature in parsed["features"]:
            summary = stats["features"].setdefault(feature["name"], {})
            summary["missing"] = feature["missing"]["train"]
            if feature["type"] == "categorical":
                summary.update(count=counts["train"] - feature["missing"]["train"],
                               distinct=feature.get("distinct"))
        for name, found in profile.stats().items():
            stats["features"][name].update(found)
        if profile.dropped:
            LOG.warning("prep: dropped %d row(s) without a label (data.drop_missing_labels), e.g. line(s) %s",
                        profile.dropped, ", ".join(map(str, profile.dropped_lines)))
    return parsed, counts, shards, stats


def _prep_images(config, tmp):
    """Write the image data set's shards into ``tmp``; return ``(parsed, counts, shards, stats)``."""
    import numpy as np

    data = config["data"]
    reading = common.Progress("prep: read", len(sources.input_files(config)), "images")
    parsed = sources.read_images(config, reading)
    reading.finish()
    splits = {"train": [], "eval": []}
    for example in parsed["examples"]:
        held_out = is_eval(example[0], data["split_seed"], data["eval_fraction"])
        splits["eval" if held_out else "train"].append(example)
    encoder = records.ExampleEncoder("image")
    writing = common.Progress("prep: wrote", len(parsed["examples"]), "examples")
    counts, shards, hist = {}, {}, {}
    for split, rows in splits.items():
        writer = ShardWriter(tmp, split, data["shard_size"])
        for key, pixels, label_id in rows:
            writer.write([encoder.encode(pixels.tobytes(), label_id, key)])
            writing.add()
        counts[split], shards[split] = writer.count, writer.close()
        hist[split] = [0] * len(parsed["class_names"])
        for _, _, label_id in rows:
            hist[split][label_id] += 1
    writing.finish()
    stats = {"class_histogram": hist}
    if splits["train"]:
        pixels = np.stack([value for _, value, _ in splits["train"]]).astype(np.float64)
        flat = pixels.reshape(-1, pixels.shape[-1])
        moments = Moments.of(flat)
        stats["channels"] = [moments.summary(c) for c in range(flat.shape[1])]
    return {"class_names": parsed["class_names"]}, counts, shards, stats


def _result(fp, dataset_dir, schema, cache_hit, window=None):
    result = {"fingerprint": fp, "dataset_dir": dataset_dir, "cache_hit": cache_hit,
              "examples": dict(schema["counts"]), "num_classes": schema["num_classes"]}
    if window:
        result["window"] = window
    return result


def _use(config, fp, dataset_dir, window=None):
    # the run's own record of what it read: a cache hit's data set may have been made by another run
    pointer = {"fingerprint": fp, "dataset_dir": dataset_dir, "created": common.now_iso()}
    if window:
        pointer["window"] = window
    atomic.write_json(os.path.join(config["paths"]["run_dir"], "dataset.json"), pointer)


def run(config):
    """Run the prep stage; return ``{fingerprint, dataset_dir, cache_hit, examples, ...}``."""
    config = common.begin(config, "prep")
    data = config["data"]
    files = sources.input_files(config)
    scans = {}
    fp, inputs = fingerprint(data, files, scans if data["format"] == "csv" else None)
    LOG.info("prep: %d input file(s), fingerprint %s", len(files), fp)
    window = window_read(config, files)
    hit = reuse_cached(config, fp, window)
    if hit is not None:
        return hit
    root = common.datasets_root(config)
    with atomic.temp_dir(root) as tmp:
        if data["format"] in contract.TABULAR_FORMATS:
            parsed, counts, shards, stats = _prep_csv(config, files, scans, tmp)
        else:
            parsed, counts, shards, stats = _prep_images(config, tmp)
        return commit_dataset(config, fp, inputs, tmp, (parsed, counts, shards, stats), window=window)


def window_read(config, files):
    """The date window ``files`` come from (:func:`trainer.partitions.summary`), logged; None without one."""
    window = partitions.summary(config["data"], config["run"].get(contract.WINDOW_END_KEY), files)
    if window:
        LOG.info("prep: window %s .. %s (%d day(s) before %s): read %s%s", window["first"], window["last"],
                 window["days"], window["end"], ", ".join(window["partitions"]),
                 "; missing %s" % ", ".join(window["missing"]) if window["missing"] else "")
    return window


def reuse_cached(config, fp, window=None):
    """The stage result of the data set ``fp`` when it is already prepared (a cache hit), else None.

    Also removes temporary directories a killed prep left, and points this run at a hit.
    ``window``: the date window the run read (:func:`window_read`), recorded with it.
    """
    root = common.datasets_root(config)
    dataset_dir = os.path.join(root, fp)
    for name in atomic.clean_stale_temps(root):  # left by a killed prep
        LOG.info("removed stale temporary directory %s/%s", root, name)
    if not os.path.exists(os.path.join(dataset_dir, "_SUCCESS")):
        return None
    LOG.info("cache hit: data set %s already prepared, nothing to do", dataset_dir)
    _mark_used(dataset_dir)
    schema = atomic.read_json(os.path.join(dataset_dir, "schema.json"))
    _use(config, fp, dataset_dir, window)
    return _result(fp, dataset_dir, schema, True, window)


def commit_dataset(config, fp, inputs, tmp, prepared, provenance=None, window=None):
    """Write schema, stats, fingerprint and ``_SUCCESS`` into ``tmp``, publish it as the data set
    ``fp`` and point this run at it; return the stage result.

    ``prepared`` is ``(parsed, counts, shards, stats)``; ``provenance`` (a dict) is added to
    ``fingerprint.json`` (sharded prep records the parts it merged there), and so is ``window``, the
    date window the inputs come from (:func:`window_read`), which the run and the result record too.
    """
    parsed, counts, shards, stats = prepared
    data, fmt = config["data"], config["data"]["format"]
    dataset_dir = os.path.join(common.datasets_root(config), fp)
    total = sum(counts.values())
    for split, count in counts.items():
        if not count:
            raise BadInput("the %s split is empty: %d example(s) with data.eval_fraction %s; "
                           "add data or change data.eval_fraction"
                           % (split, total, data["eval_fraction"]))
    class_names = parsed["class_names"]
    schema = {
        "format": fmt, "label": data["label"], "key": data["key"],
        "class_names": class_names, "num_classes": len(class_names),
        "counts": counts, "fingerprint": fp, "prep_version": PREP_VERSION,
    }
    if fmt in contract.TABULAR_FORMATS:
        schema["features"] = parsed.get("features") or [
            {"name": n, "type": t} for n, t in zip(parsed["feature_names"], parsed["feature_types"])]
        schema["ignored"] = parsed.get("ignored", [])
        schema["na_values"] = parsed.get("na_values", [""])
        schema["dropped_rows"] = parsed.get("dropped_rows", {"count": 0, "first_lines": []})
        schema["image"] = None
    else:
        height, width = data["image_size"]
        schema["features"] = []
        schema["image"] = {"height": height, "width": width, "channels": data["channels"]}
    schema["shards"] = shards
    atomic.write_json(os.path.join(tmp, "schema.json"), schema)
    atomic.write_json(os.path.join(tmp, "stats.json"), stats)
    atomic.write_json(os.path.join(tmp, "fingerprint.json"), dict(provenance or {}, **{
        "fingerprint": fp, "settings": prep_settings(data), "inputs": inputs,
        "created": common.now_iso(), "run": config["run"]}, **({"window": window} if window else {})))
    with open(os.path.join(tmp, "_SUCCESS"), "w") as handle:
        handle.write(common.now_iso() + "\n")
    _publish(tmp, dataset_dir)
    LOG.info("prep: wrote %s: %d train / %d eval examples, %d classes", dataset_dir,
             schema["counts"]["train"], schema["counts"]["eval"], len(class_names))
    _use(config, fp, dataset_dir, window)
    return _result(fp, dataset_dir, schema, False, window)


def _mark_used(dataset_dir):
    """Refresh the data set's mtime: retention keeps a data set reused recently (trainer.retention)."""
    try:
        os.utime(dataset_dir, None)
    except OSError as error:  # not ours to touch: retention then only sees the pointer
        LOG.warning("could not mark %s as used (%s)", dataset_dir, error)


def _publish(tmp, dataset_dir):
    """Rename the finished temp dir into place; tolerate a concurrent identical prep."""
    try:
        atomic.publish_dir(tmp, dataset_dir)
    except FileExistsError:
        if os.path.exists(os.path.join(dataset_dir, "_SUCCESS")):
            LOG.info("data set %s was published meanwhile by another run; using it", dataset_dir)
            return
        LOG.warning("replacing incomplete data set directory %s", dataset_dir)
        atomic.replace_dir(tmp, dataset_dir)
