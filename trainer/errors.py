"""Exceptions that map to the exit codes of contract 2 (see :class:`trainer.contract.ExitCode`).

``python3 -m trainer`` turns them into exit codes; any other exception is an unexpected failure
(exit 1) that Airflow retries.
"""

from trainer.contract import ExitCode


class TrainerError(Exception):
    """Base class of the errors with a dedicated exit code."""

    exit_code = 1


class BadInput(TrainerError):
    """Bad data or a bad config: retrying cannot fix it (exit 11, no retry)."""

    exit_code = ExitCode.BAD_INPUT


class WorkerDied(TrainerError):
    """A worker process of the stage died abruptly, most likely killed by the out-of-memory killer:
    exit 137, as when the stage's own process is killed (retried; the message says what to change)."""

    exit_code = ExitCode.KILLED


class Diverged(TrainerError):
    """Training produced a NaN or infinite loss (exit 12, no retry, nothing exported)."""

    exit_code = ExitCode.DIVERGED


class NotBlessed(TrainerError):
    """The candidate failed the blessing gate (exit 10); ``result`` is still printed."""

    exit_code = ExitCode.NOT_BLESSED

    def __init__(self, message, result):
        super(NotBlessed, self).__init__(message)
        self.result = result


class DataRejected(TrainerError):
    """The data gate refused tonight's data (exit 14, no retry); ``result`` (the findings) is still
    printed as the result line, so the operator can record them."""

    exit_code = ExitCode.DATA_REJECTED

    def __init__(self, message, result):
        super(DataRejected, self).__init__(message)
        self.result = result


class DirsNotReady(TrainerError):
    """A directory the stage writes is missing and cannot be made, or is not writable by the
    stage's user (exit 13, found before the stage starts: the operator prepares the directories
    and starts the stage again)."""

    exit_code = ExitCode.DIRS_NOT_READY
