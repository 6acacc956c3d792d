"""Deployment settings tfpipe reads from Airflow when a task runs, never when a DAG file parses.

A pipeline without ``image.ref`` runs the image in the Airflow Variable ``tfpipe_image`` (set by
``make image``, ``airflow variables set``, ``AIRFLOW_VAR_TFPIPE_IMAGE`` or a secrets backend).
"""

from __future__ import annotations

from tfpipe.config import IMAGE_VARIABLE, TfpipeConfigError, check_image_ref

__all__ = ["HOW_TO_SET_IMAGE", "IMAGE_VARIABLE", "resolve_image"]

HOW_TO_SET_IMAGE = (
    f"build the image (`make image` sets the Airflow Variable {IMAGE_VARIABLE!r} in this project's "
    f"Airflow) or, in your deployment, `airflow variables set {IMAGE_VARIABLE} "
    "REGISTRY/tfpipe/trainer@sha256:...` (or AIRFLOW_VAR_TFPIPE_IMAGE=... in the workers' environment), "
    "or pin image={'ref': ...} in the PipelineConfig"
)


def _read_variable(name: str) -> str | None:
    from airflow.sdk.execution_time import task_runner

    if getattr(task_runner, "SUPERVISOR_COMMS", None) is not None:  # in a task
        from airflow.providers.common.compat.sdk import Variable

        value = Variable.get(name, default=None)
    else:
        # Outside a task (``tfpipe shell``, a test) the task SDK's Variable has no supervisor to
        # ask (Airflow 3.0 raises, later versions see only the environment): read it the way
        # Airflow's own models do, through the environment, the secrets backends and the metadata DB.
        from airflow.models.variable import Variable as DbVariable

        value = DbVariable.get(name, default_var=None)
    return value.strip() if isinstance(value, str) and value.strip() else None


def resolve_image(configured: str | None, *, task: str = "task", allow_floating_tag: bool = False) -> str:
    """The image a task runs: ``configured`` when set, else the Airflow Variable ``tfpipe_image``.

    Never at parse time. Raises :class:`~tfpipe.exceptions.ImageNotSetError` when neither is set or the
    Variable holds an unpinned reference.
    """
    from tfpipe.exceptions import ImageNotSetError

    if configured:
        return configured
    ref = _read_variable(IMAGE_VARIABLE)
    if ref is None:
        raise ImageNotSetError(
            f"{task}: no trainer image: the pipeline names none (image.ref) and the Airflow Variable "
            f"{IMAGE_VARIABLE!r} is not set. Fix: {HOW_TO_SET_IMAGE}."
        )
    try:
        check_image_ref(f"Airflow Variable {IMAGE_VARIABLE}", ref, allow_floating_tag=allow_floating_tag)
    except TfpipeConfigError as err:
        raise ImageNotSetError(f"{task}: {err}") from err
    return ref
