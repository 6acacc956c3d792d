"""Exceptions raised by tfpipe on the Airflow side while a task runs (they build on Airflow's).

:class:`~tfpipe.config.TfpipeConfigError` lives with the config checks, so a DAG's parse needs none of these.
"""

from __future__ import annotations

from collections.abc import Iterator

from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException

from tfpipe.config import TfpipeConfigError

__all__ = ["DockerEngineRefusedError", "DockerEngineUnreachableError", "GpuUnavailableError", "ImageNotFoundError",
           "ImageNotSetError", "PublishConflictError", "StageFailedError", "StageInError", "StageRejectedError",
           "TfpipeConfigError", "causes"]


class GpuUnavailableError(AirflowFailException):
    """GPUs were requested but the Docker engine cannot provide them (no NVIDIA runtime)."""


class StageFailedError(AirflowException):
    """A stage container failed with a code Airflow should retry (crash, kill, OOM).

    :param exit_code: the container's exit code.
    :param oom_killed: whether the kernel's out-of-memory killer ended it.
    :param logs: the container's output lines.
    """

    def __init__(self, message: str, *, exit_code: int | None, oom_killed: bool = False,
                 logs: list[str] | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.oom_killed = oom_killed
        self.logs = logs or []


class StageRejectedError(AirflowFailException):
    """A stage container rejected its input (bad data, bad config, diverged training): no retry can fix it."""

    def __init__(self, message: str, *, exit_code: int, logs: list[str] | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.logs = logs or []


class DockerEngineUnreachableError(AirflowException):
    """The Docker engine at ``docker_url`` did not answer."""


class StageInError(AirflowFailException):
    """The bucket's content cannot be laid out under the data path (retrying cannot fix it)."""


class PublishConflictError(AirflowFailException):
    """The version is already published with other content (published versions are immutable)."""


class ImageNotSetError(AirflowFailException):
    """No trainer image is configured: neither ``image.ref`` nor the Airflow Variable ``tfpipe_image`` (no retry)."""


class ImageNotFoundError(AirflowFailException):
    """The Docker engine has no such trainer image and cannot pull it; the message says how to fix it."""


class DockerEngineRefusedError(AirflowFailException):
    """The Docker engine refused the worker's TLS credentials; retrying cannot fix that."""


def causes(err: BaseException | None) -> Iterator[BaseException]:
    """``err`` and each error it wraps (its cause or context, else an error among its args), once each."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__ or next((a for a in err.args if isinstance(a, BaseException)), None)
