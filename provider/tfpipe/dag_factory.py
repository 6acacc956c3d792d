"""The DAG factory: a :class:`~tfpipe.config.PipelineConfig` becomes prep -> validate -> train -> evaluate -> export.

The graph is planned as plain :class:`~tfpipe.specs.StageSpec` objects, then each becomes an operator here.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.providers.common.compat.sdk import DAG, Asset, BaseOperator, Param, TriggerRule

from tfpipe import compat, contract
from tfpipe.config import IMAGE_VARIABLE, PipelineConfig
from tfpipe.operators.docker import TRIAL_LABEL_KEY, stage_operator
from tfpipe.specs import StageSpec, plan_pipeline

GPU_PARAM_PATTERN = r"^(all|none|[0-9]+|[0-9]+(,[0-9]+)+)$"
GCS_PARAM_PATTERN = r"^gs://"


_PARAM_TYPES = {"int": "integer", "number": "number", "bool": "boolean", "str": "string"}

def schema_param(section: str, name: str, value: Any, **form: Any) -> Param:
    """A trigger-form Param of a stage-config field (type, bounds, choices from the contract) holding
    ``value``; ``form`` adds the title, description or a narrower ``enum``."""
    spec = contract.SECTIONS[section][name]
    rules: dict[str, Any] = {"type": _PARAM_TYPES[spec["kind"]]}
    if "choices" in spec:
        rules["enum"] = list(spec["choices"])
    for key, schema_key in (("minimum", "minimum"), ("exclusive_minimum", "exclusiveMinimum"),
                            ("exclusive_maximum", "exclusiveMaximum")):
        if key in spec:
            rules[schema_key] = spec[key]
    if "maximum" in spec or "parse_maximum" in spec:
        rules["maximum"] = spec.get("maximum", spec.get("parse_maximum"))
    return Param(value, **{**rules, "description": spec["doc"][:1].upper() + spec["doc"][1:] + ".", **form})


def pipeline_params(cfg: PipelineConfig) -> dict[str, Param]:
    """Run parameters of the trigger form: every stage-config field the contract marks ``override: "param"``."""
    t, e = cfg.training, cfg.evaluation
    models = [m for m in contract.BUILTIN_MODELS if (m == "mlp") == (cfg.data.format in contract.TABULAR_FORMATS)]
    if t.model not in models:
        models.append(t.model)
    params = {
        "epochs": schema_param("training", "epochs", t.epochs, title="Epochs"),
        "batch_size": schema_param("training", "batch_size", t.batch_size, title="Batch size"),
        "learning_rate": schema_param("training", "learning_rate", t.learning_rate, title="Learning rate"),
        "model": schema_param("training", "model", t.model, enum=models, title="Model",
                              description="Built-in model, or the configured custom model."),
        "optimizer": schema_param("training", "optimizer", t.optimizer, title="Optimizer"),
        "seed": schema_param("training", "seed", t.seed, title="Seed"),
        "mixed_precision": schema_param("training", "mixed_precision", t.mixed_precision,
                                        title="Mixed precision (mixed_float16)"),
        "warm_start": schema_param("training", "warm_start", t.warm_start, title="Warm start"),
        "metric": schema_param("evaluation", "metric", e.metric, title="Blessing metric"),
        "threshold": schema_param("evaluation", "threshold", e.threshold, title="Blessing threshold"),
        "accept_data_change": schema_param("validation", "accept_data_change", cfg.validation.accept_data_change,
                                           title="Accept a data change"),
        "gpus": Param(None, type=["null", "string"], pattern=GPU_PARAM_PATTERN, title="GPUs",
                           description="Empty = as configured; 'none' = CPU; 'all'; a count such as '2'; or ids '0,1'."),
    }
    stage_in, publish = bucket_tasks(cfg)
    # Google Cloud Storage, only where the DAG has the task: empty = the config's data_uri / publish_uri
    if stage_in:
        params["data_uri"] = Param(None, type=["null", "string"], pattern=GCS_PARAM_PATTERN,
                                        title="Data URI",
                                        description="gs://bucket/prefix synced to the data path before prep. "
                                        f"Empty = {cfg.data_uri or 'none (use the data volume as it is)'}.")
    if publish:
        params["publish_uri"] = Param(None, type=["null", "string"], pattern=GCS_PARAM_PATTERN,
                                           title="Publish URI",
                                           description="gs://bucket/prefix a blessed export is published under "
                                           f"(<prefix>/{cfg.export.model_name}/<version>/). Empty = "
                                           f"{cfg.publish_uri or 'none'}.")
    return params


def bucket_tasks(cfg: PipelineConfig) -> tuple[bool, bool]:
    """Whether the DAG of ``cfg`` has ``stage_in`` and ``publish``: each where its URI is configured, both
    with ``gcs_tasks``; never off Docker (they work through its engine)."""
    if cfg.backend != "docker":
        return False, False
    return cfg.gcs_tasks or cfg.data_uri is not None, cfg.gcs_tasks or cfg.publish_uri is not None


def _doc_md(cfg: PipelineConfig, params: dict[str, Param]) -> str:
    return f"""### {cfg.dag_id}

