"""OpenLineage for the tfpipe operators: what each stage read and wrote, with the facts that matter.

The chain a lineage tool (Marquez, DataHub, ...) shows for one DAG run::

    gs://raw/...  --stage_in-->  <data volume>/<data.path>  --prep-->  <work>/datasets/<fingerprint>
      --train-->  <work>/runs/<dag>/<run>/train/final  --export-->  <models>/<name>/<version>
      --publish-->  gs://models/<prefix>/<name>/<version>
    (validate reads the dataset: OpenLineage's data-quality facets on it; evaluate reads train/final
    and the dataset, and writes evaluation.json with the blessing)

Volume paths are files on the Docker engine's host: namespace ``file`` for a local engine,
``file://<host>`` for a remote one; ``gs://`` URIs follow OpenLineage's naming (namespace
``gs://<bucket>``, name the object path). Facets (``tfpipe_*``): the data fingerprint on the raw
data and the dataset dir, and the date window's partitions read on the raw data; metrics and the
image on the trained model; metrics and the blessing on ``evaluation.json``; all three on the
exported and published model.

:func:`stage_lineage` is pure (plain dicts); :func:`to_operator_lineage` turns its answer into the
provider's ``OperatorLineage``, importing OpenLineage only then (the extra ``openlineage``).
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from tfpipe import contract

FACET_PREFIX = "tfpipe_"


@dataclass(frozen=True)
class LineageDataset:
    """One dataset of an OpenLineage event: namespace, name and custom facets (``name -> fields``)."""

    namespace: str
    name: str
    facets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: OpenLineage's standard input facets of an input (``dataQualityMetrics``, ``dataQualityAssertions``)
    input_facets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class StageLineage:
    """What one task read and wrote."""

    inputs: tuple[LineageDataset, ...] = ()
    outputs: tuple[LineageDataset, ...] = ()


def file_namespace(docker_url: str | None) -> str:
    """``file`` for a local engine (unix socket), ``file://<host>`` for one reached over the network."""
    parsed = urlparse(docker_url or "")
    if parsed.scheme in ("tcp", "http", "https", "ssh") and parsed.hostname:
        return f"file://{parsed.hostname}"
    return "file"


def volume_dataset(docker_url: str | None, host_path: str, **facets: Mapping[str, Any] | None) -> LineageDataset:
    """A directory or file on the engine's host."""
    return LineageDataset(file_namespace(docker_url), posixpath.normpath(host_path),
                          {k: v for k, v in facets.items() if v})


def gcs_dataset(uri: str, **facets: Mapping[str, Any] | None) -> LineageDataset:
    """A ``gs://bucket/path`` object or prefix."""
    parsed = urlparse(uri)
    return LineageDataset(f"gs://{parsed.netloc}", parsed.path.strip("/") or "/",
                          {k: v for k, v in facets.items() if v})


def container_to_host(container_path: str | None, volumes: Any) -> str | None:
    """A path under ``/data``, ``/work`` or ``/models`` as the engine host's path, else ``None``."""
    if not container_path:
        return None
    path = posixpath.normpath(container_path)
    for target, source in ((contract.CONTAINER_DATA, volumes.data), (contract.CONTAINER_WORK, volumes.work),
                           (contract.CONTAINER_MODELS, volumes.models)):
        if path == target or path.startswith(target + "/"):
            return source.rstrip("/") + path[len(target):]
    return None


# --- facets ------------------------------------------------------------------------------------

def fingerprint_facet(fingerprint: str | None) -> dict[str, Any] | None:
    return {"fingerprint": fingerprint} if fingerprint else None


def window_facet(window: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The date window prep read (``data.window_days``): its days, end and the partitions read."""
    if not window:
        return None
    return {key: window.get(key) for key in ("partition_key", "days", "end", "first", "last", "partitions",
                                             "missing")}


def metrics_facet(metrics: Mapping[str, Any] | None) -> dict[str, Any] | None:
    numbers = {k: float(v) for k, v in (metrics or {}).items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return {"metrics": numbers} if numbers else None


def blessing_facet(evaluation: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not evaluation or "blessed" not in evaluation:
        return None
    baseline = evaluation.get("baseline") if isinstance(evaluation.get("baseline"), Mapping) else None
    return {"blessed": bool(evaluation["blessed"]), "metric": evaluation.get("metric"),
            "value": evaluation.get("value"), "threshold": evaluation.get("threshold"),
            "tolerance": evaluation.get("tolerance"), "reason": evaluation.get("reason"),
            "baseline_version": baseline.get("version") if baseline else None,
            "baseline_value": baseline.get("value") if baseline else None}


def image_facet(image: str | None) -> dict[str, Any] | None:
    return {"image": image} if image else None


def trial_facet(select: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The chosen trial of a sweep, from select's result (None without one)."""
    if not select or select.get("chosen") is None:
        return None
    return {"trial": select["chosen"], "params": dict(select.get("params") or {}), "metric": select.get("metric"),
            "value": select.get("value"), "trials": select.get("trials")}


def data_quality_facets(result: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """OpenLineage's data-quality input facets of the data set the gate checked: its row count and
    column metrics (``dataQualityMetrics``) and one assertion per check it ran (``dataQualityAssertions``,
    ``success`` false for an anomaly)."""
    if not result or not isinstance(result.get("dataset"), Mapping):
        return {}
    dataset = result["dataset"]
    metrics = {name: {"nullCount": col.get("missing"), "distinctCount": col.get("distinct"),
                      "min": col.get("min"), "max": col.get("max")}
               for name, col in (dataset.get("columns") or {}).items() if isinstance(col, Mapping)}
    checks = result.get("checks") or []
    assertions = [{"assertion": str(check.get("check")), "success": bool(check.get("ok")),
                   "column": check.get("column"), "severity": None if check.get("ok") else "error",
                   "expected": None if check.get("threshold") is None else f"<= {check['threshold']}",
                   "actual": None if check.get("value") is None else str(check["value"])}
                  for check in checks if isinstance(check, Mapping)]
    return {"dataQualityMetrics": {"rowCount": dataset.get("rows"), "columnMetrics": metrics},
            "dataQualityAssertions": {"assertions": assertions}}


# --- per stage ----------------------------------------------------------------------------------

def stage_lineage(stage: str, *, volumes: Any, docker_url: str | None, image: str | None,
                  data_path: str | None, result: Mapping[str, Any] | None,
                  upstream: Mapping[str, Mapping[str, Any] | None]) -> StageLineage:
    """Inputs and outputs of one stage task.

    :param result: this task's result (``None`` before it ran: the START event's view).
    :param upstream: results of the upstream stage tasks by stage (``prep``, ``train``, ``evaluate``).
    """
    result = result or {}
    ns = docker_url

    def at(container_path: str | None, **facets: Any) -> LineageDataset | None:
        host = container_to_host(container_path, volumes)
        return volume_dataset(ns, host, **facets) if host else None

    def checked(dataset: LineageDataset | None) -> LineageDataset | None:
        quality = data_quality_facets(result)
        return LineageDataset(dataset.namespace, dataset.name, dataset.facets, quality) if dataset else None

    prep = upstream.get("prep") or upstream.get("prep_merge") or {}  # sharded prep: the merge made the data set
    select = upstream.get("select") or {}
    train = select or upstream.get("train") or {}  # a sweep: the chosen trial's weights, where select put them
    trial = trial_facet(select)
    evaluation = upstream.get("evaluate") or {}
    inputs: list[LineageDataset | None] = []
    outputs: list[LineageDataset | None] = []
    if stage in ("prep", "prep_merge"):
        fingerprint = fingerprint_facet(result.get("fingerprint"))
        inputs.append(at(f"{contract.CONTAINER_DATA}/{data_path}" if data_path else None,
                         tfpipe_fingerprint=fingerprint, tfpipe_window=window_facet(result.get("window"))))
        outputs.append(at(result.get("dataset_dir"), tfpipe_fingerprint=fingerprint))
    elif stage == "validate":
        inputs.append(checked(at(prep.get("dataset_dir"),
                                 tfpipe_fingerprint=fingerprint_facet(prep.get("fingerprint")))))
    elif stage == "train":
        inputs.append(at(prep.get("dataset_dir"), tfpipe_fingerprint=fingerprint_facet(prep.get("fingerprint"))))
        final = {k[len("final_"):]: v for k, v in result.items() if k.startswith("final_") and k != "final_dir"}
        outputs.append(at(result.get("final_dir"), tfpipe_metrics=metrics_facet(final),
                          tfpipe_image=image_facet(image)))
    elif stage == "select":
        outputs.append(at(result.get("final_dir"), tfpipe_trial=trial_facet(result)))
    elif stage == "evaluate":
        inputs += [at(train.get("final_dir")), at(prep.get("dataset_dir"))]
        outputs.append(at(result.get("evaluation_path"), tfpipe_metrics=metrics_facet(result.get("metrics")),
                          tfpipe_blessing=blessing_facet(result)))
    elif stage == "export":
        inputs.append(at(train.get("final_dir")))
        outputs.append(at(result.get("model_dir"), tfpipe_metrics=metrics_facet(result.get("metrics")),
                          tfpipe_blessing=blessing_facet(evaluation), tfpipe_image=image_facet(image),
                          tfpipe_trial=trial))
    return StageLineage(tuple(d for d in inputs if d), tuple(d for d in outputs if d))


def stage_in_lineage(*, source_uri: str | None, data_volume: str, data_path: str, docker_url: str | None,
                     result: Mapping[str, Any] | None) -> StageLineage:
    """``gs://`` raw data -> the data volume path prep reads."""
    result = result or {}
    source = result.get("source") or source_uri
    target = result.get("target") or f"{data_volume.rstrip('/')}/{data_path}"
    return StageLineage(
        (gcs_dataset(source),) if source else (),
        (volume_dataset(docker_url, target),),
    )


def publish_lineage(*, models_volume: str, model_name: str, docker_url: str | None, image: str | None,
                    result: Mapping[str, Any] | None, export: Mapping[str, Any] | None,
                    evaluation: Mapping[str, Any] | None) -> StageLineage:
    """The exported model version -> its ``gs://`` copy, with the same model facets."""
    result = result or {}
    version = result.get("version") or (export or {}).get("version")
    if version is None:
        return StageLineage()
    facets = {"tfpipe_metrics": metrics_facet((export or {}).get("metrics")),
              "tfpipe_blessing": blessing_facet(evaluation), "tfpipe_image": image_facet(image)}
    source = volume_dataset(docker_url, f"{models_volume.rstrip('/')}/{model_name}/{version}")
    outputs = (gcs_dataset(result["uri"], **facets),) if result.get("uri") else ()
    return StageLineage((source,), outputs)


# --- OpenLineage objects -------------------------------------------------------------------------

def lineage_enabled() -> bool:
    """Whether OpenLineage is installed and on (then tasks keep what their lineage needs)."""
    try:
        from airflow.providers.openlineage.conf import is_disabled
    except ImportError:
        return False
    return not is_disabled()


def capture(task: Any, context: Any, result: Any, stages: tuple[str, ...]) -> dict[str, Any] | None:
    """What :meth:`get_openlineage_facets_on_complete` will need, read while ``execute`` runs.

    OpenLineage calls that method in a forked child of the task runner by default, where reading
    XComs through the supervisor's channel is unsafe; so the task's result and the upstream
    results are read here, in the task itself, and kept on the operator.
    """
    if not lineage_enabled():
        return None
    try:
        upstream = upstream_results(task, context["ti"], stages)
    except Exception:  # lineage must never fail a task that did its work
        logging.getLogger(__name__).warning("OpenLineage: upstream results unreadable", exc_info=True)
        upstream = {}
    return {"result": result if isinstance(result, Mapping) else None, "upstream": upstream}


def upstream_results(task: Any, task_instance: Any, stages: tuple[str, ...]) -> dict[str, Any]:
    """Results (XCom ``return_value``) of the upstream tfpipe stage tasks, by stage."""
    found: dict[str, Any] = {}
    for relative in task.get_flat_relatives(upstream=True):
        stage = getattr(relative, "stage", None)
        if stage in stages and stage not in found:
            try:
                value = task_instance.xcom_pull(task_ids=relative.task_id)
            except Exception:  # no XCom access here: lineage without that input
                value = None
            found[stage] = value if isinstance(value, Mapping) else None
    return found


def to_operator_lineage(lineage: StageLineage) -> Any:
    """The provider's ``OperatorLineage`` with ``tfpipe_*`` dataset facets (and the standard data-quality
    input facets of a checked input)."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import Dataset, InputDataset

    def convert(dataset: LineageDataset) -> Any:
        facets = {name: _facet(name, fields) for name, fields in dataset.facets.items()}
        if dataset.input_facets:
            return InputDataset(namespace=dataset.namespace, name=dataset.name, facets=facets,
                                inputFacets=_quality_facets(dataset.input_facets))
        return Dataset(namespace=dataset.namespace, name=dataset.name, facets=facets)

    return OperatorLineage(inputs=[convert(d) for d in lineage.inputs],
                           outputs=[convert(d) for d in lineage.outputs])


def _quality_facets(fields: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    from openlineage.client.facet_v2 import data_quality_assertions_dataset as assertions
    from openlineage.client.facet_v2 import data_quality_metrics_input_dataset as metrics

    out: dict[str, Any] = {}
    if "dataQualityMetrics" in fields:
        found = fields["dataQualityMetrics"]
        out["dataQualityMetrics"] = metrics.DataQualityMetricsInputDatasetFacet(
            rowCount=found.get("rowCount"),
            columnMetrics={name: metrics.ColumnMetrics(**column) for name, column in found["columnMetrics"].items()})
    if "dataQualityAssertions" in fields:
        out["dataQualityAssertions"] = assertions.DataQualityAssertionsDatasetFacet(
            assertions=[assertions.Assertion(**check) for check in fields["dataQualityAssertions"]["assertions"]])
    return out


def _facet(name: str, fields: Mapping[str, Any]) -> Any:
    from tfpipe.lineage_facets import FACETS

    return FACETS[name](**fields)
