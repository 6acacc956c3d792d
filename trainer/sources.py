"""Reading and validating the raw inputs of the prep stage: CSV files and image folders.

Every problem raises :class:`~trainer.errors.BadInput` naming the file, the line or image and
what was expected. Examples are returned as ``(key, value, label_id)`` tuples where ``key`` is the
split key (the ``data.key`` column, else file name + row text; for images the relative path).
"""

import collections
import csv
import difflib
import math
import os

from trainer import columns, contract, partitions
from trainer.errors import BadInput

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")


def input_root(config):
    """The absolute input path: ``paths.data`` joined with ``data.path``; must exist."""
    data = config["data"]
    if not data["path"]:
        raise BadInput("config field data.path is missing: the CSV file, CSV folder or image "
                       "folder relative to paths.data (%s)" % config["paths"]["data"])
    rel = os.path.normpath(data["path"])
    if os.path.isabs(rel) or rel == ".." or rel.startswith(".." + os.sep):
        raise BadInput("data.path %r must be relative to paths.data (%s) and stay inside it"
                       % (data["path"], config["paths"]["data"]))
    path = os.path.join(config["paths"]["data"], rel)
    if not os.path.exists(path):
        raise BadInput("data.path %r does not exist (looked for %s)" % (data["path"], path))
    return path


def input_files(config):
    """The sorted input files as ``(relative_path, absolute_path)`` pairs.

    Tables: the file itself (relative path = its name) or every ``*.csv`` (CSV) or ``*.parquet``
    (Parquet) file in the folder; with ``data.window_days``, those of the window's date partitions
    (:mod:`trainer.partitions`). Images: every PNG/JPEG inside a class sub-folder, relative to the
    image folder.
    """
    root = input_root(config)
    if partitions.enabled(config["data"]):
        return partitions.window_files(root, config["data"], config["run"].get(contract.WINDOW_END_KEY))
    if config["data"]["format"] in contract.TABULAR_FORMATS:
        if os.path.isfile(root):
            return [(os.path.basename(root), root)]
        extension = partitions.extension(config["data"])
        names = partitions.table_names(root, extension)
        if not names:
            raise BadInput("data.path %s is a folder without any *%s file" % (root, extension))
        return [(n, os.path.join(root, n)) for n in names]
    if not os.path.isdir(root):
        raise BadInput("data.path %s must be a folder with one sub-folder per class "
                       "(data.format is images)" % root)
    files = []
    for rel, path, _ in _walk_images(root):
        files.append((rel, path))
    return files


def _walk_images(root):
    """Yield ``(relative_path, absolute_path, class_name)`` for each image file, sorted."""
    for class_name in _class_folders(root):
        class_dir = os.path.join(root, class_name)
        for dirpath, dirnames, filenames in os.walk(class_dir):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.startswith(".") or not name.lower().endswith(IMAGE_EXTENSIONS):
                    continue
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root).replace(os.sep, "/"), path, class_name


def _class_folders(root):
    return sorted(n for n in os.listdir(root)
                  if not n.startswith(".") and os.path.isdir(os.path.join(root, n)))


# --- CSV ----------------------------------------------------------------------------------------

class TypesNeedScan(Exception):
    """A column whose type is inferred holds a cell that is not a number: the types need a scan
    of the train split (:func:`trainer.prep.scan_batch`) before the records are written."""


def _not_numeric(where, text, name, expected):
    return BadInput("%s: %r is not %s. Fix: correct the cell; if the text marks a missing value, add it "
                    "to data.na_values; if the column holds categories, set data.columns to "
                    "{%r: \"categorical\"}" % (where, text, expected, name))


def _parse_number(text, kind, where, name):
    """The float of a stripped, non-missing numeric cell; a text in a column still typed ``auto``
    raises :class:`TypesNeedScan`, in any other numeric column :class:`BadInput`."""
    if kind == "int":
        try:
            return float(int(text))
        except ValueError:
            raise _not_numeric(where, text, name, "an integer")
    try:
        number = float(text)
    except ValueError:
        if kind == "auto":
            raise TypesNeedScan()
        raise _not_numeric(where, text, name, "a number")
    if math.isnan(number) or math.isinf(number):
        raise BadInput("%s: %r is not a finite number. Fix: correct the cell; if it marks a missing "
                       "value, leave it empty or add the text to data.na_values" % (where, text))
    return number


