"""The export is usable outside tfpipe: a current TensorFlow, installed in its own venv as a user's
serving code would install it (tests/tf_client.py), loads the SavedModel the TF 2.9 trainer image
exported and answers raw rows the way the image itself does."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from pathlib import Path

import pytest

from tests.conftest import DIGITS_CSV, run_dag, write_dag
from tests.tf_client import ENSURE_SCRIPT, Answer, CLIENT_PROGRAM, ensure_client, parse_answer, request, serve, signature_rows

pytestmark = pytest.mark.integration

#: Raw rows sent to the digits model: few, since each answer costs a TensorFlow start-up, not a batch.
DIGIT_ROWS = 2
#: A mixed table as a user's CSV holds it: a numeric column with empty cells and an ``NA`` text, a
#: text category with an empty cell, a yes/no column and an id to ignore; ``churn`` is the label.
MIXED_HEADER = ("customer_id", "tenure", "plan", "autopay", "churn")
MIXED_PLANS = ("basic", "standard", "premium")
#: Raw rows the mixed model is asked about, as a CSV reader (or None: a JSON null) gives them: every
#: kind of cell the signature takes raw, missing ones, an unseen category and a boolean in another case
#: among them. A float input takes no text: ``NA`` in a number's cell is the client's to read as missing.
MIXED_QUESTIONS = [
    {"customer_id": "q1", "tenure": "3.5", "plan": "basic", "autopay": "no"},
    {"customer_id": "q2", "tenure": "", "plan": " premium ", "autopay": "YES"},
    {"customer_id": "q3", "tenure": None, "plan": "platinum", "autopay": ""},
    {"customer_id": "q4", "tenure": "48", "plan": "", "autopay": "yes"},
]


def write_mixed_csv(path: Path, rows: int = 240) -> None:
    """A learnable churn-like table of :data:`MIXED_HEADER`: short tenure on the basic plan churns."""
    path.parent.mkdir(parents=True)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(MIXED_HEADER)
        for i in range(rows):
            plan, tenure, autopay = MIXED_PLANS[i % 3], (i * 7) % 60, i % 4 < 2
            churn = int((plan == "basic") + (tenure < 20) + (not autopay) >= 2)
            writer.writerow([f"c{i:04d}", "" if i % 9 == 4 else "NA" if i % 11 == 5 else tenure,
                             "" if i % 13 == 6 else plan, "yes" if autopay else "no", churn])


@pytest.fixture(scope="session")
def tf_client() -> Path:
    """The outside client's Python (.cache/tf-client), built on first use; fails when it cannot be."""
    return ensure_client()


def export_through_airflow(dag_id: str, home: Path, image: str, dags: Path, **config) -> Path:
    """Train and export ``dag_id`` (the digits pipeline with ``config`` overrides, one epoch, any
    trained model blessed) through Airflow; the exported version's directory."""
    write_dag(dags, dag_id, training={"model": "mlp", "epochs": 1, "batch_size": 64},
              evaluation={"threshold": 0.0, "tolerance": 1.0}, **config)
    summary, log = run_dag(dag_id, {}, home=home, image=image, dags_folder=dags)
    assert summary["state"] == "success" and summary["model_dir"], log[-8000:]
    model_dir = Path(summary["model_dir"])
    assert model_dir.parent == home / "models" / dag_id  # TF Serving's <model_name>/<version>/
    return model_dir


def served_in_image(docker_client, image: str, model_dir: Path, rows: list[dict]) -> Answer:
    """The trainer image's own answer (TF 2.9): the client's program, SavedModel and rows, run there."""
    out = docker_client.containers.run(
        image, ["python3", "-c", CLIENT_PROGRAM, request("/model", rows)], remove=True, network_mode="none",
        environment={"TF_CPP_MIN_LOG_LEVEL": "2"}, volumes={str(model_dir): {"bind": "/model", "mode": "ro"}})
    return parse_answer(out.decode())


