"""The ``register`` task: log the run to MLflow, register a blessed export, move the ``champion`` alias.

It runs after ``export`` (after ``publish`` where the DAG has it) with the ``none_failed`` trigger
rule: a skipped export (the candidate was not blessed) still has its run logged, with nothing
registered; a failed one stops it. The stages' results come from XCom; the files XCom does not hold
(the per-epoch ``metrics.json``, the resolved stage configs, the report, the version's
``metadata.json``) are read through the Docker engine, never from a path on the worker. Without the
Airflow connection ``conn_id`` the task skips itself, saying so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from airflow.providers.common.compat.sdk import AirflowFailException, AirflowSkipException, BaseOperator

from tfpipe import contract
from tfpipe.config import VolumesConfig, check_image_ref, check_name
from tfpipe.mlflow import DEFAULT_CONN_ID
from tfpipe.specs import container_labels

ROLE = "mlflow-reader"


def run_files(dag_id: str, run_id: str) -> dict[str, str]:
    """The run-dir files ``register`` reads, by key: ``metrics`` (the per-epoch history), ``config/<stage>``
    (the resolved stage configs) and ``report/<file>`` (the run report, logged as artifacts as they are)."""
    from tfpipe.plugins.paths import REPORT_FILES

    run_dir = contract.run_dir(dag_id, run_id)
    return {"metrics": f"{run_dir}/{contract.METRICS_FILE}",
            **{f"config/{stage}": contract.stage_config_path(run_dir, stage) for stage in ("train", "evaluate")},
            **{f"report/{name}": f"{run_dir}/{name}" for name in REPORT_FILES}}


class RegisterOperator(BaseOperator):
    """Log a pipeline run to MLflow and register its blessed export (see the module's doc).

    :param image: the trainer image (its helper containers read the volumes); ``None`` = the Airflow
        Variable ``tfpipe_image``, read when the task runs.
    :param volumes: the pipeline's data/work/models volumes (directories on the Docker engine's host).
    :param model_name: the registered model's name (``export.model_name``).
    :param conn_id: the Airflow connection whose host is the tracking URI.
    :param docker_url: the Docker engine, local or remote.
    :param prep_task_id: the task whose result names the data set's fingerprint (``prep`` or ``prep_merge``).
    :param publish_task_id: the ``publish`` task, when the DAG has one: its ``gs://`` URI becomes the source.
    :param allow_floating_tag: accept an unpinned ``image``.
    :param kwargs: passed to ``BaseOperator``.
    """

    ui_color = "#d5f5e3"

    def __init__(self, *, image: str | None, volumes: VolumesConfig | Mapping[str, str], model_name: str,
                 conn_id: str = DEFAULT_CONN_ID, docker_url: str = "unix://var/run/docker.sock",
                 prep_task_id: str = "prep", publish_task_id: str | None = None,
                 allow_floating_tag: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if image is not None:  # None: the Airflow Variable tfpipe_image, read in execute()
            check_image_ref("image", image, allow_floating_tag=allow_floating_tag)
        check_name("model_name", model_name)
        self.image = image
        self.allow_floating_tag = allow_floating_tag
        self.volumes = VolumesConfig.from_dict(volumes, where="volumes")
        self.model_name = model_name
        self.conn_id = conn_id
        self.docker_url = docker_url
        self.prep_task_id = prep_task_id
        self.publish_task_id = publish_task_id

    # -- where things are ------------------------------------------------------------------------

    def _tracking_uri(self) -> str:
        from airflow.providers.common.compat.sdk import AirflowNotFoundException, BaseHook

        from tfpipe.mlflow import tracking_uri

        try:
            conn = BaseHook.get_connection(self.conn_id)
        except AirflowNotFoundException:
            raise AirflowSkipException(
                f"no Airflow connection {self.conn_id!r}: nothing logged to MLflow. To track runs, add it with the "
                f"tracking URI as its host: airflow connections add {self.conn_id} --conn-type http "
                "--conn-host http://127.0.0.1:5000") from None
        try:
            return tracking_uri(conn)
        except ValueError as err:
            raise AirflowFailException(str(err)) from None

    def _pull(self, ti: Any, task_id: str | None) -> dict[str, Any] | None:
        if not task_id or task_id not in self.dag.task_ids:
            return None
        value = ti.xcom_pull(task_ids=task_id)
        return value if isinstance(value, dict) else None

    def _read_files(self, context: Any, version: int | None,
                    image: str) -> tuple[dict[str, bytes], dict[str, Any] | None, str]:
        """The run dir's files MLflow gets (by :func:`run_files` key; the missing ones left out), the exported
        version's ``metadata.json`` and the engine's URL, read through helper containers of ``image``."""
        from tfpipe.hooks.docker import TfpipeDockerHook, VolumeHelper

        ti = context["ti"]
        engine = TfpipeDockerHook.for_task(self.docker_url, self.task_id)
        labels = container_labels(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id,
                                  try_number=ti.try_number, stage=ROLE)
        engine.remove_labelled({k: v for k, v in labels.items() if k != "tfpipe.try_number"}, role=ROLE, log=self.log)
        files: dict[str, bytes] = {}
        metadata = None
        try:
            with VolumeHelper(engine, image=image, host_path=self.volumes.work, mount_point=contract.CONTAINER_WORK,
                              read_only=True, labels=labels, role=ROLE, log=self.log) as work:
                for key, path in run_files(ti.dag_id, ti.run_id).items():
                    data = work.read_file(path)
                    if data is not None:
                        files[key] = data
            if version is not None:
                with VolumeHelper(engine, image=image, host_path=self.volumes.models,
                                  mount_point=contract.CONTAINER_MODELS, read_only=True, labels=labels, role=ROLE,
                                  log=self.log) as models:
                    data = models.read_file(f"{contract.CONTAINER_MODELS}/{self.model_name}/{version}/metadata.json")
                    metadata = json.loads(data) if data else None
        finally:
            engine.api_client.close()
        return files, metadata, engine.docker_url

    # -- the task --------------------------------------------------------------------------------

    def execute(self, context: Any) -> dict[str, Any]:
        from tfpipe import mlflow as tracking
        from tfpipe.links import MlflowRunLink, host_path
        from tfpipe.settings import resolve_image

        uri = self._tracking_uri()
        try:
            mlflow = tracking.client(uri)
        except tracking.MlflowUnavailableError as err:
            raise AirflowFailException(str(err)) from None
        tracking.check_answers(uri, self.conn_id)
        ti = context["ti"]
        evaluation = self._pull(ti, "evaluate")
        if evaluation is None:
            raise AirflowSkipException("this run has no evaluation (it stopped before evaluate): nothing to log")
        export = self._pull(ti, "export") or {}
        version = export.get("version") if evaluation.get("blessed") else None
        image = resolve_image(self.image, task=self.task_id, allow_floating_tag=self.allow_floating_tag)
        files, metadata, engine_url = self._read_files(context, version, image)

        def load(key: str) -> Any:
            return json.loads(files[key]) if key in files else None

        params = tracking.run_params({"training": (load("config/train") or {}).get("training"),
                                      "evaluation": (load("config/evaluate") or {}).get("evaluation")}, ti.run_id)
        history = load("metrics") or []
        prep = self._pull(ti, self.prep_task_id) or {}
        experiment = tracking.experiment_id(mlflow, ti.dag_id)
        run = tracking.log_run(
            mlflow, experiment=experiment, dag_id=ti.dag_id, run_id=ti.run_id, run_name=ti.run_id, params=params,
            tags={**tracking.evaluation_tags(evaluation), "tfpipe.model_name": self.model_name,
                  **({"tfpipe.data_fingerprint": prep["fingerprint"]} if prep.get("fingerprint") else {})},
            epochs=tracking.epoch_metrics(history), metrics=tracking.evaluation_metrics(evaluation),
            artifacts={key: data for key, data in files.items() if key.startswith("report/")}, log=self.log)
        run_url = tracking.run_url(uri, experiment, run.info.run_id)
        self.log.info("MLflow run of %s %s: %s (%d epoch record(s), %d param(s))", ti.dag_id, ti.run_id, run_url,
                      len(history), len(params))
        self._link_train(ti, MlflowRunLink(), run_url)
        result: dict[str, Any] = {"mlflow_run_id": run.info.run_id, "experiment_id": experiment, "run_url": run_url,
                                  "blessed": bool(evaluation.get("blessed")), "registered_version": None}
        if version is None:
            self.log.info("not registered: %s", "the candidate was not blessed" if not evaluation.get("blessed")
                          else "export wrote no version")
            return result
        published = self._pull(ti, self.publish_task_id) or {}
        model_path = host_path(export.get("model_dir"), self.volumes)
        source = published.get("uri") or tracking.engine_source(engine_url, model_path or "")
        registered = tracking.register_version(
            mlflow, model_name=self.model_name, source=source, mlflow_run_id=run.info.run_id,
            tags=tracking.version_tags(dag_id=ti.dag_id, run_id=ti.run_id, metadata=metadata,
                                       image=image, fingerprint=prep.get("fingerprint"),
                                       host_path=model_path, export_version=int(version)),
            alias=tracking.CHAMPION_ALIAS, log=self.log)
        result.update(registered_version=int(registered.version), source=source,
                      version_url=tracking.version_url(uri, self.model_name, registered.version))
        return result

    def _link_train(self, ti: Any, link: Any, url: str) -> None:
        """Store the "MLflow run" link of ``train`` (Airflow stored that task's links when it ended)."""
        from airflow.providers.common.compat.sdk import XCom

        try:
            XCom.set(key=link.xcom_key, value=url, dag_id=ti.dag_id, task_id="train", run_id=ti.run_id)
        except Exception as err:  # the link is a convenience: the run is logged either way
            self.log.warning("could not store the MLflow run link of train (%s: %s)", type(err).__name__, err)