def _read_rows(rel, path, progress=None):
    """Yield ``(line_number, cells)`` of the non-blank rows of one CSV file.

    ``progress`` (a :class:`~trainer.common.Progress`) counts the physical lines read.
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle, strict=True)
            counted = 0
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    row = None
                except csv.Error as error:
                    raise BadInput("%s line %d: malformed CSV row (%s)"
                                   % (rel, reader.line_num, error))
                if progress is not None:
                    progress.add(reader.line_num - counted)
                    counted = reader.line_num
                if row is None:
                    return
                if not row or all(cell.strip() == "" for cell in row):
                    continue
                yield reader.line_num, row
    except UnicodeDecodeError as error:
        raise BadInput("%s is not UTF-8 text (%s)" % (rel, error))


def _read_header(rel, path):
    """``(cells, line_number, data_offset)`` of a CSV file's header: its first non-blank row."""
    number = offset = 0
    try:
        with open(path, "rb") as handle:
            for raw in handle:
                number += 1
                offset += len(raw)
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
                try:
                    cells = next(csv.reader([text], strict=True), [])
                except csv.Error as error:
                    raise BadInput("%s line %d: malformed CSV row (%s)" % (rel, number, error))
                if any(cell.strip() for cell in cells):
                    return [cell.strip() for cell in cells], number, offset
    except UnicodeDecodeError as error:
        raise BadInput("%s is not UTF-8 text (%s)" % (rel, error))
    raise BadInput("%s is empty: expected a header row naming the columns" % rel)


#: Header columns an error lists in full; a wider header is shown by its ends. The message goes
#: to the task log, the task's error and any alert mailed with it, where thousands of names bury
#: the point.
HEADER_SHOWN = 12


def show_names(names):
    """Names (a header's columns, declared classes) for an error message: all of them, or their
    ends and a count, since the message is also the task's error and any alert's."""
    if len(names) <= HEADER_SHOWN:
        return ", ".join(repr(c) for c in names)
    ends = HEADER_SHOWN // 2
    return "%s, ... (%d more), %s" % (", ".join(repr(c) for c in names[:ends]), len(names) - 2 * ends,
                                      ", ".join(repr(c) for c in names[-ends:]))


def _missing_column(rel, column, field, header):
    """The error for a configured column the CSV header lacks: the header, the closest names, the fix."""
    close = difflib.get_close_matches(str(column), header, n=3)
    hint = " (close: %s)" % ", ".join(repr(c) for c in close) if close else ""
    fix = ("name only columns of the header in data.features" if field == "data.features"
           else "set %s to a column of the header" % field)
    return ("%s: column %r (%s) is not in the header, which has %d columns: %s. Fix: %s%s, or "
            "correct the file's header row" % (rel, column, field, len(header), show_names(header), fix, hint))


def _other_header(rel, line, cells, first_rel, header):
    """The error for a CSV file whose header is not the first file's: where they part, the fix."""
    at = next((i for i, (a, b) in enumerate(zip(cells, header)) if a != b), min(len(cells), len(header)))
    if at < min(len(cells), len(header)):
        where = "column %d is %r here and %r there" % (at + 1, cells[at], header[at])
    else:
        where = "%d columns here against %d there" % (len(cells), len(header))
    return ("%s line %d: the header differs from the header of %s (%s); every CSV file under data.path "
            "must have the same header. Fix: give the files one header row, or move this file out of "
            "data.path. This file's header: %s" % (rel, line, first_rel, where, show_names(cells)))


#: ``data.columns`` types as the parse kinds of the layout.
_KIND_OF_TYPE = {"numeric": "float", "categorical": "categorical", "boolean": "boolean"}


def _check_columns(rel, data, header):
    """``data.columns`` against the header: every named column exists and is not the label or key."""
    for name, kind in sorted((data.get("columns") or {}).items()):
        if name not in header:
            raise BadInput(_missing_column(rel, name, "data.columns", header))
        if name in (data["label"], data["key"]):
            raise BadInput("data.columns: %r is the %s column, not a feature. Fix: remove it from data.columns"
                           % (name, "label" if name == data["label"] else "key"))
        if kind not in contract.COLUMN_TYPES:
            raise BadInput("data.columns[%r]: %r is not a column type. Fix: use one of %s"
                           % (name, kind, ", ".join(contract.COLUMN_TYPES)))


def with_types(layout, types=None):
    """``layout`` with the parse kinds of ``types`` (``{name: kind}``, for its ``auto`` columns) and
    the derived fields: ``numeric`` and ``categorical`` (positions in ``index`` of the columns
    stored as floats and as texts), ``feature_types`` and ``final`` (no ``auto`` column left)."""
    index = [(col, (types or {}).get(name, kind) if kind == "auto" else kind, name)
             for col, kind, name in layout["index"]]
    return dict(layout, index=index, feature_types=[kind for _, kind, _ in index],
                numeric=[i for i, (_, kind, _) in enumerate(index) if kind != "categorical"],
                categorical=[i for i, (_, kind, _) in enumerate(index) if kind == "categorical"],
                final=all(kind != "auto" for _, kind, _ in index))


