"""Atomic outputs: every file or directory a stage publishes appears whole or not at all.

Directories are built under a hidden ``.tmp-<random>`` sibling and renamed into place; JSON files
are written to a temporary file in the same directory, fsynced and ``os.replace``d.

Permissions: every published output is world-readable, whatever the process umask: files
``0644``, directories ``0755`` (TF Serving and people on the host read the outputs under other
uids). Temporary files and directories are chmod-ed right after ``mkstemp``/``mkdtemp`` (which
create them ``0600``/``0700``), and a directory tree is normalised once more just before it is
renamed into place, so files that TensorFlow or ``open`` created inside it under a strict umask
are covered too.
"""

import contextlib
import ctypes
import errno
import json
import os
import shutil
import tempfile
import time

TMP_PREFIX = ".tmp-"

#: Mode of every published file and directory.
FILE_MODE = 0o644
DIR_MODE = 0o755


def share_tree(path):
    """chmod a published tree: directories ``0755``, regular files ``0644`` (links untouched)."""
    if os.path.islink(path):
        return
    if not os.path.isdir(path):
        os.chmod(path, FILE_MODE)
        return
    os.chmod(path, DIR_MODE)
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames:
            sub = os.path.join(dirpath, name)
            if not os.path.islink(sub):
                os.chmod(sub, DIR_MODE)
        for name in filenames:
            sub = os.path.join(dirpath, name)
            if not os.path.islink(sub):
                os.chmod(sub, FILE_MODE)


def _write_file(path, write, binary=False, suffix="", durable=True):
    """Write ``path`` atomically: ``write(handle)`` fills a ``0644`` temp file, then rename.

    ``durable=False`` skips the fsync: the rename alone is atomic for every reader and survives
    the writer being killed (the page cache keeps the data); only a crash of the machine itself
    could then leave the old file or an empty one.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=suffix, dir=directory)
    try:
        os.fchmod(fd, FILE_MODE)  # mkstemp creates 0600
        with os.fdopen(fd, "wb" if binary else "w") as handle:
            write(handle)
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        _remove(tmp)
        raise


def write_json(path, obj, durable=True):
    """Write ``obj`` as JSON to ``path`` atomically (readers see the old or the new file);
    ``durable``: see :func:`_write_file`."""
    def write(handle):
        # one write of the whole text: json.dump writes each token separately
        handle.write(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")
    _write_file(path, write, suffix=".json", durable=durable)


def write_bytes(path, data):
    """Write ``data`` (bytes) to ``path`` atomically, mode ``0644``."""
    _write_file(path, lambda handle: handle.write(data), binary=True)


def write_text(path, text):
    """Write ``text`` as UTF-8 to ``path`` atomically, mode ``0644``."""
    write_bytes(path, text.encode("utf-8"))


def read_json(path, default=None):
    """Read a JSON file; return ``default`` when it does not exist."""
    try:
        with open(path) as handle:
            return json.load(handle)
    except (IOError, OSError) as error:
        if error.errno == errno.ENOENT:
            return default
        raise


def make_temp_dir(parent, prefix=TMP_PREFIX):
    """Create and return a fresh hidden temporary directory inside ``parent``."""
    os.makedirs(parent, exist_ok=True)
    path = tempfile.mkdtemp(prefix=prefix, dir=parent)
    os.chmod(path, DIR_MODE)  # mkdtemp creates 0700
    return path


@contextlib.contextmanager
def temp_dir(parent, prefix=TMP_PREFIX):
    """A temporary directory in ``parent`` that is removed when the block fails or leaves it.

    The block publishes it with :func:`publish_dir`; whatever is left afterwards is deleted.
    """
    path = make_temp_dir(parent, prefix)
    try:
        yield path
    finally:
        if os.path.lexists(path):
            shutil.rmtree(path, ignore_errors=True)


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _renameat2_noreplace(src, dst):
    """``rename(src, dst)`` that fails with EEXIST instead of replacing; None if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        func = libc.renameat2
    except (OSError, AttributeError):
        return None
    result = func(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
    if result == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return None
    raise OSError(err, os.strerror(err), dst)


def publish_dir(src, dst):
    """Rename directory ``src`` to ``dst``; raise ``FileExistsError`` if ``dst`` exists.

    Never replaces an existing ``dst`` (not even an empty one): uses ``renameat2`` with
    ``RENAME_NOREPLACE`` where the kernel and file system offer it. The tree is made
    world-readable first (:func:`share_tree`).
    """
    share_tree(src)
    done = _renameat2_noreplace(src, dst)
    if done:
        return
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "already exists", dst)
    try:
        os.rename(src, dst)
    except OSError as error:
        if error.errno in (errno.EEXIST, errno.ENOTEMPTY):
            raise FileExistsError(errno.EEXIST, "already exists", dst)
        raise


def remove_dir(path, parent=None):
    """Remove a published directory without ever showing it half-deleted.

    It is first renamed to a hidden ``.tmp-`` name in ``parent`` (default: its own parent).
    """
    parent = parent or os.path.dirname(path.rstrip("/"))
    hidden = tempfile.mkdtemp(prefix=TMP_PREFIX + "deleted-", dir=parent)
    os.rmdir(hidden)
    os.rename(path, hidden)
    shutil.rmtree(hidden, ignore_errors=True)


def replace_dir(src, dst):
    """Publish ``src`` as ``dst``, replacing an existing ``dst`` (old one renamed aside first)."""
    share_tree(src)
    if os.path.lexists(dst):
        remove_dir(dst)
    os.rename(src, dst)


def clean_stale_temps(parent, max_age_s=3600.0, prefix=TMP_PREFIX):
    """Delete ``.tmp-*`` entries in ``parent`` older than ``max_age_s``; return their names."""
    removed = []
    if not os.path.isdir(parent):
        return removed
    now = time.time()
    for name in sorted(os.listdir(parent)):
        if not name.startswith(prefix):
            continue
        path = os.path.join(parent, name)
        try:
            age = now - os.lstat(path).st_mtime
        except OSError:
            continue
        if age > max_age_s:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
                _remove(path)
            removed.append(name)
    return removed


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass
