"""Google Cloud Storage operators: stage raw data in before prep, publish blessed models after export.

The Cloud Storage side runs on the worker (credentials never enter a container); files move into
and out of the volumes through the Docker engine, whose host may not be the worker's. A run's
``data_uri`` / ``publish_uri`` Params override the operator's URI; with neither, the task skips.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowFailException, AirflowSkipException, BaseOperator

from tfpipe import contract
from tfpipe.config import (TfpipeConfigError, check_gcs_uri, check_host_path, check_image_ref, check_name,
                           check_relative_path)
from tfpipe.specs import container_labels

if TYPE_CHECKING:  # task-time modules: a DAG file's parse does not import them
    from tfpipe.hooks.docker import VolumeHelper
    from tfpipe.hooks.gcs import GcsUri, TfpipeGcsHook

#: Where the stage-in helper mounts the data volume.
DATA_MOUNT = "/vol"


class _GcsTransferOperator(BaseOperator):
    """What both transfer operators share: the argument checks, and the start of ``execute()``
    (the run's URI or a skip, the image, credentials, the engine, leftovers of an earlier try)."""

    #: The operator's URI argument (``source_uri`` / ``destination_uri``) and its stage label.
    uri_field = ""
    stage = ""

    def __init__(self, *, image: str | None, uri: str | None, uri_param: str | None, gcp_conn_id: str,
                 docker_url: str, max_workers: int, allow_floating_tag: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if image is not None:  # None: the Airflow Variable tfpipe_image, read in execute()
            check_image_ref("image", image, allow_floating_tag=allow_floating_tag)
        if uri is not None and "{{" not in str(uri):
            check_gcs_uri(self.uri_field, uri)
        if not isinstance(max_workers, int) or isinstance(max_workers, bool) or not 1 <= max_workers <= 64:
            raise TfpipeConfigError(f"max_workers: must be a whole number in 1..64, got {max_workers!r}. Fix: e.g. 8.")
        self.image = image
        self.allow_floating_tag = allow_floating_tag
        self.uri_param = uri_param
        self.gcp_conn_id = gcp_conn_id
        self.docker_url = docker_url
        self.max_workers = max_workers

    @property
    def helper_role(self) -> str:
        """The role label of this task's helper containers."""
        return f"gcs-{self.stage.replace('_', '-')}"

    def _run_uri(self, context: Mapping[str, Any], *, skip: str) -> GcsUri:
        """The URI of this run (the Param ``uri_param``, else the operator's); no URI skips with ``skip``."""
        from tfpipe.hooks.gcs import GcsUri
        from tfpipe.run_params import reject_unknown_conf

        reject_unknown_conf(context, self.task_id)
        value = (context.get("params") or {}).get(self.uri_param) if self.uri_param else None
        source = f"run parameter {self.uri_param!r}"
        if value in (None, ""):
            value, source = getattr(self, self.uri_field), f"the task's {self.uri_field}"
        if value in (None, "", "None"):
            raise AirflowSkipException(f"{skip}: neither the run parameter {self.uri_param!r} nor "
                                       f"{self.uri_field} is set")
        try:
            return GcsUri.parse(value, field_name=source)
        except TfpipeConfigError as err:
            raise AirflowFailException(f"{self.task_id}: {err}") from None

    def _connect(self, context: Mapping[str, Any], **volume: Any) -> tuple[TfpipeGcsHook, VolumeHelper]:
        """The Cloud Storage hook, and a :class:`VolumeHelper` of ``volume`` (its ``host_path``, ``mount_point``,
        ``read_only``). Credentials are checked before the engine is touched, and helper containers an
        earlier try left behind are removed."""
        from tfpipe.hooks.docker import TfpipeDockerHook, VolumeHelper
        from tfpipe.hooks.gcs import TfpipeGcsHook
        from tfpipe.settings import resolve_image

        image = resolve_image(self.image, task=self.task_id, allow_floating_tag=self.allow_floating_tag)
        hook = TfpipeGcsHook(self.gcp_conn_id)
        hook.get_conn()  # credentials first: a bad key fails before any container starts
        engine = TfpipeDockerHook.for_task(self.docker_url, self.task_id)
        ti = context["ti"]
        map_index = getattr(ti, "map_index", -1)
        labels = container_labels(dag_id=ti.dag_id, run_id=ti.run_id, task_id=ti.task_id, try_number=ti.try_number,
                                  stage=self.stage, map_index=-1 if map_index is None else map_index)
        engine.remove_labelled(labels, role=self.helper_role, log=self.log)
        return hook, VolumeHelper(engine, image=image, labels=labels, role=self.helper_role, log=self.log, **volume)


class GcsStageInOperator(_GcsTransferOperator):
    """Sync ``gs://bucket/prefix`` into ``<data_volume>/<data_path>`` on the Docker engine's host, before prep.

    Only new or changed objects are downloaded (on the worker); files of deleted objects are removed.
    With neither the run's Param ``uri_param`` nor ``source_uri`` set, the task skips itself.

    :param data_volume: the data volume: a directory on the Docker engine's host.
    :param data_path: the file or directory relative to ``data_volume`` (``data.path``). A URI that
        names one object becomes this file; a folder URI is laid out below this directory.
    :param image: the trainer image (the helper containers run it; it is not pulled here); ``None`` =
        the Airflow Variable ``tfpipe_image``, read when the task runs.
    :param source_uri: ``gs://bucket/prefix`` used when the run does not set the Param (templated).
    :param uri_param: name of the run Param that chooses the URI (``"data_uri"``); ``None`` ignores Params.
    :param gcp_conn_id: Airflow connection with the Google credentials (missing: Application Default
        Credentials; anonymous with ``STORAGE_EMULATOR_HOST``).
    :param docker_url: the Docker engine, local or remote.
    :param user: ``uid:gid`` that owns the staged files and directories.
    :param max_workers: parallel downloads (threads).
    :param allow_floating_tag: accept an unpinned ``image``.
    :param kwargs: passed to ``BaseOperator`` (``task_id``, ``retries``, ...).
    """

    template_fields = ("source_uri",)
    uri_field = "source_uri"
    stage = "stage_in"
    ui_color = "#d6eaff"

    def __init__(self, *, data_volume: str, data_path: str, image: str | None, source_uri: str | None = None,
                 uri_param: str | None = "data_uri", gcp_conn_id: str = "google_cloud_default",
                 docker_url: str = "unix://var/run/docker.sock", user: str = "1000:1000", max_workers: int = 8,
                 allow_floating_tag: bool = False, **kwargs: Any) -> None:
        super().__init__(image=image, uri=source_uri, uri_param=uri_param, gcp_conn_id=gcp_conn_id,
                         docker_url=docker_url, max_workers=max_workers, allow_floating_tag=allow_floating_tag, **kwargs)
        check_relative_path("data_path", data_path)
        if not isinstance(user, str) or not re.fullmatch(r"\d+(:\d+)?", user):
            raise TfpipeConfigError(f"user: must be 'uid:gid' in numbers, got {user!r}. Fix: e.g. '1000:1000'.")
        self.data_volume = check_host_path("data_volume", data_volume)
        self.data_path = data_path
        self.source_uri = source_uri
        self.user = user

    def execute(self, context: Any) -> dict[str, Any]:
        uri = self._run_uri(context, skip="no data URI (prep reads the data volume as it is)")
        from tfpipe.gcs.sync import stage_in

        hook, volume = self._connect(context, host_path=self.data_volume, mount_point=DATA_MOUNT)
        with volume as helper:
            result = stage_in(hook, helper, uri, self.data_path, user=self.user, max_workers=self.max_workers,
                              log=self.log)
        from tfpipe.lineage import capture

        self.lineage_inputs = capture(self, context, result, ())
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the ``gs://`` raw data in, the data volume path prep reads out."""
        from tfpipe.lineage import stage_in_lineage, to_operator_lineage

        captured = getattr(self, "lineage_inputs", None) or {}
        return to_operator_lineage(stage_in_lineage(
            source_uri=self.source_uri, data_volume=self.data_volume, data_path=self.data_path,
            docker_url=self.docker_url, result=captured.get("result")))


class GcsPublishOperator(_GcsTransferOperator):
    """Publish an exported model version to ``gs://bucket/prefix/<model_name>/<version>/``, after export.

    The ``_COMPLETE`` marker is written last, so readers never see a partial version and a retry
    completes an interrupted one. With neither the run's Param ``uri_param`` nor ``destination_uri``
    set, the task skips itself.

    :param models_volume: the models volume: a directory on the Docker engine's host.
    :param model_name: the exported model's name (``export.model_name``).
    :param image: the trainer image (the helper container runs it); ``None`` = the Airflow Variable
        ``tfpipe_image``, read when the task runs.
    :param destination_uri: ``gs://bucket/prefix`` used when the run does not set the Param (templated).
    :param uri_param: name of the run Param that chooses the URI (``"publish_uri"``); ``None`` ignores Params.
    :param export_task_id: the export task whose result (XCom) names the version.
    :param version: publish this version instead of the export task's (templated).
    :param gcp_conn_id: Airflow connection with the Google credentials.
    :param docker_url: the Docker engine, local or remote.
    :param max_workers: parallel uploads.
    :param allow_floating_tag: accept an unpinned ``image``.
    :param kwargs: passed to ``BaseOperator``.
    """

    template_fields = ("destination_uri", "version")
    uri_field = "destination_uri"
    stage = "publish"
    ui_color = "#d6eaff"

    def __init__(self, *, models_volume: str, model_name: str, image: str | None,
                 destination_uri: str | None = None,
                 uri_param: str | None = "publish_uri", export_task_id: str = "export",
                 version: int | str | None = None, gcp_conn_id: str = "google_cloud_default",
                 docker_url: str = "unix://var/run/docker.sock", max_workers: int = 8,
                 allow_floating_tag: bool = False, **kwargs: Any) -> None:
        super().__init__(image=image, uri=destination_uri, uri_param=uri_param, gcp_conn_id=gcp_conn_id,
                         docker_url=docker_url, max_workers=max_workers, allow_floating_tag=allow_floating_tag, **kwargs)
        check_name("model_name", model_name)
        self.models_volume = check_host_path("models_volume", models_volume)
        self.model_name = model_name
        self.destination_uri = destination_uri
        self.export_task_id = export_task_id
        self.version = version

    def _version(self, context: Any) -> int:
        value: Any = self.version
        if value in (None, "", "None"):
            result = context["ti"].xcom_pull(task_ids=self.export_task_id)
            if not result or result.get("version") is None:
                raise AirflowSkipException(f"{self.export_task_id} exported no version: nothing to publish")
            if result.get("model_name") not in (None, self.model_name):
                raise AirflowFailException(f"{self.export_task_id} exported model {result['model_name']!r}, but this "
                                           f"task publishes {self.model_name!r}. Fix: give both the same model_name.")
            value = result["version"]
        if not str(value).isdigit() or int(value) < 1:
            raise AirflowFailException(f"version must be a whole number >= 1, got {value!r}")
        return int(value)

    def execute(self, context: Any) -> dict[str, Any]:
        base = self._run_uri(context, skip="no publish URI (the model stays in the models volume only)")
        from tfpipe.gcs import megabytes
        from tfpipe.gcs.publish import extract_version, local_files, publish_version, version_uri
        from tfpipe.hooks.gcs import list_objects

        version = self._version(context)
        dest = version_uri(base, self.model_name, version)
        hook, volume = self._connect(context, host_path=self.models_volume, mount_point=contract.CONTAINER_MODELS,
                                     read_only=True)
        list_objects(hook, dest, prefix=dest.folder, action="checking")  # a missing bucket fails here
        container_dir = f"{contract.CONTAINER_MODELS}/{self.model_name}/{version}"
        with tempfile.TemporaryDirectory(prefix="tfpipe-publish-") as tmp:
            with volume as helper:
                stream = helper.get_archive(container_dir)
                if stream is None:
                    raise AirflowFailException(
                        f"version {version} of {self.model_name!r} is not in the models volume "
                        f"({self.models_volume}/{self.model_name}/{version} on the engine's host). Fix: run "
                        "export first, or check models_volume and model_name.")
                directory = extract_version(stream, str(version), tmp)
            files = local_files(directory)
            self.log.info("publishing %s version %d (%d file(s), %s) to %s", self.model_name, version, len(files),
                          megabytes(sum(f.size for f in files)), dest)
            ti = context["ti"]
            info = {"model_name": self.model_name, "version": version, "dag_id": ti.dag_id, "run_id": ti.run_id}
            result = publish_version(hook, dest, files, info=info, max_workers=self.max_workers, log=self.log)
        result = {**result, "model_name": self.model_name, "version": version}
        from tfpipe.lineage import capture

        self.lineage_inputs = capture(self, context, result, ("evaluate", "export"))
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the exported version in, its ``gs://`` copy out, with metrics, blessing and image."""
        from tfpipe.lineage import publish_lineage, to_operator_lineage

        captured = getattr(self, "lineage_inputs", None) or {}
        upstream = captured.get("upstream") or {}
        return to_operator_lineage(publish_lineage(
            models_volume=self.models_volume, model_name=self.model_name, docker_url=self.docker_url,
            image=self.image, result=captured.get("result"), export=upstream.get("export"),
            evaluation=upstream.get("evaluate")))

