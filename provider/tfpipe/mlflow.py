"""What a pipeline run puts into MLflow, and how: the ``register`` task's MLflow side.

The builders here are pure (params, metrics, tags, URLs from the stages' results and the run's files);
:func:`log_run` and :func:`register_version` talk to the tracking server through ``MlflowClient``
(``mlflow-skinny``, the ``[mlflow]`` extra), imported only when they run. Both can be called again for
the same Airflow run, so a retried ``register`` neither logs a second MLflow run nor registers a second
version.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, urlsplit

#: The Airflow connection whose host is the tracking URI (``mlflow.conn_id`` of the pipeline config).
DEFAULT_CONN_ID = "mlflow_default"
INSTALL_HINT = "pip install 'airflow-provider-tfpipe[mlflow]'"
#: The registered-model alias that follows the newest blessed version.
CHAMPION_ALIAS = "champion"
#: Tags of the MLflow run that identify the Airflow run it records (a retry finds its run by them).
DAG_ID_TAG, RUN_ID_TAG = "airflow.dag_id", "airflow.run_id"
BLESSED_TAG = "tfpipe.blessed"
#: Fields of a ``metrics.json`` epoch record that are bookkeeping, not measurements.
_NOT_METRICS = frozenset({"epoch", "step", "try_number", "batches", "best", "time"})
#: MLflow's limits: characters of a param value, entries of one ``log_batch`` call.
PARAM_VALUE_MAX = 6000
_BATCH = 100
#: The scheme of a version source on a Docker engine's host: no MLflow artifact store reads it, and
#: the tracking server refuses a bare local path that is not under the run's own artifacts.
ENGINE_HOST_SCHEME = "docker-host"


class MlflowUnavailableError(RuntimeError):
    """``mlflow-skinny`` is not installed on the worker; the message says how to install it."""


def client(tracking_uri: str) -> Any:
    """An ``MlflowClient`` of ``tracking_uri`` (tracking and registry on the same server)."""
    try:
        from mlflow import MlflowClient
    except ImportError as err:
        raise MlflowUnavailableError(
            f"the MLflow client (mlflow-skinny) is not installed on this worker ({err}). Fix: {INSTALL_HINT}, "
            "or set mlflow.enabled to false in the pipeline config") from None
    return MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)


# --- pure builders ------------------------------------------------------------------------------

def tracking_uri(conn: Any) -> str:
    """The tracking URI of an Airflow connection: its host when that is a URL (``http://127.0.0.1:5000``),
    else ``<conn_type or http>://<host>[:<port>][/<schema>]`` (a connection given as a URI)."""
    host = (conn.host or "").strip()
    if not host:
        raise ValueError(f"connection {conn.conn_id!r}: no host. Fix: set its host to the tracking URI, "
                         "e.g. http://127.0.0.1:5000")
    if "://" in host:
        uri = host
        if conn.port and not urlsplit(host).port:
            parts = urlsplit(host)
            uri = parts._replace(netloc=f"{parts.netloc}:{conn.port}").geturl()
        return uri.rstrip("/")
    scheme = conn.conn_type if conn.conn_type in ("http", "https") else "http"
    port = f":{conn.port}" if conn.port else ""
    schema = f"/{conn.schema.strip('/')}" if conn.schema else ""
    return f"{scheme}://{host}{port}{schema}"


class TrackingServerDown(Exception):
    """The tracking server does not answer: a plain failure, so Airflow retries the task."""


def check_answers(uri: str, conn_id: str, timeout: float = 10.0) -> None:
    """Raise :class:`TrackingServerDown` naming the server when an HTTP tracking server does not answer
    at all. MLflow's own client would retry for minutes and then name an endpoint; this says which server,
    that the exported files are untouched, and the fix. Any HTTP answer (even an error) counts: the
    client's calls then say what is wrong."""
    import urllib.error
    import urllib.request

    if not uri.startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(f"{uri}/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        return
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise TrackingServerDown(
            f"the MLflow tracking server {uri} (Airflow connection {conn_id!r}) does not answer ({reason}); "
            "nothing was logged and the exported model is untouched, and Airflow retries this task. Fix: start "
            "the server, or point the connection's host at the one that runs") from None


def run_url(tracking: str, experiment_id: str, run_id: str) -> str:
    """The MLflow UI page of a run."""
    return f"{tracking.rstrip('/')}/#/experiments/{quote(experiment_id)}/runs/{quote(run_id)}"


def version_url(tracking: str, model_name: str, version: str | int) -> str:
    """The MLflow UI page of a registered model version."""
    return f"{tracking.rstrip('/')}/#/models/{quote(model_name, safe='')}/versions/{version}"


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= PARAM_VALUE_MAX else text[:PARAM_VALUE_MAX - 3] + "..."


def run_params(settings: Mapping[str, Mapping[str, Any] | None], airflow_run_id: str) -> dict[str, str]:
    """``<section>.<field>`` of each resolved stage-config section (``training``, ``evaluation``), and
    ``airflow_run_id``; nested values as JSON."""
    params = {f"{section}.{name}": _param_value(value)
              for section, fields in settings.items() for name, value in sorted((fields or {}).items())}
    params["airflow_run_id"] = airflow_run_id
    return params


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def epoch_metrics(history: Iterable[Mapping[str, Any]]) -> list[tuple[str, float, int]]:
    """``(key, value, step)`` per measured field of each ``metrics.json`` epoch record, the epoch as step."""
    return [(key, number, record["epoch"]) for record in history if isinstance(record.get("epoch"), int)
            for key, value in sorted(record.items()) if key not in _NOT_METRICS and (number := _number(value)) is not None]


def evaluation_metrics(evaluation: Mapping[str, Any] | None) -> dict[str, float]:
    """The evaluate stage's metrics as ``eval_<name>`` (apart from training's ``accuracy``, ``loss``)."""
    metrics = (evaluation or {}).get("metrics") or {}
    return {f"eval_{k}": n for k, v in sorted(metrics.items()) if (n := _number(v)) is not None}


def evaluation_tags(evaluation: Mapping[str, Any] | None) -> dict[str, str]:
    """The blessing decision: blessed or not, on which metric against which threshold, and why."""
    if not evaluation:
        return {}
    tags = {BLESSED_TAG: str(bool(evaluation.get("blessed"))).lower()}
    for key in ("metric", "threshold", "tolerance", "reason"):
        if evaluation.get(key) is not None:
            tags[f"tfpipe.blessing.{key}"] = str(evaluation[key])[:5000]
    return tags


def engine_source(docker_url: str, host_path: str) -> str:
    """A version's source on a Docker engine's host: ``docker-host://<engine host>/<path>``
    (``localhost`` for an engine on a unix socket)."""
    host = urlsplit(docker_url).hostname if docker_url.startswith(("tcp://", "http://", "https://")) else None
    return f"{ENGINE_HOST_SCHEME}://{host or 'localhost'}{posixpath.normpath('/' + host_path.lstrip('/'))}"


def version_tags(*, dag_id: str, run_id: str, metadata: Mapping[str, Any] | None, image: str,
                 fingerprint: str | None, host_path: str | None, export_version: int) -> dict[str, str]:
    """The lineage of a registered version: the Airflow run, the data set's fingerprint, the image
    (reference, id and registry digest, as the version's ``metadata.json`` records them) and where
    the files lie. ``metadata`` wins over the run's own view (``image``, ``fingerprint``)."""
    metadata = metadata or {}
    recorded = metadata.get("image") or {}
    tags = {
        DAG_ID_TAG: dag_id, RUN_ID_TAG: run_id, "tfpipe.export_version": str(export_version),
        "tfpipe.data_fingerprint": (metadata.get("data") or {}).get("fingerprint") or fingerprint,
        "tfpipe.image": recorded.get("reference") or image,
        "tfpipe.image_id": recorded.get("id"),
        "tfpipe.image_digest": recorded.get("repo_digest"),
        "tfpipe.host_path": host_path,
    }
    return {k: str(v) for k, v in tags.items() if v not in (None, "")}


# --- against the tracking server ----------------------------------------------------------------

def experiment_id(mlflow: Any, name: str) -> str:
    """The id of experiment ``name``, created when missing (a concurrent creator may win: then its id)."""
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            mlflow.restore_experiment(found.experiment_id)
        return found.experiment_id
    try:
        return mlflow.create_experiment(name, tags={DAG_ID_TAG: name})
    except Exception:
        found = mlflow.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


def find_run(mlflow: Any, experiment: str, dag_id: str, run_id: str) -> Any | None:
    """The MLflow run that records Airflow run ``run_id`` of ``dag_id``, if one was logged."""
    quoted = run_id.replace("'", "\\'")
    runs = mlflow.search_runs([experiment], filter_string=f"tags.`{RUN_ID_TAG}` = '{quoted}'", max_results=5)
    runs = [r for r in runs if r.data.tags.get(DAG_ID_TAG) == dag_id]
    return runs[0] if runs else None


def log_run(mlflow: Any, *, experiment: str, dag_id: str, run_id: str, run_name: str, params: Mapping[str, str],
            tags: Mapping[str, str], epochs: list[tuple[str, float, int]], metrics: Mapping[str, float],
            artifacts: Mapping[str, bytes], log: Any) -> Any:
    """Log one Airflow run as a FINISHED MLflow run and return it. A finished run of the same Airflow
    run is returned as it is; an unfinished one (a try that died while logging) is replaced."""
    import tempfile
    import time
    from pathlib import Path

    from mlflow.entities import Metric, Param

    existing = find_run(mlflow, experiment, dag_id, run_id)
    if existing is not None and existing.info.status == "FINISHED":
        log.info("MLflow run %s already records this Airflow run: not logged again", existing.info.run_id)
        return existing
    if existing is not None:
        log.info("replacing MLflow run %s, left unfinished by an earlier try", existing.info.run_id)
        mlflow.delete_run(existing.info.run_id)
    run = mlflow.create_run(experiment, run_name=run_name, tags={**tags, DAG_ID_TAG: dag_id, RUN_ID_TAG: run_id})
    mlflow_run_id = run.info.run_id
    now = int(time.time() * 1000)
    entries: list[Any] = [Param(k, v) for k, v in params.items()]
    entries += [Metric(k, v, now, step) for k, v, step in epochs]
    entries += [Metric(k, v, now, 0) for k, v in metrics.items()]
    for start in range(0, len(entries), _BATCH):
        chunk = entries[start:start + _BATCH]
        mlflow.log_batch(mlflow_run_id, params=[e for e in chunk if isinstance(e, Param)],
                         metrics=[e for e in chunk if isinstance(e, Metric)], tags=[])
    with tempfile.TemporaryDirectory(prefix="tfpipe-mlflow-") as tmp:
        for name, data in artifacts.items():
            path = Path(tmp) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if artifacts:
            mlflow.log_artifacts(mlflow_run_id, tmp)
    mlflow.set_terminated(mlflow_run_id, "FINISHED")
    return mlflow.get_run(mlflow_run_id)


def register_version(mlflow: Any, *, model_name: str, source: str, mlflow_run_id: str, tags: Mapping[str, str],
                     alias: str | None, log: Any) -> Any:
    """Register ``source`` as a new version of ``model_name`` (created when missing) with ``tags``, then
    point ``alias`` at it unless the alias holds a newer export already (``tfpipe.export_version``: runs
    registering at once, or a late retry, never move the champion back). The version an earlier try
    registered for the same MLflow run is reused."""
    from mlflow.exceptions import MlflowException

    try:
        mlflow.create_registered_model(model_name, tags={"tfpipe.model_name": model_name})
    except MlflowException as err:
        if err.error_code != "RESOURCE_ALREADY_EXISTS":
            raise
    earlier = [v for v in mlflow.search_model_versions(f"name = '{model_name}' and run_id = '{mlflow_run_id}'")
               if v.source == source]
    if earlier:
        version = earlier[0]
        log.info("version %s of %s already registered for this run", version.version, model_name)
    else:
        version = mlflow.create_model_version(model_name, source, run_id=mlflow_run_id, tags=dict(tags))
        log.info("registered %s version %s from %s", model_name, version.version, source)
    if alias:
        current = _aliased(mlflow, model_name, alias)
        if current is not None and _export_version(current) > _export_version(version):
            # a newer export registered first (runs at once, or this is a late retry): the champion stays
            log.info("alias %r of %s stays on version %s (export %s is newer than this one's %s)", alias,
                     model_name, current.version, _export_version(current), _export_version(version))
        else:
            mlflow.set_registered_model_alias(model_name, alias, version.version)
            log.info("alias %r of %s -> version %s", alias, model_name, version.version)
    return version


def _aliased(mlflow: Any, model_name: str, alias: str) -> Any:
    from mlflow.exceptions import MlflowException

    try:
        return mlflow.get_model_version_by_alias(model_name, alias)
    except MlflowException as err:
        if err.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def _export_version(model_version: Any) -> int:
    """The models-volume version a registered version came from (its ``tfpipe.export_version`` tag; 0 when
    it has none, as for a version registered by hand)."""
    try:
        return int((model_version.tags or {}).get("tfpipe.export_version", 0))
    except ValueError:
        return 0
