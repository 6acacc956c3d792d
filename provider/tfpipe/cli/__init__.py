"""tfpipe: run a training DAG through Airflow, and see or reproduce its runs.

The ``tfpipe`` command (also ``python -m tfpipe.cli``): ``run`` (:mod:`tfpipe.cli.run`),
``tensorboard`` (:mod:`tfpipe.cli.tensorboard`) and ``shell`` (:mod:`tfpipe.cli.shell`).
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
    """Entry point of the ``tfpipe`` command: returns the exit status when given ``argv``, else ends
    the process with it (:func:`end_process`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.parser = parser
    code = args.handler(args)
    if argv is None:
        end_process(code)
    return code


def end_process(code: int) -> NoReturn:
    """Do what the interpreter does at exit up to its teardown, then end the process with ``code``.

    Tearing down the objects of Airflow and the task runner one by one takes seconds to free memory
    the kernel frees at once. The steps before it run in the interpreter's order: ``threading``'s
    shutdown (it stops ``concurrent.futures`` pools, which ``multiprocessing``'s exit handler would
    otherwise wait for forever), the ``atexit`` handlers, a flush of stdout and stderr.
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
