"""An outside client of an exported model: a current TensorFlow in its own venv, as a user's serving
code would load it.

The venv (``.cache/tf-client``, pinned by requirements/tf-client.lock) is built by
scripts/ensure-tf-client.sh. :func:`serve` runs :data:`CLIENT_PROGRAM` there in a fresh, isolated
interpreter: it loads the SavedModel, reads the ``serving_default`` signature's own input names and
dtypes, and sends raw rows, so the same call serves any table the trainer exports (numeric, boolean
and categorical columns, missing cells). The program runs unchanged in the trainer image too, which
lets a test compare the two TensorFlows' answers on the same SavedModel.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parent.parent
ENSURE_SCRIPT = REPO / "scripts" / "ensure-tf-client.sh"
CLIENT_PYTHON = REPO / ".cache" / "tf-client" / "bin" / "python"

#: The client: ``python -c CLIENT_PROGRAM REQUEST``, REQUEST being JSON ``{"model_dir": ..., "rows":
#: [{input name: raw value}, ...]}``; prints one JSON line ``{"tf_version", "probabilities",
#: "class_name"}``. A string input gets the raw text (``""`` for None); a float input gets the number
#: (a numeric text is parsed) or NaN for None or ``""``, the signature's missing value. Written for
#: the trainer image's Python 3.9 and TF 2.9 as well as the client's.
CLIENT_PROGRAM = r"""
import json, sys
import tensorflow as tf

request = json.loads(sys.argv[1])
signature = tf.saved_model.load(request["model_dir"]).signatures["serving_default"]
rows = request["rows"]
inputs = {}
for name, spec in sorted(signature.structured_input_signature[1].items()):
    missing = [i for i, row in enumerate(rows) if name not in row]
    if missing:
        sys.exit("rows %s have no value for the signature input %r" % (missing, name))
    cells = [row[name] for row in rows]
    if spec.dtype == tf.string:
        column = ["" if cell is None else str(cell) for cell in cells]
    elif spec.dtype.is_floating:
        column = [float("nan") if cell is None or cell == "" else float(cell) for cell in cells]
    else:
        sys.exit("signature input %r is %s: this client sends strings and floats" % (name, spec.dtype.name))
    inputs[name] = tf.constant(column, dtype=spec.dtype)
outputs = signature(**inputs)
print(json.dumps({
    "tf_version": tf.__version__,
    "probabilities": outputs["probabilities"].numpy().tolist(),
    "class_name": [name.decode("utf-8") for name in outputs["class_name"].numpy()],
}))
"""


class Answer(NamedTuple):
    """What the model answered, and which TensorFlow loaded it."""

    probabilities: list[list[float]]
    class_name: list[str]
    tf_version: str


def ensure_client() -> Path:
    """The client venv's Python, built by scripts/ensure-tf-client.sh when missing or stale; fails
    (does not skip) with the script's message when it cannot be built: `make test` needs it."""
    proc = subprocess.run([str(ENSURE_SCRIPT)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"the outside TensorFlow client could not be set up:\n{proc.stderr.strip()}", pytrace=False)
    return CLIENT_PYTHON


def signature_rows(model_dir: str | Path, rows: list[dict]) -> list[dict]:
    """Raw table rows (dicts keyed by column, as ``csv.DictReader`` reads them) keyed by the signature's
    input names instead, as metadata.json maps them; other columns (the label, ignored ones) are left
    out. A row without a column the signature takes fails, naming it."""
    inputs = json.loads((Path(model_dir) / "metadata.json").read_text())["signature"]["inputs"]
    for number, row in enumerate(rows):
        absent = sorted(spec["feature"] for spec in inputs.values() if spec["feature"] not in row)
        if absent:
            raise ValueError(f"row {number} has no column {absent}: the model at {model_dir} takes every one "
                             f"of {sorted(spec['feature'] for spec in inputs.values())}")
    return [{name: row[spec["feature"]] for name, spec in inputs.items()} for row in rows]


def parse_answer(stdout: str) -> Answer:
    """The client's JSON line (the last line of ``stdout``) as an :class:`Answer`."""
    document = json.loads(stdout.strip().splitlines()[-1])
    return Answer(document["probabilities"], document["class_name"], document["tf_version"])


def request(model_dir: str | Path, rows: list[dict]) -> str:
    """The client's command-line argument for ``rows`` sent to the SavedModel in ``model_dir``."""
    return json.dumps({"model_dir": str(model_dir), "rows": rows})


def serve(model_dir: str | Path, rows: list[dict], *, python: Path = CLIENT_PYTHON, timeout: float = 300) -> Answer:
    """Send raw ``rows`` (dicts keyed by the signature's input names) to the SavedModel in ``model_dir``
    from the client venv; the answer's ``probabilities`` has one list per row.

    The interpreter runs isolated (``-I``: neither this repo nor the host venv is on its path) with
    only PATH and HOME from this environment, so the answer comes from the client's own TensorFlow."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([str(python), "-I", "-c", CLIENT_PROGRAM, request(model_dir, rows)], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd="/")
    if proc.returncode != 0:
        raise AssertionError(f"the outside client could not serve {model_dir} (exit {proc.returncode}):\n"
                             f"{proc.stderr[-4000:]}")
    return parse_answer(proc.stdout)