{cfg.description}

**prep -> validate -> train -> evaluate -> export**, each stage a container of {_image_doc(cfg)}.

| volume | host path | in the container |
| --- | --- | --- |
| data (read-only) | `{cfg.volumes.data}` | `/data` |
| work | `{cfg.volumes.work}` | `/work` (datasets, `runs/<dag>/<run>/`, checkpoints) |
| models | `{cfg.volumes.models}` | `/models/{cfg.export.model_name}/<version>/` |

The data gate, `validate`, compares the prepared data with the data the production model trained
on (schema, missing values, drift, labels, row count) and stops the run before training when they
differ beyond the `validation` thresholds ({cfg.validation.on_anomaly}); the `accept_data_change`
parameter lets one run through a real change.

Training checkpoints live under the run (never the try): a retried or cleared `train` resumes
from its newest checkpoint; a new run starts fresh unless `warm_start` is set. Evaluation
blesses a candidate with {cfg.evaluation.metric} >= {cfg.evaluation.threshold} and no worse than the
current model by more than {cfg.evaluation.tolerance}; otherwise export is skipped.
{_pool_doc(cfg)}{_sweep_doc(cfg)}

Trigger parameters (the run's `conf` overrides them; empty keeps the configured value):

{_params_table(params)}

{_gcs_doc(cfg)}{_cleanup_doc(cfg)}
Seeing and reproducing a run: `train`, `evaluate` and `export` link to the **Run report** and
**TensorBoard** (serve it with `tfpipe tensorboard {cfg.dag_id} <run_id>`); `tfpipe shell
{cfg.dag_id} <task> --run <run_id>` opens a shell in a container set up as that task's.
"""


def _gcs_doc(cfg: PipelineConfig) -> str:
    stage_in, publish = bucket_tasks(cfg)
    lines = []
    if stage_in:
        lines.append("`stage_in` syncs `data_uri` to the data path before prep")
    if publish:
        lines.append("`publish` uploads a blessed export to `publish_uri`")
    if not lines:
        return ""
    return f"Google Cloud Storage: {'; '.join(lines)}; each skips itself when no URI is set.\n\n"


def _cleanup_doc(cfg: PipelineConfig) -> str:
    if not (cfg.retention.enabled and cfg.backend == "docker"):
        return ""
    return (f"`cleanup` applies the work volume's retention (keep the newest {cfg.retention.keep_runs} runs' "
            "dirs) once the run's data set is ready, beside training, in every run.\n\n")


def _image_doc(cfg: PipelineConfig) -> str:
    if cfg.image.ref:
        return f"`{cfg.image.ref}`"
    return (f"the image named by the Airflow Variable `{IMAGE_VARIABLE}` (read when each task runs; "
            f"`airflow variables set {IMAGE_VARIABLE} REF`)")


def _pool_doc(cfg: PipelineConfig) -> str:
    if not cfg.gpu_pool:
        return "`train` runs in Airflow's default pool."
    return (f"`train` runs in the pool `{cfg.gpu_pool}`, which must exist or it is never scheduled: "
            f"`airflow pools set {cfg.gpu_pool} 1 \"GPU training slots\"`.")


def _sweep_doc(cfg: PipelineConfig) -> str:
    if not cfg.tuning.enabled:
        return ""
    tuned = ", ".join(f"`{key}`" for key in cfg.tuning.space)
    return (f"\n\nA sweep: `train` is {len(cfg.tuning.trial_plan())} mapped trials ({cfg.tuning.search} search over "
            f"{tuned}), {cfg.tuning.parallel} at a time; `select` picks the best by `{cfg.tuning.metric}`, and the "
            "gate and export take that trial's model. A tuned setting's run parameter is ignored: the trial's value wins.")


def _params_table(params: dict[str, Param]) -> str:
    rows = ["| param | default | meaning |", "| --- | --- | --- |"]
    for name, param in params.items():
        meaning = param.description or param.schema.get("title", "")
        enum = param.schema.get("enum")
        if enum:
            meaning += " One of: " + ", ".join(f"`{v}`" for v in enum) + "."
        default = "(as configured)" if param.value is None else f"`{param.value}`"
        meaning = meaning.replace("|", "/").replace("<", "&lt;").replace(">", "&gt;")
        rows.append(f"| `{name}` | {default} | {meaning} |")
    return "\n".join(rows)


def _schedule(cfg: PipelineConfig) -> Any:
    if cfg.data_asset and cfg.schedule:
        return compat.AssetOrTimeSchedule(timetable=compat.CronTriggerTimetable(cfg.schedule, timezone="UTC"),
                                          assets=[Asset(cfg.data_asset)])
    if cfg.data_asset:
        return [Asset(cfg.data_asset)]
    return cfg.schedule


def operator_from_spec(spec: StageSpec, cfg: PipelineConfig) -> Any:
    """Turn one stage spec into its operator on ``cfg.backend`` (``cfg`` only says where the backend is)."""
    kwargs: dict[str, Any] = {}
    if spec.retries > 1:
        kwargs.update(retry_exponential_backoff=compat.doubling_backoff(), max_retry_delay=timedelta(hours=1))
    if spec.pool:
        kwargs["pool"] = spec.pool
    if spec.outlets:
        kwargs["outlets"] = [Asset(uri) for uri in spec.outlets]
    common = dict(task_id=spec.task_id, spec=spec, retries=spec.retries,
                  retry_delay=timedelta(seconds=spec.retry_delay_seconds), doc_md=spec.doc_md, **kwargs)
    if cfg.backend == "kubernetes":
        from tfpipe.operators.kubernetes import POD_OPERATORS  # the optional extra, only when chosen

        return POD_OPERATORS[spec.stage](kubernetes=cfg.kubernetes, **common)
    docker = dict(docker_url=cfg.docker_url, allow_floating_tag=cfg.image.allow_floating_tag, **common)
    if spec.stage == "prep_shard":  # one mapped task instance per slice of the input files
        shards = range(spec.config["data"]["shards"])
        if not cfg.shard_docker_urls:
            return stage_operator(spec.stage).partial(**docker).expand(shard_index=list(shards))
        del docker["docker_url"]  # each instance gets its own engine
        return stage_operator(spec.stage).partial(engine_from_shard_list=True, **docker).expand_kwargs(
            [{"shard_index": k, "docker_url": cfg.shard_engine(k)} for k in shards])
    if spec.stage == "train" and cfg.tuning.enabled:  # one mapped task instance per trial
        return stage_operator(spec.stage).partial(
            max_active_tis_per_dagrun=cfg.tuning.parallel, map_index_template="{{ %s }}" % TRIAL_LABEL_KEY,
            **docker).expand(trial=cfg.tuning.trial_plan())
    if spec.stage == contract.SELECT_STAGE:
        # A trial that fails for good (a learning rate that diverges) is a finding of the sweep, not a reason
        # to stop it: select chooses among the trials that finished. Airflow 3.0 lacks that trigger rule;
        # there select also runs when no trial trained, and fails saying so.
        docker["trigger_rule"] = getattr(TriggerRule, "ALL_DONE_MIN_ONE_SUCCESS", TriggerRule.ALL_DONE)
    return stage_operator(spec.stage)(**docker)


def training_pipeline(cfg: PipelineConfig, **dag_kwargs: Any) -> DAG:
    """Build the training DAG for ``cfg``.

    Extra keyword arguments go to ``DAG`` and win over tfpipe's own choices; ``default_args`` reach every
    task, which is how callbacks and notifiers are attached.
    """
    if not isinstance(cfg, PipelineConfig):
        cfg = PipelineConfig.from_dict(cfg)
    params = pipeline_params(cfg)  # built once: the doc's table describes the same Params
    options: dict[str, Any] = dict(
        dag_id=cfg.dag_id,
        schedule=_schedule(cfg),
        start_date=cfg.start_date,
        catchup=False,
        max_active_runs=1,
        params=params,
        doc_md=_doc_md(cfg, params),
        description=cfg.description,
        tags=list(cfg.tags),
    )
    options.update(dag_kwargs)
    schedule = options.pop("schedule")
    dag = DAG(schedule=schedule, **options)
    with dag:
        specs = plan_pipeline(cfg)
        operators = {spec.task_id: operator_from_spec(spec, cfg) for spec in specs}
        for spec in specs:
            for upstream in spec.upstream:
                operators[upstream] >> operators[spec.task_id]
        _add_gcs_tasks(cfg, operators)
        if cfg.retention.enabled and cfg.backend == "docker":  # the cleanup helper needs a Docker engine
            add_cleanup_task(cfg, dag)
        if cfg.mlflow.enabled and cfg.backend == "docker":  # it reads the run's files through a Docker engine
            add_register_task(cfg, dag)
    return dag


def add_cleanup_task(cfg: PipelineConfig, dag: DAG) -> BaseOperator:
    """``cleanup`` as a teardown beside training, once the run's data set is ready: by then the run's dir
    names its data set, so retention never removes the one this run trains on."""
    from tfpipe.operators.retention import RetentionOperator

    ready = dag.get_task("train").upstream_list or [task for task in dag.tasks if not task.upstream_list]
    cleanup = RetentionOperator(
        task_id="cleanup", image=cfg.image.ref, allow_floating_tag=cfg.image.allow_floating_tag,
        work_volume=cfg.volumes.work, models_volume=cfg.volumes.models, model_name=cfg.export.model_name,
        retention=cfg.retention, docker_url=cfg.docker_url, retries=1,
        retry_delay=timedelta(seconds=cfg.retry_delay_seconds), doc_md=CLEANUP_DOC,
    ).as_teardown()
    ready >> cleanup
    return cleanup


CLEANUP_DOC = (
    "**cleanup** applies the work volume's retention in every run, also one that fails: once the run's data set "
    "is ready it runs beside training (off the run's critical path) and keeps the run dirs of the newest "
    "`retention.keep_runs` runs, of runs whose model version is still kept and of runs still active (this "
    "one included), and the data sets they use plus the newest; it removes the rest (checkpoints and "
    "TensorBoard events with their run) from a helper container on the engine, and logs each removal and "
    "the bytes freed. A version this run's export replaces frees its run's dir at the next run's cleanup."
)


# --- Google Cloud Storage -------------------------------------------------------------------------

def _add_gcs_tasks(cfg: PipelineConfig, operators: dict[str, Any]) -> None:
    """``stage_in >> prep`` and ``export >> publish`` where :func:`bucket_tasks` says so; prep runs
    ``none_failed`` so a skipped stage-in does not skip it."""
    with_stage_in, with_publish = bucket_tasks(cfg)
    if not (with_stage_in or with_publish):
        return
    from tfpipe.operators.gcs import GcsPublishOperator, GcsStageInOperator

    common: dict[str, Any] = dict(
        image=cfg.image.ref, allow_floating_tag=cfg.image.allow_floating_tag, gcp_conn_id=cfg.gcp_conn_id,
        docker_url=cfg.docker_url, retries=2, retry_delay=timedelta(seconds=cfg.retry_delay_seconds),
    )
    if with_stage_in:
        stage_in = GcsStageInOperator(
            task_id="stage_in", data_volume=cfg.volumes.data, data_path=cfg.data.path, source_uri=cfg.data_uri,
            user=cfg.resources.user, doc_md=GCS_DOCS["stage_in"], **common)
        prep = operators["prep"] if "prep" in operators else operators["prep_shard"]
        prep.trigger_rule = TriggerRule.NONE_FAILED
        stage_in >> prep
    if with_publish:
        publish = GcsPublishOperator(
            task_id="publish", models_volume=cfg.volumes.models, model_name=cfg.export.model_name,
            destination_uri=cfg.publish_uri, export_task_id="export", doc_md=GCS_DOCS["publish"], **common)
        operators["export"] >> publish


GCS_DOCS = {
    "stage_in": (
        "**stage_in** syncs the run's `data_uri` (else the config's) from Google Cloud Storage to the data "
        "path on the data volume, through the Docker engine: only new or changed objects are downloaded, "
        "deleted ones are removed. Skipped when no URI is set; prep then reads the volume as it is."
    ),
    "publish": (
        "**publish** uploads the exported version to `<publish_uri>/<model_name>/<version>/` and writes the "
        "`_COMPLETE` marker last; a retry completes an interrupted upload. Skipped when no URI is set or "
        "nothing was exported."
    ),
}


# --- MLflow ---------------------------------------------------------------------------------------

def add_register_task(cfg: PipelineConfig, dag: DAG) -> BaseOperator:
    """``register`` after ``export`` (after ``publish`` where the DAG has it), ``none_failed``: a skipped
    export (not blessed) still gets its run logged; a failed one stops it. Its own task, so it is retried
    alone and a failure never touches the exported files."""
    from tfpipe.operators.register import RegisterOperator

    register = RegisterOperator(
        task_id="register", image=cfg.image.ref, allow_floating_tag=cfg.image.allow_floating_tag,
        volumes=cfg.volumes, model_name=cfg.export.model_name, conn_id=cfg.mlflow.conn_id, docker_url=cfg.docker_url,
        prep_task_id="prep" if "prep" in dag.task_ids else "prep_merge",
        publish_task_id="publish" if "publish" in dag.task_ids else None,
        trigger_rule=TriggerRule.NONE_FAILED, retries=2, retry_delay=timedelta(seconds=cfg.retry_delay_seconds),
        doc_md=REGISTER_DOC,
    )
    dag.get_task("publish" if "publish" in dag.task_ids else "export") >> register
    return register


REGISTER_DOC = (
    "**register** logs the run to MLflow, in the experiment named after the DAG: the resolved training and "
    "evaluation settings and the Airflow run id as params, the per-epoch training metrics, the evaluation "
    "metrics, the blessing decision as tags and the run report as artifacts. A blessed export becomes a new "
    "version of the registered model `export.model_name` (its source the version's files, its tags the "
    "run's lineage) and takes the alias `champion`; an unblessed candidate is logged, never registered. "
    "Skipped when the Airflow connection `mlflow.conn_id` (`mlflow_default`) does not exist."
)
