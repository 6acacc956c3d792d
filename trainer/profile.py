"""Histograms of numeric columns that every night bins alike, so that two nights compare.

Prep makes one pass over the data and cannot know a column's range before it ends, and the data
gate (:mod:`trainer.validate`) compares tonight's histogram with one made on another night. Both
needs are met by bins fixed in advance: each power of two of a value's magnitude is cut into
:data:`SUB_BINS` equal bins (a bin spans 1.6% to 3.1% of its values), from 2 ** :data:`LOWEST`
to 2 ** :data:`HIGHEST` in magnitude, on both signs, with one bin for zero (and magnitudes below
the range). The bin of a float32 is read off its bits (exponent and top mantissa bits), which is
far cheaper than a logarithm. Histograms of batches, shards and nights then add up bin by bin; the
gate groups the fine bins into a few of equal baseline mass before it measures drift.

A histogram's JSON form (``stats.json``, per numeric feature, key ``histogram``):
``{"scale": SCALE, "bins": [bin ids, ascending], "counts": [their counts]}``; empty bins are left
out. Standard library and NumPy only: prep's workers use it.
"""

#: Mantissa bits of a float32 that pick the bin inside a power of two: 2 ** 5 bins per octave.
MANTISSA_BITS = 5
SUB_BINS = 1 << MANTISSA_BITS
#: Magnitudes below 2 ** LOWEST share the bin of zero; above 2 ** HIGHEST, the largest bin of their sign.
LOWEST, HIGHEST = -40, 60
#: Name of the scale in the JSON form: a reader meeting another scale knows it cannot compare.
SCALE = "log2x%d" % SUB_BINS
#: Bins per sign; ids run from -SPAN to SPAN, 0 being the bin of zero.
SPAN = (HIGHEST - LOWEST) * SUB_BINS
_SHIFT = 23 - MANTISSA_BITS
_FIRST = (127 + LOWEST) << MANTISSA_BITS  # the top bits of 2 ** LOWEST


def bin_ids(values):
    """The bin id of each finite value of the NumPy array ``values`` (any shape; NaN excluded by the
    caller), as an int64 array of the same shape."""
    import numpy as np

    values = np.ascontiguousarray(values, dtype=np.float32)
    top = (np.abs(values).view(np.int32) >> _SHIFT).astype(np.int64) - _FIRST
    ids = np.minimum(top, SPAN - 1) + 1
    ids[top < 0] = 0
    return np.where(values < 0, -ids, ids)


def column_counts(matrix):
    """Per column of the 2-D float array ``matrix``, the bin counts of its non-NaN values, as one
    int64 array of shape ``[columns, 2 * SPAN + 1]`` (index ``id + SPAN``)."""
    import numpy as np

    rows, width = matrix.shape
    out = np.zeros((width, 2 * SPAN + 1), np.int64)
    if not rows or not width:
        return out
    finite = ~np.isnan(matrix)
    ids = bin_ids(np.where(finite, matrix, 0.0)) + SPAN
    flat = (ids + np.arange(width, dtype=np.int64) * (2 * SPAN + 1))[finite]
    out += np.bincount(flat, minlength=width * (2 * SPAN + 1)).reshape(width, 2 * SPAN + 1)
    return out


def to_json(counts):
    """The JSON form of one column's dense counts (a row of :func:`column_counts`)."""
    import numpy as np

    nonzero = np.flatnonzero(counts)
    return {"scale": SCALE, "bins": [int(i) - SPAN for i in nonzero], "counts": [int(counts[i]) for i in nonzero]}


def from_json(histogram):
    """``{bin id: count}`` of a histogram's JSON form; None when it is missing or on another scale."""
    if not histogram or histogram.get("scale") != SCALE:
        return None
    return dict(zip(histogram["bins"], histogram["counts"]))


def bin_edges(bin_id):
    """``(low, high)`` of bin ``bin_id``: the magnitudes it holds lie in [low, high) (the edges of a
    negative bin are negative, low the larger magnitude)."""
    if bin_id == 0:
        return 0.0, 0.0
    k = abs(bin_id) - 1
    octave, part = divmod(k, SUB_BINS)
    scale = 2.0 ** (LOWEST + octave)
    low, high = scale * (1 + part / SUB_BINS), scale * (1 + (part + 1) / SUB_BINS)
    return (low, high) if bin_id > 0 else (-high, -low)


def bin_middle(bin_id):
    """A representative value of bin ``bin_id`` (the middle of its edges), for plots."""
    low, high = bin_edges(bin_id)
    return (low + high) / 2