def csv_layout(config, files):
    """Check the CSV headers against the config; return the layout every row is read with.

    A dict: ``ncols``, ``index`` (``(column, kind, name)`` of each feature, in data set order;
    kinds ``float``, ``int``, ``boolean``, ``categorical``, or ``auto``: inferred, numeric until a
    train cell says otherwise), ``label`` and ``label_at``, ``key_at`` (None: the row text is the
    key), ``feature_names``, ``sources`` (where each type comes from), ``ignored``, ``na`` (cell
    texts read as missing), ``drop_missing_labels``, ``unit`` (what a row number counts: ``line``),
    ``starts``: ``{relative path: (byte offset, line number)}`` of each file's first data line, and
    the fields of :func:`with_types`.
    """
    header, starts = None, {}
    for rel, path in files:
        cells, line, offset = _read_header(rel, path)
        starts[rel] = (offset, line + 1)
        if header is not None:
            if cells != header:
                raise BadInput(_other_header(rel, line, cells, files[0][0], header))
            continue
        header = cells
        first = (rel, " line %d" % line)
    return _table_layout(config["data"], first, header, starts, "line")


def _table_layout(data, first, header, starts, unit):
    """The layout of a table whose columns are ``header`` (checked against ``data``), first read
    from ``first``: ``(relative path, where in it the header is)``."""
    rel, at = first
    label, key_col, declared = data["label"], data["key"], data["features"]
    defaults = contract.section_defaults("data")
    overrides = data.get("columns") or {}
    ignored = sorted(name for name, kind in overrides.items() if kind == "ignore")
    if len(set(header)) != len(header):
        twice = sorted(name for name, count in collections.Counter(header).items() if count > 1)
        names = ", ".join(repr(c) for c in twice[:HEADER_SHOWN])
        if len(twice) > HEADER_SHOWN:
            names += " and %d more" % (len(twice) - HEADER_SHOWN)
        raise BadInput("%s%s: the header names %s more than once (%d columns). Fix: give each "
                       "column of the header row its own name" % (rel, at, names, len(header)))
    for column, field in ((label, "data.label"), (key_col, "data.key")):
        if column is not None and column not in header:
            raise BadInput(_missing_column(rel, column, field, header))
    _check_columns(rel, data, header)
    if declared is None:
        declared = [{"name": c, "type": "auto"} for c in header
                    if c not in (label, key_col) and c not in ignored]
        if not declared:
            raise BadInput("%s: no feature columns besides the label %r. Fix: add feature columns, or "
                           "type fewer of them \"ignore\" in data.columns" % (rel, label))
    else:
        declared = [f for f in declared if f["name"] not in ignored]
        if not declared:
            raise BadInput("data.columns types every column of data.features \"ignore\". Fix: keep "
                           "at least one feature")
    for feat in declared:
        if feat["name"] not in header:
            raise BadInput(_missing_column(rel, feat["name"], "data.features", header))
    index, sources = [], []
    for feat in declared:
        kind = _KIND_OF_TYPE.get(overrides.get(feat["name"]), feat["type"])
        index.append((header.index(feat["name"]), kind, feat["name"]))
        sources.append("data.columns" if feat["name"] in overrides
                       else "inferred" if kind == "auto" else "data.features")
    na = frozenset([""] + [str(v).strip() for v in (data.get("na_values", defaults["na_values"]) or ())])
    return with_types({"ncols": len(header), "label": label, "label_at": header.index(label),
                       "key_at": header.index(key_col) if key_col is not None else None,
                       "index": index, "feature_names": [f["name"] for f in declared],
                       "sources": sources, "ignored": ignored, "na": na,
                       "drop_missing_labels": bool(data.get("drop_missing_labels")), "starts": starts,
                       "unit": unit})


def csv_batches(files, layout, scans, chunk_bytes, batch_rows=20000):
    """Cut the CSV inputs into batches that :func:`parse_batch` reads independently, in order.

    ``scans`` holds, per relative path, what prep's fingerprint pass saw: ``quoted`` (the file
    has a ``"``) and ``marks``, ``(byte offset just after a newline, newlines before it)`` pairs.
    A file without quotes is cut at those newlines into byte ranges of about ``chunk_bytes``
    (``("bytes", rel, path, start, end, first_line)``): the parse workers read them themselves.
    A quoted value may hold a newline, so a quoted file is read here, row by row, with the csv
    module, and sent as ``("rows", rel, [(line, cells), ...])`` batches of ``batch_rows`` rows.
    """
    for rel, path in files:
        offset, first_line = layout["starts"][rel]
        scan = scans[rel]
        if scan["quoted"]:
            rows = []
            for line, cells in _read_rows(rel, path):
                if line < first_line:
                    continue  # the header, checked already
                rows.append((line, cells))
                if len(rows) >= batch_rows:
                    yield ("rows", rel, rows)
                    rows = []
            if rows:
                yield ("rows", rel, rows)
            continue
        start, start_line = offset, first_line
        for mark, newlines in scan["marks"]:
            if mark - start >= chunk_bytes:
                yield ("bytes", rel, path, start, mark, start_line)
                start, start_line = mark, newlines + 1
        if scan["bytes"] > start:
            yield ("bytes", rel, path, start, scan["bytes"], start_line)


