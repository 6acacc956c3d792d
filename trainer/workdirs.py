"""The check a stage makes before it starts: can its user write every directory the stage writes?

The stage runs as an unprivileged user on volumes that a root helper container prepares
(``tfpipe.specs.prepare_dirs_command``). The check happens here, in the stage's own container, as
the user who will write: it costs a few ``stat`` calls and no request to the Docker engine, and
it sees what that user sees (ownership, mode, ACLs, a read-only mount). A directory that is
missing is made, as the stages make their run directory in every new run; one that cannot be
made or written ends the stage with exit 13 before anything is written, and the operator then
prepares the run's directories and starts the stage again.

Standard library only, Python 3.8 syntax: it runs before TensorFlow is imported.
"""

import errno
import os

from trainer import contract
from trainer.errors import DirsNotReady


def not_ready(config):
    """``[(directory, why), ...]`` for each directory the stage of ``config`` writes that its
    user cannot write; a missing one is made first (with its missing parents)."""
    paths = config["paths"]
    model_name = config.get("export", {}).get("model_name", "")
    found = []
    for directory in contract.writable_dirs(config["stage"], paths["run_dir"], model_name,
                                            work=paths["work"], models=paths["models"]):
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            found.append((directory, "cannot be made (%s)" % (os.strerror(error.errno or errno.EIO))))
            continue
        if not os.access(directory, os.W_OK | os.X_OK):
            info = os.stat(directory)
            found.append((directory, "owned by %d:%d, mode %o" % (info.st_uid, info.st_gid, info.st_mode & 0o7777)))
    return found


def require_writable_dirs(config):
    """Raise :class:`DirsNotReady` naming each directory the stage cannot write, and the fix."""
    found = not_ready(config)
    if found:
        raise DirsNotReady(
            "this stage runs as uid %d gid %d and cannot write %s. Fix: let the operator prepare the "
            "volumes (prepare_volumes, the default), or hand these directories to that user on the "
            "engine's host (chown)"
            % (os.getuid(), os.getgid(), "; ".join("%s (%s)" % item for item in found)))
