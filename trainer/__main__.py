"""Command line of the trainer image: ``python3 -m trainer {prep,validate,train,evaluate,export,prep_shard,prep_merge,select}``.

``select`` runs after a sweep's trials (``train`` tasks whose config names a trial): it picks the
best trial and makes its training output the run's (:mod:`trainer.select`).

The stage config is read from ``--config FILE`` (``-`` for stdin) or, by default, from the
environment variable ``TFPIPE_CONFIG``. On success the last stdout line is
``TFPIPE_RESULT <json>`` and the exit code 0; see :class:`trainer.contract.ExitCode` for the rest
(NotBlessed prints the result line too, then exits 10; DataRejected prints it, then its error, and
exits 14).
"""

import argparse
import atexit
import importlib
import json
import os
import sys
import traceback

from trainer import contract
from trainer.errors import BadInput, DataRejected, NotBlessed, TrainerError


def _parser():
    parser = argparse.ArgumentParser(
        prog="python3 -m trainer", description="Run one tfpipe training stage.",
        epilog="Exit codes: 0 ok, %d not blessed, %d bad input, %d diverged, %d a directory it "
        "writes is not writable, %d data rejected, 1 other failure."
        % (contract.ExitCode.NOT_BLESSED, contract.ExitCode.BAD_INPUT,
           contract.ExitCode.DIVERGED, contract.ExitCode.DIRS_NOT_READY,
           contract.ExitCode.DATA_REJECTED))
    parser.add_argument("stage", choices=contract.RUNNABLE_STAGES)
    parser.add_argument("--config", metavar="FILE",
                        help="stage config JSON file, '-' for stdin (default: $%s)"
                        % contract.CONFIG_ENV)
    return parser


def load_config(path, environ=None):
    """Read the stage config from ``path`` (``-``: stdin) or the environment; BadInput if bad."""
    environ = os.environ if environ is None else environ
    if path == "-":
        text, where = sys.stdin.read(), "stdin"
    elif path:
        try:
            with open(path) as handle:
                text, where = handle.read(), path
        except (IOError, OSError) as error:
            raise BadInput("cannot read --config %s: %s" % (path, error))
    else:
        text, where = environ.get(contract.CONFIG_ENV), "$" + contract.CONFIG_ENV
        if not text:
            raise BadInput("no stage config: set %s or pass --config" % contract.CONFIG_ENV)
    try:
        config = json.loads(text)
    except ValueError as error:
        raise BadInput("the stage config in %s is not valid JSON: %s" % (where, error))
    try:
        return contract.validate_stage_config(config)
    except contract.ContractError as error:
        raise BadInput("invalid stage config in %s: %s" % (where, error))


def _print_result(result):
    sys.stdout.flush()
    sys.stdout.write(contract.RESULT_PREFIX + json.dumps(result, sort_keys=True) + "\n")
    sys.stdout.flush()


def main(argv=None):
    """Parse, load and validate the config, run the stage, map exceptions to exit codes."""
    args = _parser().parse_args(argv)
    try:
        config = load_config(args.config)
        if config["stage"] != args.stage:
            raise BadInput("the command runs stage %r but the config says stage %r"
                           % (args.stage, config["stage"]))
        from trainer import common, workdirs
        workdirs.require_writable_dirs(config)
        common.quiet_tensorflow()
        common.setup_logging()
        module = importlib.import_module("trainer." + args.stage)
        result = module.run(config)
    except NotBlessed as error:
        print("NOT BLESSED: %s" % error, flush=True)
        _print_result(error.result)
        return error.exit_code
    except DataRejected as error:
        # the findings first, for the operator's record; the error last, where a log tail shows it
        _print_result(error.result)
        print("ERROR (%s, exit %d): %s" % (type(error).__name__, error.exit_code, error),
              file=sys.stderr, flush=True)
        return error.exit_code
    except TrainerError as error:
        sys.stdout.flush()
        print("ERROR (%s, exit %d): %s" % (type(error).__name__, error.exit_code, error),
              file=sys.stderr, flush=True)
        return error.exit_code
    except SystemExit as error:
        return error.code if isinstance(error.code, int) else 1
    except Exception:
        sys.stdout.flush()
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    _print_result(result)
    return contract.ExitCode.OK


def exit_now(code):
    """End the process with ``code`` once the atexit handlers have run, skipping the interpreter's
    own shutdown.

    That shutdown takes about half a second after TensorFlow has been imported (its modules and
    C++ runtime torn down one by one; measured in the image), paid by every stage and every task,
    and it writes nothing: by the time a stage returns, its outputs are renamed into place and its
    result line is printed. The atexit handlers still run, for logging's flush and the data
    cache's lease.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
