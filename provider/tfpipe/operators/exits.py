"""The exit-code contract on the Airflow side, shared by every backend: :func:`raise_for_exit` skips
export when not blessed, fails without retry when retrying cannot help, and retries otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from airflow.providers.common.compat.sdk import DownstreamTasksSkipped

from tfpipe import contract
from tfpipe.exceptions import StageFailedError, StageRejectedError

_LOG_TAIL = 30


def log_tail(lines: Sequence[Any] | None) -> str:
    """The last lines of a container's output, for an error message."""
    return "\n".join(str(line) for line in (lines or [])[-_LOG_TAIL:])


def raise_for_exit(*, stage: str, code: int | None, oom_killed: bool, logs: list[str], context: Any,
                   downstream: Callable[[], list[str]], log: logging.Logger, mem_limit: Any = None) -> NoReturn:
    """Raise what the non-zero exit ``code`` of ``stage`` means to Airflow.

    :param downstream: the task ids to skip when an evaluation was not blessed.
    :param context: the task context; a not-blessed evaluation's result is pushed to its XCom.
    """
    what = contract.ExitCode.describe(code)
    if code == contract.ExitCode.NOT_BLESSED and stage == "evaluate":
        result = contract.parse_result_line(logs)
        context["ti"].xcom_push(key="return_value", value=result)
        skipped = sorted(downstream())
        log.info("candidate not blessed: skipping %s", ", ".join(skipped) or "nothing")
        raise DownstreamTasksSkipped(tasks=skipped)
    if code == contract.ExitCode.DATA_REJECTED and stage == "validate":
        # the findings (columns, measures, thresholds) stay readable for the run note and lineage
        result = contract.parse_result_line(logs)
        if result is not None:
            context["ti"].xcom_push(key="return_value", value=result)
    if code in contract.ExitCode.NO_RETRY:
        raise StageRejectedError(
            f"{stage} rejected its input: {what} (exit {code}); retrying cannot fix this.\n{log_tail(logs)}",
            exit_code=code, logs=logs,
        )
    if oom_killed:
        raise StageFailedError(
            f"{stage} was killed by the out-of-memory killer (exit {code}, mem_limit={mem_limit}). "
            "Fix: raise resources.mem_limit or lower training.batch_size.\n" + log_tail(logs),
            exit_code=code, oom_killed=True, logs=logs,
        )
    raise StageFailedError(f"{stage} failed: {what} (exit {code}).\n{log_tail(logs)}", exit_code=code, logs=logs)
