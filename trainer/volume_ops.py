"""Programs the provider's helper containers run next to the files of a volume.

The Airflow worker may not be the Docker engine's host, so it never opens a volume directory
itself: it starts a short-lived container of the trainer image that bind-mounts the directory
and runs ``python3 -m trainer.volume_ops PROGRAM IN_JSON OUT_JSON``. The payload travels in as
the file ``IN_JSON`` and the result comes back as the file ``OUT_JSON`` (both copied with the
engine's archive API), so neither size nor the logging driver limits them.

Standard library only, Python 3.8 syntax (the official TF 2.9 image runs 3.8); no TensorFlow, so
a helper starts in a fraction of a second. Living in the trainer package, these programs are
covered by the in-image tests and the Python 3.8 syntax check.
"""

import json
import os
import sys


def list_dir(payload):
    """Make the target directory and report its files, sub-directories and sync manifest.

    Payload: ``root`` (directory in the container), ``uid``/``gid`` (owner of directories this
    creates), ``manifest`` (file name of the last sync's manifest), ``marker`` (suffix of files
    left out of the listing: the manifests), ``only`` (``None`` for every file, or a list of
    names relative to ``root`` to look at).
    """
    root, uid, gid = payload["root"], payload["uid"], payload["gid"]
    if os.path.lexists(root) and not os.path.isdir(root):
        return {"error": "not_a_directory"}
    missing, path = [], root
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    os.makedirs(root, exist_ok=True)
    for directory in missing:
        os.chown(directory, uid, gid)
    files, dirs = {}, []

    def record(full, rel):
        if (os.path.isfile(full) and not os.path.islink(full)
                and not rel.split("/")[-1].endswith(payload["marker"])):
            files[rel] = os.path.getsize(full)

    if payload["only"] is None:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames:
                dirs.append(os.path.relpath(os.path.join(dirpath, name), root))
            for name in filenames:
                full = os.path.join(dirpath, name)
                record(full, os.path.relpath(full, root))
    else:
        for rel in payload["only"]:
            record(os.path.join(root, rel), rel)
    manifest = None
    try:
        with open(os.path.join(root, payload["manifest"])) as handle:
            manifest = json.load(handle)
    except (OSError, ValueError):
        manifest = None
    return {"files": files, "dirs": dirs, "manifest": manifest}


def delete_files(payload):
    """Remove files (objects deleted from the bucket) and the directories they leave empty.

    Payload: ``root`` and ``delete`` (paths relative to ``root``; any that would leave ``root``
    are ignored).
    """
    root = payload["root"].rstrip("/")
    removed = 0
    for rel in payload["delete"]:
        full = os.path.normpath(os.path.join(root, rel))
        if not full.startswith(root + "/"):
            continue
        if os.path.isfile(full) or os.path.islink(full):
            os.remove(full)
            removed += 1
        directory = os.path.dirname(full)
        while directory != root and directory.startswith(root + "/"):
            try:
                os.rmdir(directory)
            except OSError:
                break
            directory = os.path.dirname(directory)
    return {"removed": removed}


PROGRAMS = {"list_dir": list_dir, "delete_files": delete_files}


def main(argv=None):
    """``python3 -m trainer.volume_ops PROGRAM IN_JSON OUT_JSON``; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] not in PROGRAMS:
        sys.stderr.write("usage: python3 -m trainer.volume_ops {%s} IN_JSON OUT_JSON\n"
                         % ",".join(sorted(PROGRAMS)))
        return 2
    name, in_path, out_path = argv
    with open(in_path) as handle:
        payload = json.load(handle)
    result = PROGRAMS[name](payload)
    with open(out_path, "w") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