def assert_same_answers(outside: Answer, inside: Answer, rows: int, class_names: list[str]) -> None:
    """The outside client ran a current TensorFlow (>= 2.15) and the image 2.9; both answer each row
    with one probability per class, summing to 1, the same classes and probabilities within 1e-4."""
    major, minor = (int(part) for part in outside.tf_version.split(".")[:2])
    assert (major, minor) >= (2, 15), f"the client ran TensorFlow {outside.tf_version}, not a current one"
    assert inside.tf_version.startswith("2.9."), inside.tf_version
    assert len(outside.probabilities) == rows
    for probabilities in outside.probabilities:
        assert len(probabilities) == len(class_names) and all(math.isfinite(p) for p in probabilities)
        assert sum(probabilities) == pytest.approx(1.0, abs=1e-4)
    argmax = [max(range(len(p)), key=p.__getitem__) for p in outside.probabilities]
    assert argmax == [max(range(len(p)), key=p.__getitem__) for p in inside.probabilities]
    assert outside.class_name == inside.class_name == [class_names[i] for i in argmax]
    for ours, theirs in zip(outside.probabilities, inside.probabilities):
        assert ours == pytest.approx(theirs, abs=1e-4)


def test_a_current_tensorflow_in_its_own_venv_serves_raw_digit_rows_like_the_trainer_image(
        tf_client, tfpipe_home, trainer_image, tmp_path, docker_client):
    """A digits model trained and exported through Airflow (one epoch) is loaded by TensorFlow >= 2.15
    from the client venv; its ``serving_default`` signature takes two raw CSV rows (text cells, built
    into float tensors by the signature's own input names and dtypes) and answers, per row, one
    probability per class of metadata.json, summing to 1; the classes match the TF 2.9 image's answer
    on the same SavedModel and rows, and so do the probabilities (within 1e-4)."""
    model_dir = export_through_airflow("tfpipe_test_client", tfpipe_home, trainer_image, tmp_path / "dags")
    class_names = json.loads((model_dir / "metadata.json").read_text())["signature"]["class_names"]
    with open(DIGITS_CSV, newline="") as handle:
        raw = [row for row, _ in zip(csv.DictReader(handle), range(DIGIT_ROWS))]
    rows = signature_rows(model_dir, raw)
    assert set(rows[0]) == set(raw[0]) - {"label"}

    outside = serve(model_dir, rows, python=tf_client)

    assert_same_answers(outside, served_in_image(docker_client, trainer_image, model_dir, rows), DIGIT_ROWS,
                        class_names)


def test_a_current_tensorflow_serves_raw_strings_and_empty_cells_of_a_mixed_table_like_the_image(
        tf_client, tfpipe_home, trainer_image, tmp_path, docker_client):
    """A model of a table with a text category, a yes/no column and a numeric column with gaps, trained
    and exported through Airflow, takes the raw cells from the client venv's current TensorFlow: the
    category and the yes/no as strings, the number as a float, ``""`` and None as missing, an
    unseen category and ``YES`` too; it answers each row with finite probabilities of both classes
    summing to 1, the same as the TF 2.9 image's on the same SavedModel and rows."""
    write_mixed_csv(tfpipe_home / "data" / "mixed" / "churn.csv")
    model_dir = export_through_airflow(
        "tfpipe_test_client_mixed", tfpipe_home, trainer_image, tmp_path / "dags",
        data={"path": "mixed/churn.csv", "label": "churn",
              "columns": {"customer_id": "ignore", "plan": "categorical", "autopay": "boolean"}})
    signature = json.loads((model_dir / "metadata.json").read_text())["signature"]
    assert {name: spec["dtype"] for name, spec in signature["inputs"].items()} == {
        "tenure": "float32", "plan": "string", "autopay": "string"}, "the table's columns reach the signature"
    rows = signature_rows(model_dir, MIXED_QUESTIONS)

    outside = serve(model_dir, rows, python=tf_client)

    assert_same_answers(outside, served_in_image(docker_client, trainer_image, model_dir, rows),
                        len(MIXED_QUESTIONS), signature["class_names"])


def test_the_client_venv_is_reused_while_its_lock_and_python_are_unchanged(tf_client):
    """Once built, scripts/ensure-tf-client.sh finds the venv ready (same lock hash, same Python), says
    so and leaves it as it is, without pip: `make test` may call it on every run."""
    stamp = tf_client.parent.parent / ".built-from"
    before = stamp.stat().st_mtime_ns
    proc = subprocess.run([str(ENSURE_SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ensure-tf-client: ") and "is ready (tensorflow-cpu " in proc.stdout
    assert stamp.stat().st_mtime_ns == before
