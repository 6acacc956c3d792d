"""Work-volume retention: the ``cleanup`` task of every pipeline run.

The decision and removal run in the trainer image (:mod:`trainer.retention`) in a helper container;
this side adds the runs Airflow still holds as active, so their directories are never removed. It is
a teardown: it runs after failed runs too, and its outcome leaves the run's state alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow.providers.common.compat.sdk import AirflowFailException, BaseOperator

from tfpipe import contract
from tfpipe.compat import state_name
from tfpipe.config import RetentionConfig, check_host_path, check_image_ref, check_name
from tfpipe.specs import container_labels

#: The program the helper container runs, and the environment variable of its request.
RETENTION_COMMAND = ("python3", "-m", "trainer.retention")
REQUEST_ENV = "TFPIPE_RETENTION"
ROLE = "retention"
#: Dag run states whose directories must stay: the run is still going, or a task awaits its retry.
ACTIVE_RUN_STATES = ("queued", "running")
_FINISHED_TI_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


def retention_request(*, dag_id: str, run_id: str, model_name: str, retention: RetentionConfig,
                      protect_run_ids: list[str]) -> dict[str, Any]:
    """The JSON request of :mod:`trainer.retention` (pure)."""
    return {
        "dag_id": dag_id, "run_id": run_id, "model_name": model_name,
        "keep_runs": retention.keep_runs, "min_idle_seconds": retention.min_idle_minutes * 60.0,
        "protect_run_ids": sorted(set(protect_run_ids)),
        "work": contract.CONTAINER_WORK, "models": contract.CONTAINER_MODELS,
    }


def active_run_ids(ti: Any, dag_id: str, log: Any) -> list[str] | None:
    """Runs of ``dag_id`` that the metadata DB holds as queued or running; ``None`` if unreadable.

    Runs with an unfinished task instance are the candidates, each confirmed by its run state (a
    long-failed run with a task that never ran is not active).
    """
    try:
        active_count = ti.get_dr_count(dag_id=dag_id, states=list(ACTIVE_RUN_STATES))
        if active_count == 0 or (active_count == 1 and state_name(
                ti.get_dagrun_state(dag_id=dag_id, run_id=ti.run_id)) in ACTIVE_RUN_STATES):
            return [ti.run_id] if active_count else []
        states = ti.get_task_states(dag_id=dag_id)
        candidates = sorted(run_id for run_id, tasks in states.items()
                            if any(state_name(s) not in _FINISHED_TI_STATES for s in tasks.values()))
        return [r for r in candidates
                if state_name(ti.get_dagrun_state(dag_id=dag_id, run_id=r)) in ACTIVE_RUN_STATES]
    except Exception as err:  # an Airflow without these calls, or the API unreachable
        log.warning("cannot read the runs of %s from the metadata DB (%s: %s): only min_idle_minutes and "
                    "the current run protect active runs", dag_id, type(err).__name__, err)
        return None


class RetentionOperator(BaseOperator):
    """Remove old run directories (with their checkpoints and TensorBoard events) and unused data
    sets from the work volume, through a helper container of the trainer image.

    :param image: the trainer image (it holds :mod:`trainer.retention`); ``None`` = the Airflow
        Variable ``tfpipe_image``, read when the task runs.
    :param work_volume: the work volume, a directory on the Docker engine's host.
    :param models_volume: the models volume (read-only here: kept versions pin their runs).
    :param model_name: the model's directory under ``models_volume``.
    :param retention: what to keep (:class:`~tfpipe.config.RetentionConfig` or mapping).
    :param docker_url: the Docker engine, local or remote.
    :param allow_floating_tag: accept an unpinned ``image``.
    :param kwargs: passed to ``BaseOperator``.
    """

    ui_color = "#e8e8e8"

    def __init__(self, *, image: str | None, work_volume: str, models_volume: str, model_name: str,
                 retention: RetentionConfig | Mapping[str, Any] | None = None,
                 docker_url: str = "unix://var/run/docker.sock", allow_floating_tag: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if image is not None:  # None: the Airflow Variable tfpipe_image, read in execute()
            check_image_ref("image", image, allow_floating_tag=allow_floating_tag)
        self.allow_floating_tag = allow_floating_tag
        check_name("model_name", model_name)
        self.image = image
        self.work_volume = check_host_path("work_volume", work_volume)
        self.models_volume = check_host_path("models_volume", models_volume)
        self.model_name = model_name
        self.retention = RetentionConfig.from_dict(retention, where="retention")
        self.docker_url = docker_url

    def execute(self, context: Any) -> dict[str, Any]:
        from tfpipe.run_params import reject_unknown_conf  # execute-only, as the hook below

        reject_unknown_conf(context, self.task_id)
        ti = context["ti"]
        active = active_run_ids(ti, ti.dag_id, self.log)
        request = retention_request(dag_id=ti.dag_id, run_id=ti.run_id, model_name=self.model_name,
                                    retention=self.retention, protect_run_ids=active or [])
        self.log.info("retention for %s: keep the newest %d runs, runs with kept versions of %s, active runs %s, "
                      "anything written within %s min", ti.dag_id, self.retention.keep_runs, self.model_name,
                      request["protect_run_ids"] or "(none besides this one)", self.retention.min_idle_minutes)
        labels = container_labels(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                                  try_number=ti.try_number, stage=ROLE)
        return self._run_helper(request, labels)

    def _run_helper(self, request: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
        from tfpipe.hooks.docker import TfpipeDockerHook  # execute-only: kept out of the DAG file's parse
        from tfpipe.settings import resolve_image

        image = resolve_image(self.image, task=self.task_id, allow_floating_tag=self.allow_floating_tag)

        hook = TfpipeDockerHook.for_task(self.docker_url, self.task_id)
        cli = hook.api_client
        hook.remove_labelled({k: v for k, v in labels.items() if k != "tfpipe.try_number"}, role=ROLE, log=self.log)
        helper = hook.create_helper(
            image=image, command=RETENTION_COMMAND, labels=labels, role=ROLE, environment={REQUEST_ENV: json.dumps(request)},
            binds={self.work_volume: {"bind": contract.CONTAINER_WORK, "mode": "rw"},
                   self.models_volume: {"bind": contract.CONTAINER_MODELS, "mode": "ro"}})
        lines: list[str] = []
        try:
            cli.start(helper)
            for chunk in cli.logs(helper, stream=True, follow=True):
                for line in chunk.decode("utf-8", "replace").splitlines():
                    lines.append(line)
                    if not line.startswith(contract.RESULT_PREFIX):
                        self.log.info("%s", line)
            status = cli.wait(helper).get("StatusCode")
        finally:
            hook.remove_quietly(helper, self.log)
        tail = "\n".join(lines[-30:])
        if status in contract.ExitCode.NO_RETRY:
            raise AirflowFailException(f"retention rejected its request (exit {status}):\n{tail}")
        result = contract.parse_result_line(lines)
        if status != 0 or result is None:
            from tfpipe.exceptions import StageFailedError

            raise StageFailedError(f"retention failed (exit {status}):\n{tail}", exit_code=status, logs=lines)
        result["kept"] = len(result.get("kept", []))  # the removed list is the news; counts suffice for the rest
        return result
