"""Bench only: ``dags/tfpipe_digits.py`` as a user would write it by hand, without tfpipe.

``dag_parse_ratio`` times the parse of this file against the parse of ``dags/tfpipe_digits.py``:
the same tasks (prep, validate, train, evaluate, export and the cleanup teardown beside training, each
a ``DockerOperator`` of the trainer image), the same schedule, retries and trigger rules, the
same asset (the model, emitted by export, which other DAGs may be scheduled on), the
same eleven Params (schemas, titles, descriptions) and docs of about the same size, all
written out literally. Nothing here is deployed: its dag_id says so.
"""

# ruff: noqa: E501  (the doc's Markdown table rows are as long as the generated ones)
import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.providers.docker.operators.docker import DockerOperator
from airflow.sdk import DAG, Asset, Param
from docker.types import Mount

HOME = os.environ.get("TFPIPE_HOME") or str(Path(__file__).resolve().parent.parent.parent / ".demo")
IMAGE = "{{ var.value.tfpipe_image }}"
GPUS = r"^(all|none|[0-9]+|[0-9]+(,[0-9]+)+)$"

DOC = f"""### bench_handwritten_digits

Nightly retraining of the UCI digits classifier

**prep -> validate -> train -> evaluate -> export**, each stage a container of the image named by the Airflow
Variable `tfpipe_image` (read when each task runs; `airflow variables set tfpipe_image REF`).

| volume | host path | in the container |
| --- | --- | --- |
| data (read-only) | `{HOME}/data` | `/data` |
| work | `{HOME}/work` | `/work` (datasets, `runs/<dag>/<run>/`, checkpoints) |
| models | `{HOME}/models` | `/models/digits/<version>/` |

The data gate, `validate`, stops the run before training when the prepared data differs from the
production model's beyond its thresholds; `accept_data_change` lets one run through a real change.

Training checkpoints live under the run (never the try): a retried or cleared `train` resumes
from its newest checkpoint; a new run starts fresh unless `warm_start` is set. Evaluation
blesses a candidate with accuracy >= 0.95 and no worse than the
current model by more than 0.02; otherwise export is skipped.
`train` runs in Airflow's default pool.

Trigger parameters (the run's `conf` overrides them; empty keeps the configured value):

| param | default | meaning |
| --- | --- | --- |
| `epochs` | `15` | Target number of epochs; a resumed run trains until it. |
| `batch_size` | `32` | Global batch size (split across GPUs). |
| `learning_rate` | `0.002` | Learning rate of the optimizer. |
| `model` | `mlp` | Built-in model, or the configured custom model. One of: `mlp`. |
| `optimizer` | `adam` | Optimizer of the training loop. One of: `adam`, `sgd`, `rmsprop`. |
| `seed` | `42` | Random seed: weight initialisation, and the data order (epoch e is shuffled with seed + e). |
| `mixed_precision` | `False` | Train with the mixed_float16 policy (float16 compute, float32 weights). |
| `warm_start` | `False` | Initialise from the newest blessed model instead of from scratch. |
| `metric` | `accuracy` | Metric of the blessing gate (higher is better). One of: `accuracy`, `macro_precision`, `macro_recall`, `macro_f1`, `auc`. |
| `threshold` | `0.95` | Absolute minimum of the metric for a blessing. |
| `accept_data_change` | `False` | Let this run go on despite data anomalies (a real change). |
| `gpus` | (as configured) | Empty = as configured; 'none' = CPU; 'all'; a count such as '2'; or ids '0,1'. |

`cleanup` applies the work volume's retention (keep the newest 10 runs' dirs) once the run's data set is ready, beside training, in every run.

Seeing and reproducing a run: `train`, `evaluate` and `export` write a run report and TensorBoard
events under the run directory; open a shell in a container of the image to look at them.
"""

TASK_DOCS = {
    "prep": "**prep** validates the raw CSV and writes sharded TFRecords, the schema, statistics and the data "
            "fingerprint under `/work/datasets/<fingerprint>/`; a data set already prepared is reused. Bad rows fail "
            "the task without a retry.",
    "validate": "**validate** is the data gate: it compares the prepared data set with the one the production model "
                "(the newest blessed version) trained on: columns gone, new or retyped, missing values, numeric and "
                "text drift, label shift and row count. It exits 14 on an anomaly, which fails the run before any "
                "training, without a retry, and the production model stays; its findings are in the log and in "
                "`validation.json`. Trigger with `accept_data_change` to let a real change through.",
    "train": "**train** trains the model with checkpoints under the run directory; a retried or cleared try "
             "resumes from the newest checkpoint and trains until the target epoch. Open the run report and TensorBoard "
             "events under the run directory.",
    "evaluate": "**evaluate** measures the candidate on the evaluation split and applies the blessing gate; a "
                "candidate that is not blessed exits 10, which skips the export. Its metrics and the decision are written "
                "to `evaluation.json` in the run directory.",
    "export": "**export** writes a new versioned SavedModel with a raw-feature serving signature, its metadata "
              "and report under `/models/digits/<version>/`, renamed into place when complete. Older versions are "
              "never overwritten.",
    "register": "**register** logs the run to MLflow, in the experiment named after the DAG: the training and "
                "evaluation settings and the Airflow run id as params, the per-epoch and evaluation metrics, the "
                "decision as tags and the run report as an artifact. A blessed export becomes a new version of the "
                "registered model, with the alias `champion`; an unblessed one is logged, never registered. It skips "
                "itself when the Airflow connection `mlflow_default` does not exist.",
    "cleanup": "**cleanup** applies the work volume's retention in every run, also one that fails: once the run's "
               "data set is ready it runs beside training and keeps the run dirs of the newest runs, of runs whose "
               "model version is still kept and of active runs, and the data sets they use plus the newest; it "
               "removes the rest from a container on the engine. A version this run's export replaces frees its "
               "run's dir at the next run's cleanup.",
}

