"""tfpipe: run a training DAG through Airflow, and see or reproduce its runs.

The ``tfpipe`` command (also ``python -m tfpipe.cli``), one module per sub-command.

* ``tfpipe run DAG_ID [--conf JSON | --rerun RUN_ID] [-v]`` (:mod:`tfpipe.cli.run`) runs one DAG run
  through Airflow's ``dag.test()``, shows its stages, training's epochs and the result on stderr
  (Airflow's own log in a file it names; ``-v``: on stderr) and prints its summary as one JSON line.

Seeing and reproducing a run (:mod:`tfpipe.cli.tensorboard`, :mod:`tfpipe.cli.shell`, built by :mod:`tfpipe.reproduce`):

* ``tfpipe tensorboard DAG_ID RUN_ID|latest [--port 6006]`` serves the run's TensorBoard event
  files from the trainer image on ``127.0.0.1:PORT`` and prints the URL;
* ``tfpipe shell DAG_ID TASK_ID [--run RUN_ID|latest]`` opens a shell in a container set up as
  that task's (image, mounts, user, environment with the run's ``TFPIPE_CONFIG``, working dir,
  network), where ``python3 -m trainer <stage>`` reruns the stage. Private environment values
  are left out. ``--print`` prints the ``docker run`` command instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from tfpipe.cli import run, shell, tensorboard


def _add_debug_parsers(sub: Any) -> None:
    """The ``tensorboard`` and ``shell`` sub-commands and the flags they share."""
    dags_folder = os.environ.get("AIRFLOW__CORE__DAGS_FOLDER", str(Path("dags")))
    tb = tensorboard.add_parser(sub)
    sh = shell.add_parser(sub)
    for p in (tb, sh):
        p.add_argument("--dags-folder", default=dags_folder)
        p.add_argument("--print", action="store_true", help="print the docker command instead of running it")
        p.add_argument("--detach", action="store_true",
                       help="start the container in the background and print its id"
                       + (" (the shell container runs `sleep infinity`)" if p is sh else ""))


def build_parser() -> argparse.ArgumentParser:
    """The ``tfpipe`` argument parser; each sub-command sets its ``handler``."""
    parser = argparse.ArgumentParser(prog="tfpipe", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run.add_parser(sub)
    _add_debug_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``tfpipe`` command.

    Called with ``argv`` (from Python), it returns the exit status. Called without (the ``tfpipe``
    script, ``python -m tfpipe.cli``), it ends the process with that status once the command is done:
    see :func:`end_process`.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    args.parser = parser
    code = args.handler(args)
    if argv is None:
        end_process(code)
    return code


def end_process(code: int) -> NoReturn:
    """Do what the interpreter does at exit up to its teardown, then end the process with ``code``.

    After a ``tfpipe run`` the process holds Airflow, SQLAlchemy, the DAG and the task runner, some
    700,000 objects: tearing them down one by one (module by module, with the garbage collector's
    passes between) took 2-3 s after the summary line, an eighth of an 18 s run of the digits DAG, to
    free memory the kernel frees at once. Everything before the teardown runs here, in the
    interpreter's order: first ``threading``'s shutdown, which joins the threads that are not
    daemons and stops the process pools of ``concurrent.futures`` (OpenLineage's listener keeps one
    with a forked worker; ``multiprocessing``'s own exit handler joins that worker, and waits for it
    forever unless the pool was stopped first), then the ``atexit`` handlers (logging's final flush,
    ``weakref.finalize`` clean-ups, Airflow's ``dispose_orm``), then a flush of stdout and stderr.
    """
    import atexit
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader has gone: nothing left to deliver
            pass
    os._exit(code)