# --- Parquet -------------------------------------------------------------------------------------

#: Rows per Parquet batch: what one parse worker holds and what the reader holds while it reads.
PARQUET_BATCH_ROWS = 20000


def _arrow_kind(arrow_type):
    """The layout kind of a Parquet column of ``arrow_type``: numbers ``float``, booleans
    ``boolean``, texts ``categorical``, an all-null column ``auto``; None for any other type."""
    import pyarrow.types as at

    if at.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if at.is_integer(arrow_type) or at.is_floating(arrow_type) or at.is_decimal(arrow_type):
        return "float"
    if at.is_boolean(arrow_type):
        return "boolean"
    if at.is_string(arrow_type) or at.is_large_string(arrow_type):
        return "categorical"
    if at.is_null(arrow_type):
        return "auto"
    return None


def _parquet_schema(rel, path):
    import pyarrow.parquet as pq

    try:
        with pq.ParquetFile(path) as handle:
            return handle.schema_arrow, handle.metadata.num_rows
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
        raise BadInput("%s is not a readable Parquet file (%s). Fix: write it with a Parquet writer "
                       "(e.g. pyarrow or pandas' to_parquet), or move it out of data.path" % (rel, error))


def parquet_layout(config, files):
    """Check the Parquet files' schemas against the config; return the layout their rows are
    read with: :func:`csv_layout`'s, over the columns a run reads (``read``: label, key and
    features, in that order; ignored columns are never read), with ``rows`` (``{relative path:
    row count}``) and ``unit`` ``row``. A feature column whose type is inferred takes it from its
    Parquet type: numbers numeric, booleans boolean, texts categorical."""
    data = config["data"]
    schema, counts = None, {}
    for rel, path in files:
        found, counts[rel] = _parquet_schema(rel, path)
        if schema is None:
            schema = found
        elif not found.equals(schema, check_metadata=False):
            raise BadInput(_other_schema(rel, found, files[0][0], schema))
    header = list(schema.names)
    layout = _table_layout(data, (files[0][0], ""), header, {rel: (0, 1) for rel in counts}, "row")
    read = [data["label"]] + ([data["key"]] if data["key"] is not None else [])
    read += [name for _, _, name in layout["index"] if name not in read]
    index, sources = [], list(layout["sources"])
    for j, (_, kind, name) in enumerate(layout["index"]):
        arrow_type = schema.field(name).type
        found = _arrow_kind(arrow_type)
        if found is None:
            raise BadInput("%s column %r: its Parquet type %s cannot be a feature (numbers, booleans and "
                           "texts can). Fix: set data.columns to {%r: \"ignore\"}, or store the column as "
                           "numbers or texts" % (files[0][0], name, arrow_type, name))
        if kind == "auto" and found != "auto":
            kind = found
        index.append((read.index(name), kind, name))
    for column, field in ((data["label"], "data.label"), (data["key"], "data.key")):
        if column is not None and _arrow_kind(schema.field(column).type) in (None, "auto"):
            raise BadInput("%s column %r (%s): its Parquet type is %s; it needs numbers or texts. Fix: set "
                           "%s to a column of numbers or texts" % (files[0][0], column, field,
                                                                   schema.field(column).type, field))
    return with_types(dict(layout, index=index, sources=sources, ncols=len(read), read=read, label_at=0,
                           key_at=1 if data["key"] is not None else None, rows=counts))


def _other_schema(rel, found, first_rel, schema):
    """The error for a Parquet file whose columns are not the first file's: where they part, the fix."""
    theirs = {f.name: f.type for f in schema}
    mine = {f.name: f.type for f in found}
    parts = ["column %r is %s here and %s there" % (n, mine[n], theirs[n])
             for n in mine if n in theirs and mine[n] != theirs[n]]
    parts += ["column %r is only here" % n for n in mine if n not in theirs]
    parts += ["column %r is only there" % n for n in theirs if n not in mine]
    if not parts:
        parts = ["the columns are in another order"]
    return ("%s: its columns differ from those of %s (%s); every Parquet file under data.path must have "
            "the same columns and types. Fix: write the files with one schema, or move this file out of "
            "data.path" % (rel, first_rel, "; ".join(parts[:HEADER_SHOWN])))