mounts = [Mount("/data", f"{HOME}/data", type="bind", read_only=True),
          Mount("/work", f"{HOME}/work", type="bind"),
          Mount("/models", f"{HOME}/models", type="bind")]
params = {
    "epochs": Param(15, type="integer", minimum=1, maximum=100000, title="Epochs",
                    description="Target number of epochs; a resumed run trains until it."),
    "batch_size": Param(32, type="integer", minimum=1, maximum=65536, title="Batch size",
                        description="Global batch size (split across GPUs)."),
    "learning_rate": Param(0.002, type="number", exclusiveMinimum=0, maximum=10, title="Learning rate",
                           description="Learning rate of the optimizer."),
    "model": Param("mlp", type="string", enum=["mlp"], title="Model",
                   description="Built-in model, or the configured custom model."),
    "optimizer": Param("adam", type="string", enum=["adam", "sgd", "rmsprop"], title="Optimizer",
                       description="Optimizer of the training loop."),
    "seed": Param(42, type="integer", minimum=0, title="Seed",
                  description="Random seed: weight initialisation, and the data order (epoch e is shuffled "
                              "with seed + e)."),
    "mixed_precision": Param(False, type="boolean", title="Mixed precision (mixed_float16)",
                             description="Train with the mixed_float16 policy (float16 compute, float32 weights)."),
    "warm_start": Param(False, type="boolean", title="Warm start",
                        description="Initialise from the newest blessed model instead of from scratch."),
    "metric": Param("accuracy", type="string", enum=["accuracy", "macro_precision", "macro_recall", "macro_f1", "auc"],
                    title="Blessing metric", description="Metric of the blessing gate (higher is better)."),
    "threshold": Param(0.95, type="number", minimum=0, maximum=1, title="Blessing threshold",
                       description="Absolute minimum of the metric for a blessing."),
    "accept_data_change": Param(False, type="boolean", title="Accept a data change",
                                description="Let this run go on despite data anomalies (a real change): the run records "
                                "that it accepted them, and its data set becomes the next baseline if its model is "
                                "blessed."),
    "gpus": Param(None, type=["null", "string"], pattern=GPUS, title="GPUs",
                  description="Empty = as configured; 'none' = CPU; 'all'; a count such as '2'; or ids '0,1'."),
}


def container(task_id: str, command: list[str], **kwargs) -> DockerOperator:
    """One task: a container of the trainer image with the three volumes, as the user's uid."""
    return DockerOperator(task_id=task_id, image=IMAGE, command=command, api_version="auto", mounts=mounts,
                          mount_tmp_dir=False, user="1000:1000", shm_size=1 << 30, auto_remove="success",
                          environment={"TFPIPE_PARAMS": "{{ params | tojson }}"}, doc_md=TASK_DOCS[task_id],
                          retry_delay=timedelta(seconds=30), **kwargs)


with DAG("bench_handwritten_digits", description="Nightly retraining of the UCI digits classifier",
         schedule="0 3 * * *", start_date=datetime(2024, 1, 1), catchup=False, max_active_runs=1,
         params=params, doc_md=DOC, tags=["tfpipe", "bench"]) as dag:
    prep = container("prep", ["python3", "-m", "trainer", "prep"], retries=1)
    validate = container("validate", ["python3", "-m", "trainer", "validate"], retries=1)
    train = container("train", ["python3", "-m", "trainer", "train"], retries=3, retry_exponential_backoff=True,
                      max_retry_delay=timedelta(hours=1))
    evaluate = container("evaluate", ["python3", "-m", "trainer", "evaluate"], retries=1, skip_on_exit_code=10)
    export = container("export", ["python3", "-m", "trainer", "export"], retries=1,
                       outlets=[Asset("tfpipe://models/digits")])
    register = container("register", ["python3", "-c", "print('mlflow logging runs on the worker')"], retries=2,
                         trigger_rule="none_failed")
    cleanup = container("cleanup", ["python3", "-m", "trainer.volume_ops", "retention"], retries=1).as_teardown()
    prep >> validate >> train >> evaluate >> export >> register
    validate >> cleanup
