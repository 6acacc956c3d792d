"""Column types, missing values and vocabularies of CSV tables.

Standard library only: prep's parse workers use it, and they never import TensorFlow.

A CSV feature column is ``numeric`` (a float; ``data.features`` may declare it ``int``),
``boolean`` (true/false, yes/no, any case; stored as 1.0/0.0) or ``categorical`` (text). Prep
infers the type from the train split unless ``data.columns`` names it (:func:`infer_type`), and
reads a cell whose stripped text is empty or one of ``data.na_values`` as a missing value: NaN
in the float vector, ``""`` among the texts.

A categorical column is encoded by the model with its ``vocabulary`` (the most frequent train
values, at least ``data.min_frequency`` times each, at most ``data.max_vocabulary`` of them;
index 0 is the out-of-vocabulary bucket, index 1 the missing value, the vocabulary follows), or,
with more than ``data.hash_threshold`` distinct train values, by hashing into
``data.hash_bins`` buckets (missing values get a bucket of their own).
"""

import collections
import zlib

#: Boolean cell texts (compared lower-cased) and the number each stands for.
BOOLEAN_VALUES = {"true": 1.0, "false": 0.0, "yes": 1.0, "no": 0.0}
#: Share of a column's non-missing train cells that must be numbers for it to be inferred numeric.
#: Below it the column holds text; at or above it the few other cells are far more likely typos
#: in a numeric column than categories, so prep stops at them with an error that names them.
NUMERIC_SHARE = 0.95
#: Positions of a vocabulary column's lookup: unseen values, then the missing value.
OOV_INDEX, MISSING_INDEX = 0, 1
#: The parse kinds of a column in the CSV layout (:func:`trainer.sources.csv_layout`): ``float``
#: and ``int`` are numeric, ``auto`` is numeric until a train cell says otherwise.
NUMERIC_KINDS = ("float", "int", "auto")
#: Buckets of a hashed column's value profile in ``stats.json`` (crc32 of the UTF-8 text, modulo
#: this): fixed, so that the profiles of two nights compare bucket by bucket.
PROFILE_BUCKETS = 64


def boolean_value(text):
    """1.0 or 0.0 for a boolean cell text (stripped), None for any other text."""
    return BOOLEAN_VALUES.get(text.lower())


def is_number(text):
    """Whether ``text`` (stripped, not missing) reads as a finite float."""
    try:
        value = float(text)
    except ValueError:
        return False
    return value == value and value not in (float("inf"), float("-inf"))


class Profile(object):
    """Counts of one column's non-missing train cells by what they read as, for type inference."""

    def __init__(self):
        self.numbers = self.booleans = self.other = 0

    def add(self, text):
        if is_number(text):
            self.numbers += 1
        elif boolean_value(text) is not None:
            self.booleans += 1
        else:
            self.other += 1

    def merge(self, other):
        self.numbers += other.numbers
        self.booleans += other.booleans
        self.other += other.other


def infer_type(profile):
    """``float``, ``boolean`` or ``categorical`` for a column whose train cells are ``profile``.

    Only booleans: boolean. At least :data:`NUMERIC_SHARE` numbers (or no value at all): numeric.
    Else categorical.
    """
    total = profile.numbers + profile.booleans + profile.other
    if total and profile.booleans == total:
        return "boolean"
    if not total or profile.numbers >= NUMERIC_SHARE * total:
        return "float"
    return "categorical"


def profile_buckets(counter):
    """The :data:`PROFILE_BUCKETS` counts of a ``{value: count}`` counter's values by crc32 bucket."""
    buckets = [0] * PROFILE_BUCKETS
    crc32 = zlib.crc32
    for value, count in counter.items():
        buckets[crc32(value.encode("utf-8")) % PROFILE_BUCKETS] += count
    return buckets


class Counts(object):
    """The train-split value counts of the categorical columns, merged batch by batch.

    Memory stays bounded: a column with more than ``hash_threshold`` distinct values will be
    hashed, so its counts are dropped as soon as it passes the threshold. Its crc32 buckets
    (:func:`profile_buckets`, summed over the batches) stay: they are its profile.
    """

    def __init__(self, width, hash_threshold):
        self.threshold = hash_threshold
        self.counters = [collections.Counter() for _ in range(width)]
        self.hashed = [False] * width
        self.buckets = [[0] * PROFILE_BUCKETS for _ in range(width)]

    def merge(self, parts, buckets=None, hashed=None):
        """Add one batch's counters (one per categorical column), their buckets (one list of
        :data:`PROFILE_BUCKETS` counts per column) and which of them passed the threshold already
        (a part of sharded prep drops such a counter, as this does)."""
        for i, part in enumerate(parts):
            if buckets is not None:
                self.buckets[i] = [a + b for a, b in zip(self.buckets[i], buckets[i])]
            if self.hashed[i]:
                continue
            self.counters[i].update(part)
            if (hashed is not None and hashed[i]) or len(self.counters[i]) > self.threshold:
                self.hashed[i], self.counters[i] = True, collections.Counter()

    def _ranked(self, i):
        return sorted(self.counters[i].items(), key=lambda item: (-item[1], item[0]))

    def entry(self, i, data):
        """The schema entry fields of categorical column ``i``: its encoding and vocabulary."""
        if self.hashed[i]:
            return {"encoding": "hash", "hash_bins": data["hash_bins"], "distinct_above": self.threshold}
        counter = self.counters[i]
        kept = [value for value, count in self._ranked(i) if count >= data["min_frequency"]][:data["max_vocabulary"]]
        share = sum(counter[v] for v in kept)
        return {"encoding": "vocabulary", "vocabulary": kept, "distinct": len(counter),
                "oov_train": sum(counter.values()) - share}

    def frequencies(self, i, data):
        """The value profile of categorical column ``i`` (``stats.json``): a vocabulary column's
        ``data.max_vocabulary`` most frequent train values (ranked as :meth:`entry` ranks them, with
        no ``data.min_frequency`` cut), their ``counts`` and the ``other`` cells; a hashed column's
        :data:`PROFILE_BUCKETS` crc32 ``buckets``."""
        if self.hashed[i]:
            return {"hashed": True, "buckets": list(self.buckets[i])}
        top = self._ranked(i)[:data["max_vocabulary"]]
        counts = [count for _, count in top]
        return {"values": [value for value, _ in top], "counts": counts,
                "other": sum(self.counters[i].values()) - sum(counts)}


def input_layout(features):
    """What a model's input rows mean, from a schema's ``features``: per column its name, type and
    what the positions of its encoding stand for (vocabulary, hash buckets) and whether it had
    missing train values (the ``mlp`` adds a missing indicator then). Equal layouts mean weights
    trained on one fit the other; older schemas (numbers only) give the layout they had."""
    out = []
    for feature in features:
        kind = feature.get("type", "float")
        missing = (feature.get("missing") or {}).get("train", 0)
        if kind == "categorical":
            out.append([feature["name"], kind, feature.get("encoding"), feature.get("vocabulary"),
                        feature.get("hash_bins")])
        else:
            out.append([feature["name"], "numeric" if kind in NUMERIC_KINDS else kind, bool(missing)])
    return out