def parquet_batches(files, layout, batch_rows=PARQUET_BATCH_ROWS):
    """The Parquet inputs as batches of at most ``batch_rows`` rows, in order: ``("arrow", rel,
    first row number, record batch)`` of the ``read`` columns. Files are read a batch at a time
    (``ParquetFile.iter_batches``): the reader holds one row group's column chunks of the columns
    read and one batch, whatever the file's size.

    Not pyarrow's buffered stream (``buffer_size``), which would hold a page per column instead of
    a row group: pyarrow 17 fails with "Cannot shrink read buffer if buffered data remains" on some
    valid files with it (small pages without a dictionary, buffers under 1 MiB)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for rel, path in files:
        first = 1
        with pq.ParquetFile(path) as handle:
            for table in handle.iter_batches(batch_size=batch_rows, columns=layout["read"]):
                # in the layout's column order, whatever order the file keeps them in
                table = pa.RecordBatch.from_arrays([table.column(n) for n in layout["read"]], layout["read"])
                yield ("arrow", rel, first, table)
                first += table.num_rows


def parquet_batch_count(layout, batch_rows=PARQUET_BATCH_ROWS):
    """How many batches :func:`parquet_batches` yields (at least; row groups may end batches early)."""
    return sum(int(math.ceil(rows / float(batch_rows))) for rows in layout["rows"].values())


def _arrow_numbers(column):
    """``(values, missing)`` of a number or boolean Arrow column (not dictionary-encoded): its cells
    as a numpy array (nulls as zero or false) and the mask of its missing cells (nulls and NaNs)."""
    import pyarrow.types as at

    missing = column.is_null(nan_is_null=True).to_numpy(zero_copy_only=False)
    values = column.fill_null(False if at.is_boolean(column.type) else 0).to_numpy(zero_copy_only=False)
    return values, missing


def _plain_numbers(arrow_type):
    """Whether :func:`_arrow_numbers` reads a column of ``arrow_type``: integers, float32 and float64
    (the Python floats of a float16 column or the exact values of a decimal one it would not keep)."""
    import pyarrow.types as at

    return at.is_integer(arrow_type) or at.is_float32(arrow_type) or at.is_float64(arrow_type)


def _arrow_texts(column):
    """The cells of an Arrow column as the texts a CSV file would hold: numbers in their shortest
    exact form, booleans ``true``/``false``, ``""`` for a null (and for a float NaN, which pandas
    writes for a missing value)."""
    import numpy as np
    import pyarrow.types as at

    if _plain_numbers(column.type) or at.is_boolean(column.type):
        values, missing = _arrow_numbers(column)
        if at.is_boolean(column.type):
            texts = np.where(values, "true", "false").tolist()
        else:  # numpy's tolist gives Python ints and floats: their str and repr are the texts
            texts = list(map(repr if at.is_floating(column.type) else str, values.tolist()))
        for r in np.flatnonzero(missing):
            texts[r] = ""
        return texts
    if at.is_string(column.type) or at.is_large_string(column.type):
        return column.fill_null("").to_numpy(zero_copy_only=False).tolist()  # far quicker than to_pylist
    kind = column.type.value_type if at.is_dictionary(column.type) else column.type
    values = column.to_pylist()
    if at.is_boolean(kind):
        return ["" if v is None else "true" if v else "false" for v in values]
    if at.is_floating(kind):
        return ["" if v is None or v != v else repr(float(v)) for v in values]
    if at.is_string(kind) or at.is_large_string(kind):
        return ["" if v is None else v for v in values]
    return ["" if v is None else str(v) for v in values]


def arrow_rows(table, first_row):
    """``[(row number, cells)]`` of a record batch of :func:`parquet_batches` (cells in its column
    order, as texts: :func:`_arrow_texts`); row numbers count from 1 in each file."""
    cells = [_arrow_texts(table.column(i)) for i in range(table.num_columns)]
    return [(first_row + r, list(row)) for r, row in enumerate(zip(*cells))]


class Rows(object):
    """One parsed batch: ``values`` float64 ``[n, numeric columns]`` (NaN: missing), ``texts``
    (per row, the stripped texts of the categorical columns, ``""``: missing; None without such
    columns), ``labels`` (stripped label text), ``keys`` (split keys), ``lines`` (line numbers),
    ``physical_lines`` (lines it covered) and ``dropped`` (line numbers of rows dropped for a
    missing label, with ``data.drop_missing_labels``)."""

    def __init__(self, values, texts, labels, keys, lines, physical_lines, dropped=()):
        self.values, self.texts, self.labels, self.keys, self.lines = values, texts, labels, keys, lines
        self.physical_lines, self.dropped = physical_lines, list(dropped)


def _decode(batch):
    """A batch's rows: ``("rows", rel, [(line, cells)], physical)`` or, for an unquoted byte range
    the batch parser may take, ``("lines", rel, lines, numbers, physical)``."""
    if batch[0] == "arrow":
        _, rel, first_row, table = batch
        return "rows", rel, arrow_rows(table, first_row), table.num_rows
    if batch[0] == "rows":
        _, rel, rows = batch
        return "rows", rel, rows, rows[-1][0] - rows[0][0] + 1
    _, rel, path, start, end, first_line = batch
    with open(path, "rb") as handle:
        handle.seek(start)
        blob = handle.read(end - start)
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadInput("%s is not UTF-8 text (%s)" % (rel, error))
    physical = text.count("\n") + (0 if text.endswith("\n") else 1)
    if "\r" in text:
        if text.count("\r") != text.count("\r\n"):  # old Mac line ends: let csv split them
            reader = csv.reader(text.splitlines(True), strict=True)
            rows = [(first_line + reader.line_num - 1, row) for row in reader]
            return "rows", rel, [(n, r) for n, r in rows if _filled(r)], physical
        text = text.replace("\r\n", "\n")
    raw = text.split("\n")
    if raw[-1] == "":
        raw.pop()
    lines = [line for line in raw if _has_text(line)]
    if len(lines) == len(raw):
        numbers = list(range(first_line, first_line + len(raw)))
    else:
        numbers = [first_line + i for i, line in enumerate(raw) if _has_text(line)]
    return "lines", rel, lines, numbers, physical


def batch_rows(batch):
    """``(rel, [(line, cells)], physical_lines)`` of one batch of :func:`csv_batches`, unparsed."""
    decoded = _decode(batch)
    if decoded[0] == "rows":
        return decoded[1], decoded[2], decoded[3]
    _, rel, lines, numbers, physical = decoded
    return rel, [(n, line.split(",")) for n, line in zip(numbers, lines)], physical


def parse_batch(batch, layout):
    """Parse and validate one batch of :func:`csv_batches` into :class:`Rows`.

    Rows are parsed a batch at a time (``numpy.loadtxt`` for the numeric columns); anything that
    parser refuses, or a wrong column count, a missing value or label, or a non-finite number,
    sends the batch through the row-by-row reader, which raises :class:`BadInput` naming the file,
    line and column (and accepts what it accepts, so both paths agree on every input). A Parquet
    batch (:func:`parquet_batches`) is parsed by :func:`_arrow_fast`, else row by row from its
    cell texts (:func:`arrow_rows`).
    """
    if batch[0] == "arrow":
        rows = _arrow_fast(batch[1], batch[2], batch[3], layout)
        if rows is not None:
            return rows
    decoded = _decode(batch)
    if decoded[0] == "rows":
        _, rel, rows, physical = decoded
        return _exact(rel, rows, layout, physical)
    _, rel, lines, numbers, physical = decoded
    rows = _fast(rel, lines, numbers, layout, physical)
    if rows is None:
        rows = _exact(rel, [(n, line.split(",")) for n, line in zip(numbers, lines)], layout,
                      physical)
    return rows


def _arrow_fast(rel, first_row, table, layout):
    """The Parquet batch parser: number and boolean columns go straight from Arrow to floats (nulls
    and NaNs missing, booleans 1.0 and 0.0: what their texts parse to), the other cells are their
    texts (:func:`_arrow_texts`). None when the batch needs the row-by-row reader: a column whose
    Parquet type its kind does not read (texts in a numeric column, fractions in an ``int`` one), an
    infinite number, a missing label, or ``data.na_values`` naming a text a number or boolean has."""
    import numpy as np
    import pyarrow.types as at

    na, index = layout["na"], layout["index"]
    if any(_number_text(text) for text in na):
        return None
    values = np.empty((table.num_rows, len(layout["numeric"])), dtype=np.float64)
    for i, j in enumerate(layout["numeric"]):
        col, kind, _ = index[j]
        column = table.column(col)
        if at.is_null(column.type):  # no value at all: every cell is missing
            values[:, i] = np.nan
            continue
        reads = {"boolean": at.is_boolean, "int": at.is_integer}.get(kind, _plain_numbers)
        if not reads(column.type):
            return None
        numbers, missing = _arrow_numbers(column)
        values[:, i] = numbers
        values[missing, i] = np.nan
    if np.isinf(values).any():
        return None
    texts = {}

    def cells(col):
        if col not in texts:
            texts[col] = _arrow_texts(table.column(col))
        return texts[col]
    labels = [text.strip() for text in cells(layout["label_at"])]
    if na.intersection(labels):
        return None
    categories = None
    if layout["categorical"]:
        found = [[text.strip() for text in cells(index[j][0])] for j in layout["categorical"]]
        categories = [[text if text not in na else "" for text in row] for row in zip(*found)]
    if layout["key_at"] is None:
        keys = ["%s:%s" % (rel, ",".join(row)) for row in zip(*map(cells, range(table.num_columns)))]
    else:
        keys = cells(layout["key_at"])
    return Rows(values, categories, labels, keys, list(range(first_row, first_row + table.num_rows)),
                table.num_rows)


def _number_text(text):
    """Whether ``text`` (a ``data.na_values`` entry) is the text of a number or boolean cell of a
    Parquet file (:func:`_arrow_texts`: ``true``, ``-12``, ``0.5``), which it would make missing."""
    if text in ("true", "false") or text.lstrip("-").isdigit():
        return True
    try:
        return text == repr(float(text))
    except ValueError:
        return False


#: First characters of a line that may still be blank (empty cells only); any other first
#: character means the line has a value, which saves looking at the rest of it.
_MAYBE_BLANK = frozenset(["", ","] + [chr(c) for c in range(0x10000) if chr(c).isspace()])


def _has_text(line):
    """Whether an unquoted CSV line has a non-blank cell (the csv reader skips the others)."""
    return line[:1] not in _MAYBE_BLANK or bool(line.replace(",", "").strip())


def _filled(cells):
    return bool(cells) and any(cell.strip() for cell in cells)


def _fast(rel, lines, numbers, layout, physical):
    """The batch parser; None when the batch needs the row-by-row reader."""
    import warnings

    import numpy as np

    ncols, index, na = layout["ncols"], layout["index"], layout["na"]
    if any(line.count(",") != ncols - 1 for line in lines):
        return None
    numeric = layout["numeric"]
    values = np.empty((len(lines), len(numeric)), dtype=np.float64)
    for kinds, dtype in ((("float", "auto"), np.float64), (("int",), np.int64)):
        picked = [(i, index[j][0]) for i, j in enumerate(numeric) if index[j][1] in kinds]
        if not picked or not lines:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # e.g. numpy parsing "3.0" as an int column
                part = np.loadtxt(lines, delimiter=",", comments=None, dtype=dtype, ndmin=2,
                                  usecols=[col for _, col in picked])
        except (ValueError, OverflowError, Warning):
            return None
        values[:, [i for i, _ in picked]] = part
    texts = None
    booleans = [(i, index[j][0]) for i, j in enumerate(numeric) if index[j][1] == "boolean"]
    if booleans or layout["categorical"]:
        cells = [line.split(",") for line in lines]
        for i, col in booleans:
            for r, row in enumerate(cells):
                value = columns.boolean_value(row[col].strip())
                if value is None:  # a missing value or a bad cell: the row reader tells which
                    return None
                values[r, i] = value
        cat_cols = [index[j][0] for j in layout["categorical"]]
        texts = [[row[col].strip() for col in cat_cols] for row in cells]
        if na.intersection(text for row in texts for text in row):
            texts = [[text if text not in na else "" for text in row] for row in texts]
    if not np.isfinite(values).all():
        return None
    at = layout["label_at"]
    if at == ncols - 1:
        labels = [line[line.rfind(",") + 1:].strip() for line in lines]
    else:
        labels = [line.split(",")[at].strip() for line in lines]
    if na.intersection(labels):
        return None
    if layout["key_at"] is None:
        keys = ["%s:%s" % (rel, line) for line in lines]
    else:
        keys = [line.split(",")[layout["key_at"]] for line in lines]
    return Rows(values, texts, labels, keys, numbers, physical)


def missing_label(rel, line, column, text, unit="line"):
    """The error for a row without a label: where, and the two fixes. ``unit``: what ``line``
    counts (``line`` in a CSV file, ``row`` in a Parquet file)."""
    what = "empty label" if text == "" else "missing label (%r is in data.na_values)" % text
    return BadInput("%s %s %d column %r: %s. Fix: correct the row, or set data.drop_missing_labels to "
                    "drop (and count) the rows without a label" % (rel, unit, line, column, what))


def _exact(rel, rows, layout, physical):
    """The row-by-row reader: ``rows`` are ``(line, cells)``; raises at the first bad row."""
    import numpy as np

    ncols, label, index, na = layout["ncols"], layout["label"], layout["index"], layout["na"]
    unit = layout.get("unit", "line")
    numeric = [index[j] for j in layout["numeric"]]
    categorical = [index[j][0] for j in layout["categorical"]]
    nan = float("nan")
    values, texts, labels, keys, lines, dropped = [], [], [], [], [], []
    for line, row in rows:
        if len(row) != ncols:
            raise BadInput("%s line %d: expected %d columns as in the header, got %d"
                           % (rel, line, ncols, len(row)))
        raw_label = row[layout["label_at"]].strip()
        if raw_label in na:
            if layout["drop_missing_labels"]:
                dropped.append(line)
                continue
            raise missing_label(rel, line, label, raw_label, unit)
        parsed = []
        for col, kind, name in numeric:
            text = row[col].strip()
            if text in na:
                parsed.append(nan)
            elif kind == "boolean":
                value = columns.boolean_value(text)
                if value is None:
                    raise BadInput("%s %s %d column %r: %r is not a boolean (true, false, yes or no, any "
                                   "case). Fix: correct the cell; if it marks a missing value, add it to "
                                   "data.na_values; if the column holds categories, set data.columns to "
                                   "{%r: \"categorical\"}" % (rel, unit, line, name, text, name))
                parsed.append(value)
            else:
                parsed.append(_parse_number(text, kind, "%s %s %d column %r" % (rel, unit, line, name), name))
        values.append(parsed)
        if categorical:
            texts.append([t if t not in na else "" for t in (row[col].strip() for col in categorical)])
        labels.append(raw_label)
        keys.append("%s:%s" % (rel, ",".join(row)) if layout["key_at"] is None
                    else row[layout["key_at"]])
        lines.append(line)
    matrix = np.array(values, dtype=np.float64).reshape(len(values), len(numeric))
    return Rows(matrix, texts if categorical else None, labels, keys, lines, physical, dropped)


def label_mapping(distinct):
    """``(class_names, ids)`` from the distinct label texts of a whole data set.

    Integer labels are class ids 0..max (``ids`` is None: a label's id is its value); any other
    labels are sorted names, ``ids`` maps each to its index.
    """
    try:
        ints = [int(v) for v in distinct]
    except ValueError:
        names = sorted(distinct)
        return names, {name: i for i, name in enumerate(names)}
    return [str(i) for i in range(max(ints) + 1)], None


def declared_classes(data):
    """``data.classes`` as a list (class id = position), or None when the data names its classes."""
    classes = data.get("classes")
    return list(classes) if classes is not None else None


def undeclared_label(rel, line, column, label, classes, unit="line"):
    """The error for a label that ``data.classes`` does not list: where it is, the list, the fix."""
    close = difflib.get_close_matches(label, classes, n=3)
    hint = " (close: %s)" % ", ".join(repr(c) for c in close) if close else ""
    return ("%s %s %d column %r: label %r is not one of the %d classes of data.classes: %s%s. Fix: add "
            "it to data.classes (at the end keeps the other classes' ids), or correct the row"
            % (rel, unit, line, column, label, len(classes), show_names(classes), hint))


def check_classes(class_names, counts, where):
    """Refuse a data set with no example, or with examples of one class only."""
    if sum(counts) == 0:
        raise BadInput("the data set is empty: %s has no examples" % where)
    present = [n for n, c in zip(class_names, counts) if c]
    if len(present) < 2:
        raise BadInput("the data set has a single class (%s) in %s: classification needs at "
                       "least two classes" % (", ".join(map(repr, present)), where))


# --- images -------------------------------------------------------------------------------------

def load_image(path, rel, height, width, channels):
    """Decode an image file to a uint8 ``[height, width, channels]`` numpy array."""
    import numpy as np
    from PIL import Image

    resample = getattr(Image, "Resampling", Image).BILINEAR
    try:
        with Image.open(path) as img:
            img.load()
            img = img.convert("L" if channels == 1 else "RGB")
            if img.size != (width, height):
                img = img.resize((width, height), resample)
            array = np.asarray(img, dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise BadInput("image %s cannot be read (%s): expected a PNG or JPEG file"
                       % (rel, error))
    return array.reshape(height, width, channels)


def read_images(config, progress=None):
    """Read and validate an image folder (one sub-folder per class).

    ``progress`` (a :class:`~trainer.common.Progress`) counts the images read.

    Returns ``class_names`` and ``examples`` (``(relative_path, uint8 array, label_id)``).
    """
    data = config["data"]
    root = input_root(config)
    height, width = data["image_size"]
    folders = _class_folders(root)
    if not folders:
        raise BadInput("the data set is empty: image folder %s has no class sub-folders" % root)
    declared = declared_classes(data)
    if declared is None:
        class_names = folders
    else:
        class_names = declared
        other = [name for name in folders if name not in class_names]
        if other:
            raise BadInput("image folder %s has sub-folder(s) %s that data.classes does not list (its %d "
                           "classes: %s). Fix: add them to data.classes (at the end keeps the other classes' "
                           "ids), or move them out of %s"
                           % (root, show_names(other), len(class_names), show_names(class_names), root))
    ids = {name: i for i, name in enumerate(class_names)}
    examples = []
    counts = [0] * len(class_names)
    for rel, path, class_name in _walk_images(root):
        array = load_image(path, rel, height, width, data["channels"])
        examples.append((rel, array, ids[class_name]))
        counts[ids[class_name]] += 1
        if progress is not None:
            progress.add()
    check_classes(class_names, counts, root)
    # a declared class may have no images tonight; a folder of the data's own making may not
    empty = [n for n, c in zip(class_names, counts) if not c and declared is None]
    if empty:
        raise BadInput("class folder(s) %s in %s contain no PNG or JPEG images"
                       % (", ".join(empty), root))
    return {"class_names": class_names, "examples": examples}
