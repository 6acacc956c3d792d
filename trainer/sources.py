"""Reading and validating the raw inputs of the prep stage: CSV files and image folders.

Every problem raises :class:`~trainer.errors.BadInput` naming the file, the line or image and
what was expected. Examples are returned as ``(key, value, label_id)`` tuples where ``key`` is the
split key (the ``data.key`` column, else file name + row text; for images the relative path).
"""

import csv
import math
import os

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

    CSV: the file itself (relative path = its name) or every ``*.csv`` in the folder. Images:
    every PNG/JPEG inside a class sub-folder, relative to the image folder.
    """
    root = input_root(config)
    if config["data"]["format"] == "csv":
        if os.path.isfile(root):
            return [(os.path.basename(root), root)]
        names = sorted(n for n in os.listdir(root)
                       if n.lower().endswith(".csv") and os.path.isfile(os.path.join(root, n)))
        if not names:
            raise BadInput("data.path %s is a folder without any *.csv file" % root)
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


def _check_classes(class_names, counts, where):
    if sum(counts) == 0:
        raise BadInput("the data set is empty: %s has no examples" % where)
    present = [n for n, c in zip(class_names, counts) if c]
    if len(present) < 2:
        raise BadInput("the data set has a single class (%s) in %s: classification needs at "
                       "least two classes" % (", ".join(map(repr, present)), where))


# --- CSV ----------------------------------------------------------------------------------------

def _parse_number(text, kind, where):
    value = text.strip()
    if value == "":
        raise BadInput("%s: empty value, expected %s" % (where, "an integer" if kind == "int"
                                                           else "a number"))
    if kind == "int":
        try:
            return float(int(value))
        except ValueError:
            raise BadInput("%s: %r is not an integer" % (where, text))
    try:
        number = float(value)
    except ValueError:
        raise BadInput("%s: %r is not a number" % (where, text))
    if math.isnan(number) or math.isinf(number):
        raise BadInput("%s: %r is not a finite number" % (where, text))
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


def read_csv(config, files, progress=None):
    """Read and validate the CSV inputs (``progress`` counts the lines read, if given).

    Returns a dict with ``feature_names``, ``feature_types``, ``class_names`` and ``examples``
    (``(key, [float, ...], label_id)``).
    """
    data = config["data"]
    label, key_col, declared = data["label"], data["key"], data["features"]
    header = None
    rows = []  # (key, features, raw label, where)
    for rel, path in files:
        it = _read_rows(rel, path, progress)
        first = next(it, None)
        if first is None:
            raise BadInput("%s is empty: expected a header row naming the columns" % rel)
        file_header = [c.strip() for c in first[1]]
        if header is None:
            header = file_header
            if len(set(header)) != len(header):
                raise BadInput("%s line %d: duplicate column names in header %s"
                               % (rel, first[0], header))
            for column, field in ((label, "data.label"), (key_col, "data.key")):
                if column is not None and column not in header:
                    raise BadInput("%s: column %r (%s) is not in the header %s"
                                   % (rel, column, field, header))
            if declared is None:
                declared = [{"name": c, "type": "float"} for c in header
                            if c not in (label, key_col)]
                if not declared:
                    raise BadInput("%s: no feature columns besides the label %r" % (rel, label))
            for feat in declared:
                if feat["name"] not in header:
                    raise BadInput("%s: feature column %r (data.features) is not in the header %s"
                                   % (rel, feat["name"], header))
            index = [(header.index(f["name"]), f["type"], f["name"]) for f in declared]
            label_at = header.index(label)
            key_at = header.index(key_col) if key_col is not None else None
        elif file_header != header:
            raise BadInput("%s line %d: header %s differs from the header %s of %s"
                           % (rel, first[0], file_header, header, files[0][0]))
        for line, row in it:
            if len(row) != len(header):
                raise BadInput("%s line %d: expected %d columns as in the header, got %d"
                               % (rel, line, len(header), len(row)))
            values = [_parse_number(row[i], kind, "%s line %d column %r" % (rel, line, name))
                      for i, kind, name in index]
            raw_label = row[label_at].strip()
            if raw_label == "":
                raise BadInput("%s line %d column %r: empty label" % (rel, line, label))
            key = row[key_at] if key_at is not None else "%s:%s" % (rel, ",".join(row))
            rows.append((key, values, raw_label, "%s line %d" % (rel, line)))
    if not rows:
        raise BadInput("the data set is empty: %s contain(s) a header but no data rows"
                       % ", ".join(rel for rel, _ in files))
    class_names, to_id = _label_mapping([r[2] for r in rows], rows, label)
    examples = [(key, values, to_id(raw)) for key, values, raw, _ in rows]
    counts = [0] * len(class_names)
    for _, _, label_id in examples:
        counts[label_id] += 1
    _check_classes(class_names, counts, ", ".join(rel for rel, _ in files))
    return {"feature_names": [f["name"] for f in declared],
            "feature_types": [f["type"] for f in declared],
            "class_names": class_names, "examples": examples}


def _label_mapping(raw_labels, rows, label):
    """Integer labels are class ids 0..max; any other labels are sorted names mapped to ids."""
    try:
        ints = [int(v) for v in raw_labels]
    except ValueError:
        ints = None
    if ints is not None:
        for value, row in zip(ints, rows):
            if value < 0:
                raise BadInput("%s column %r: class id %d is negative (expected 0 or more)"
                               % (row[3], label, value))
        names = [str(i) for i in range(max(ints) + 1)]
        return names, lambda raw: int(raw)
    names = sorted(set(raw_labels))
    ids = {name: i for i, name in enumerate(names)}
    return names, lambda raw: ids[raw]


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
    class_names = _class_folders(root)
    if not class_names:
        raise BadInput("the data set is empty: image folder %s has no class sub-folders" % root)
    ids = {name: i for i, name in enumerate(class_names)}
    examples = []
    counts = [0] * len(class_names)
    for rel, path, class_name in _walk_images(root):
        array = load_image(path, rel, height, width, data["channels"])
        examples.append((rel, array, ids[class_name]))
        counts[ids[class_name]] += 1
        if progress is not None:
            progress.add()
    _check_classes(class_names, counts, root)
    empty = [n for n, c in zip(class_names, counts) if not c]
    if empty:
        raise BadInput("class folder(s) %s in %s contain no PNG or JPEG images"
                       % (", ".join(empty), root))
    return {"class_names": class_names, "examples": examples}
