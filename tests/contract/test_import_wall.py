"""The wall between the wings: the trainer never imports Airflow and stays Python 3.8 syntax
(the official TF 2.9 image runs 3.8); the Airflow side never imports TensorFlow."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
TRAINER = sorted((REPO / "trainer").glob("*.py"))
AIRFLOW_SIDE = sorted((REPO / "provider").rglob("*.py")) + sorted((REPO / "dags").glob("*.py"))


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", TRAINER, ids=[p.name for p in TRAINER])
def test_trainer_is_python38_and_never_imports_airflow(path):
    ast.parse(path.read_text(), feature_version=(3, 8))
    assert "airflow" not in _imported_roots(path)


@pytest.mark.parametrize("path", AIRFLOW_SIDE, ids=[str(p.relative_to(REPO)) for p in AIRFLOW_SIDE])
def test_airflow_side_never_imports_tensorflow(path):
    assert not _imported_roots(path) & {"tensorflow", "keras"}


def test_the_contract_is_one_file():
    link = REPO / "provider" / "tfpipe" / "contract.py"
    assert link.is_symlink() and link.resolve() == (REPO / "trainer" / "contract.py").resolve()
    assert _imported_roots(REPO / "trainer" / "contract.py") <= {"json", "re"}
