"""A folder of Parquet files through Airflow: prep, train (the built-in ``mlp``), bless and export;
the export, loaded by a current TensorFlow in its own venv (tests/tf_client.py), answers raw rows
with an unseen category and empty cells as the trainer image does."""

from __future__ import annotations

import json
import os

import pytest

from tests.integration.test_outside_client import (
    MIXED_QUESTIONS,
    assert_same_answers,
    export_through_airflow,
    served_in_image,
    tf_client,  # noqa: F401 (a fixture)
    write_mixed_csv,
)
from tests.tf_client import serve, signature_rows

pytestmark = pytest.mark.integration

#: Run in the trainer image, which has pyarrow (the host venv does not): the mixed CSV of
#: ``/in/churn.csv`` as two typed Parquet files in ``/out`` (numbers with nulls where a cell is empty
#: or ``NA``, texts with nulls, yes/no as booleans, the label as integers), of several row groups.
TO_PARQUET = """
import csv, pyarrow as pa, pyarrow.parquet as pq
rows = list(csv.DictReader(open("/in/churn.csv", newline="")))
def table(part):
    return pa.table({
        "customer_id": pa.array([r["customer_id"] for r in part], pa.string()),
        "tenure": pa.array([None if r["tenure"] in ("", "NA") else float(r["tenure"]) for r in part], pa.float64()),
        "plan": pa.array([r["plan"] or None for r in part], pa.string()),
        "autopay": pa.array([r["autopay"] == "yes" for r in part], pa.bool_()),
        "churn": pa.array([int(r["churn"]) for r in part], pa.int64())})
half = len(rows) // 2
for i, part in enumerate((rows[:half], rows[half:])):
    pq.write_table(table(part), "/out/part-%d.parquet" % i, row_group_size=50)
print(len(rows))
"""


def test_a_parquet_folder_trains_blesses_exports_and_serves_raw_rows_to_a_current_tensorflow(
        tf_client, tfpipe_home, trainer_image, tmp_path, docker_client):  # noqa: F811
    """A folder of two Parquet files (a number with nulls, a text category with nulls, booleans)
    is prepared, trained with the mlp, blessed and exported through Airflow; the data set is
    Parquet's, the column types come from the Parquet types (no data.columns but the ignored id);
    the exported signature takes the category and the boolean as strings and the number as a
    float, and the client venv's current TensorFlow answers rows with an unseen category, ``""``
    and None cells with the probabilities the TF 2.9 image gives."""
    source = tmp_path / "csv" / "churn.csv"
    write_mixed_csv(source)
    folder = tfpipe_home / "data" / "churn_parquet"
    folder.mkdir(parents=True)
    out = docker_client.containers.run(
        trainer_image, ["python3", "-c", TO_PARQUET], remove=True, network_mode="none",
        user=f"{os.getuid()}:{os.getgid()}",
        volumes={str(source.parent): {"bind": "/in", "mode": "ro"}, str(folder): {"bind": "/out", "mode": "rw"}})
    assert out.decode().strip() == "240"
    assert sorted(p.name for p in folder.iterdir()) == ["part-0.parquet", "part-1.parquet"]

    model_dir = export_through_airflow(
        "tfpipe_test_parquet", tfpipe_home, trainer_image, tmp_path / "dags",
        data={"path": "churn_parquet", "format": "parquet", "label": "churn",
              "columns": {"customer_id": "ignore"}})

    schemas = [json.loads(p.read_text()) for p in (tfpipe_home / "work").glob("datasets/*/schema.json")]
    assert [s["format"] for s in schemas] == ["parquet"]
    assert {f["name"]: (f["type"], f["source"]) for f in schemas[0]["features"]} == {
        "tenure": ("float", "inferred"), "plan": ("categorical", "inferred"), "autopay": ("boolean", "inferred")}
    signature = json.loads((model_dir / "metadata.json").read_text())["signature"]
    assert {name: spec["dtype"] for name, spec in signature["inputs"].items()} == {
        "tenure": "float32", "plan": "string", "autopay": "string"}
    rows = signature_rows(model_dir, MIXED_QUESTIONS)

    outside = serve(model_dir, rows, python=tf_client)

    assert_same_answers(outside, served_in_image(docker_client, trainer_image, model_dir, rows),
                        len(MIXED_QUESTIONS), signature["class_names"])
