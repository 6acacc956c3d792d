"""Every test README cites as proof exists: a renamed or deleted test fails here, instead of leaving
README pointing a reader at evidence that is gone."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO

#: A path under tests/ (a folder, a module, a script), with ``::name`` when README names one test.
_REFERENCE = re.compile(r"\btests/[\w/.\-]*[\w/](?:::\w+)?")


def _references(readme: str) -> set[str]:
    # README wraps long lines, but a path never holds a space, so a match cannot span two of them
    return {ref.rstrip("/.") for ref in _REFERENCE.findall(readme)}


def _missing(references: set[str], root: Path) -> list[str]:
    missing = []
    for ref in sorted(references):
        path, _, name = ref.partition("::")
        target = root / path
        if not target.exists():
            missing.append(f"{ref}: no such file or folder")
        elif name and not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b", target.read_text(), re.M):
            missing.append(f"{ref}: {path} defines no {name}")
    return missing


def test_readme_cites_tests_by_their_real_paths_and_names():
    references = _references((REPO / "README.md").read_text())
    assert len(references) > 50, "README's Tested notes are its evidence; it should cite them"
    missing = _missing(references, REPO)
    assert not missing, "README cites tests that do not exist (rename them in README too):\n" + "\n".join(missing)


def test_a_citation_of_a_missing_test_or_module_is_caught(tmp_path):
    (tmp_path / "tests" / "x").mkdir(parents=True)
    (tmp_path / "tests" / "x" / "test_a.py").write_text("def test_real():\n    pass\n")
    readme = ("Tested: `tests/x/test_a.py::test_real`, and\n`tests/x/test_a.py::test_gone`; "
              "see `tests/x/` and tests/x/test_b.py.\n")
    references = _references(readme)
    assert references == {"tests/x/test_a.py::test_real", "tests/x/test_a.py::test_gone", "tests/x",
                          "tests/x/test_b.py"}
    assert _missing(references, tmp_path) == ["tests/x/test_a.py::test_gone: tests/x/test_a.py defines no test_gone",
                                              "tests/x/test_b.py: no such file or folder"]
