"""``tf.train.Example`` records written straight in the protobuf wire format, without TensorFlow.

Prep writes millions of records whose layout never changes within a data set: one value feature
(``features``: a float list, or ``image``: one bytes value), ``label`` (one int64) and ``key`` (one
bytes value). Building a protobuf message per row costs more than parsing the row; here the
constant part of each record is encoded once and only the row's own bytes are joined in, so a
record costs a few hundred nanoseconds and needs no TensorFlow (prep's parse workers never
import it). The bytes are a valid ``tf.train.Example``: ``tf.io.parse_example`` and
``tf.train.Example.FromString`` read them (``tests/trainer/test_examples.py``).

Wire format used (field numbers from ``tensorflow/core/example/{example,feature}.proto``):
``Example.features = 1``; ``Features.feature = 1`` (a map: entries with ``key = 1`` and
``value = 2``); ``Feature.bytes_list = 1``, ``float_list = 2``, ``int64_list = 3``; each list's
``value = 1`` (floats and int64s packed).

The files are TFRecord files written here too (:class:`TFRecordFile`): each record framed by its
length and two masked CRC32C checksums, the checksums from ``google-crc32c``'s compiled extension.
So the whole prep stage runs without importing TensorFlow, which alone takes about 2 of a digits
prep's 3.5 s. The files are byte for byte what ``tf.io.TFRecordWriter`` writes
(``tests/trainer/test_prep.py``).
"""

import struct

import google_crc32c

from trainer.errors import BadInput

#: Tag byte of a length-delimited field number 1, 2 and 3 (wire type 2).
_LEN1, _LEN2, _LEN3 = b"\x0a", b"\x12", b"\x1a"


def varint(value):
    """The base-128 varint encoding of a non-negative integer."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(tag, payload):
    return tag + varint(len(payload)) + payload


def _map_entry(name, feature):
    """One ``Features.feature`` map entry (itself field 1 of ``Features``)."""
    entry = _delimited(_LEN1, name.encode("utf-8")) + _delimited(_LEN2, feature)
    return _delimited(_LEN1, entry)


def int64_feature(value):
    """A ``Feature`` holding one int64 (packed ``Int64List``)."""
    return _delimited(_LEN3, _delimited(_LEN1, varint(value)))


def bytes_feature(value):
    """A ``Feature`` holding one bytes value (``BytesList``)."""
    return _delimited(_LEN1, _delimited(_LEN1, value))


def bytes_list_feature(values):
    """A ``Feature`` holding the bytes ``values`` (``BytesList``; bytes are not packed)."""
    return _delimited(_LEN1, b"".join(_delimited(_LEN1, value) for value in values))


def float_feature(packed):
    """A ``Feature`` holding the little-endian float32 values ``packed`` (``FloatList``)."""
    return _delimited(_LEN2, _delimited(_LEN1, packed))


class ExampleEncoder(object):
    """Encodes ``(value_bytes, label_id, key)`` rows of one data set as serialized Examples.

    ``kind`` is ``"floats"`` (``value_bytes`` = little-endian float32 values, stored as the
    ``features`` float list) or ``"image"`` (``value_bytes`` = raw uint8 pixels, stored as the
    ``image`` bytes value). Every row of a data set has the same value size, so the value entry's
    framing is computed once, from the first row.
    """

    def __init__(self, kind):
        if kind not in ("floats", "image"):
            raise ValueError("kind must be 'floats' or 'image'. Received: kind=%r" % (kind,))
        self._build = float_feature if kind == "floats" else bytes_feature
        self._name = "features" if kind == "floats" else "image"
        self._value_size = None
        self._value_head = b""
        self._labels = {}
        self._key_heads = {}
        self._example_heads = {}

    def _frame_value(self, size):
        # Encode a zero-filled value once and keep the framing in front of it: the framing
        # depends only on the value's length.
        entry = _map_entry(self._name, self._build(b"\0" * size))
        self._value_head, self._value_size = entry[:len(entry) - size], size

    def _label_entry(self, label_id):
        entry = self._labels.get(label_id)
        if entry is None:
            entry = self._labels[label_id] = _map_entry("label", int64_feature(label_id))
        return entry

    def _key_head(self, size):
        head = self._key_heads.get(size)
        if head is None:
            entry = _map_entry("key", bytes_feature(b"\0" * size))
            head = self._key_heads[size] = entry[:len(entry) - size]
        return head

    def _example_head(self, size):
        head = self._example_heads.get(size)
        if head is None:
            head = self._example_heads[size] = _LEN1 + varint(size)
        return head

    def encode(self, value_bytes, label_id, key, texts=None):
        """One serialized ``tf.train.Example``; ``key`` is text or bytes (UTF-8). ``texts``, the
        row's categorical cells (text), become the ``categories`` bytes list."""
        if len(value_bytes) != self._value_size:
            self._frame_value(len(value_bytes))
        if not isinstance(key, bytes):
            key = key.encode("utf-8")
        parts = [self._value_head, value_bytes, self._label_entry(label_id), self._key_head(len(key)), key]
        if texts is not None:
            parts.append(_map_entry("categories", bytes_list_feature([t.encode("utf-8") for t in texts])))
        body = b"".join(parts)
        return self._example_head(len(body)) + body


_LENGTH = struct.Struct("<Q")
_CHECKSUM = struct.Struct("<I")
#: Added to the rotated CRC, as TensorFlow's ``crc32c::Mask`` does: a plain CRC computed over
#: data that itself embeds CRCs is weak, so TFRecord stores every checksum masked.
_MASK_DELTA = 0xA282EAD8


def masked_crc32c(data):
    """TFRecord's checksum of ``data``: its CRC32C rotated right by 15 bits plus ``_MASK_DELTA``."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def tfrecord(data):
    """``data`` framed as one TFRecord: length (uint64 LE), its checksum, the data, its checksum."""
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CHECKSUM.pack(masked_crc32c(length)), data,
                     _CHECKSUM.pack(masked_crc32c(data))))


class TFRecordFile(object):
    """A TFRecord file written without TensorFlow: :meth:`write` serialized records, then :meth:`close`.

    Uncompressed, as ``tf.io.TFRecordWriter(path)`` writes it and ``tf.data.TFRecordDataset(path)``
    reads it; the format has no file header or footer, only the framed records.
    """

    def __init__(self, path):
        self._handle = open(path, "wb")

    def write(self, records):
        """Append the serialized records (bytes each), framed, in one write."""
        self._handle.write(b"".join([tfrecord(record) for record in records]))

    def close(self):
        """Flush and close the file."""
        self._handle.close()


def read_tfrecords(path, batch=1000):
    """Yield lists of up to ``batch`` serialized records of a TFRecord file, without TensorFlow.

    The framing is :func:`tfrecord`'s. The CRCs are not checked: this reads only the parts sharded
    prep committed in this run (``_SUCCESS`` written after them, :mod:`trainer.prep_merge`); a
    truncated record still raises :class:`~trainer.errors.BadInput`.
    """
    records = []
    with open(path, "rb") as handle:
        while True:
            head = handle.read(12)
            if not head:
                break
            if len(head) < 12:
                raise BadInput("%s: truncated TFRecord header" % path)
            (length,) = _LENGTH.unpack(head[:8])
            data = handle.read(length)
            if len(data) < length or len(handle.read(4)) < 4:
                raise BadInput("%s: truncated TFRecord" % path)
            records.append(data)
            if len(records) >= batch:
                yield records
                records = []
    if records:
        yield records
