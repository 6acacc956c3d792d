"""The documentation site builds with ``mkdocs build --strict`` (a broken link, a page left out of the
nav or a missing snippet fails it), and README stays a short front door: no lab notes in it or in
the pages (no commit hashes, test paths, dated runs or load averages)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

# MkDocs is in the main venv only; the docs do not change with the Airflow release
pytestmark = pytest.mark.docs

#: README is the package's description on the index and the repository's front page.
README_MAX_LINES = 200

#: Pages written from the code by scripts/gen_reference.py, not by hand.
GENERATED = {"reference/configuration.md", "reference/exit-codes.md", "reference/params.md"}

#: What a lab notebook cites and a manual does not, each with the reason it is refused.
LAB_NOTES = {
    "a commit hash": re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"),
    "a test path": re.compile(r"\btests/|\btest_[a-z0-9_]+\.py\b|::test_"),
    "a dated run": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a load average": re.compile(r"load average", re.I),
}


def build_site(target) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of this checkout into ``target``, as ``make docs`` runs it."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(target)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    proc = build_site(target)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return target


def test_the_site_builds_strict_with_the_home_and_reference_pages(site):
    """Home, getting started, the configuration reference and the Python API are in the built site,
    and the API page is mkdocstrings' rendering of the config classes, not an empty page."""
    for page in ("index.html", "getting-started/index.html", "reference/configuration/index.html",
                 "reference/exit-codes/index.html", "reference/params/index.html", "reference/api/index.html"):
        assert (site / page).is_file(), page
    api = (site / "reference" / "api" / "index.html").read_text()
    for anchor in ("config.PipelineConfig", "config.TrainingConfig", "config.ResourcesConfig",
                   "dag_factory.training_pipeline", "operators.docker.TrainOperator"):
        assert f'id="tfpipe.{anchor}"' in api, anchor
    assert (site / "search" / "search_index.json").is_file()


def test_the_pages_show_the_example_files_as_they_are(site):
    """Snippets put the example DAG files into the pages: the GPUs page shows the example's
    ``gpu_fallback`` line, the home page the whole example DAG file."""
    home = (site / "index.html").read_text()
    assert "churn_model" in home and "training_pipeline" in home
    gpus = (site / "gpus" / "index.html").read_text()
    assert "gpu_fallback" in gpus and "--8&lt;--" not in gpus and "--8<--" not in gpus


def test_readme_is_a_front_door_of_at_most_200_lines():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, len(lines)
    text = "\n".join(lines)
    for needed in ("make demo", "make test", "make check", "tfpipe_image", "## Supported Airflow versions"):
        assert needed in text, needed


def _manual_pages() -> dict[str, str]:
    pages = {"README.md": (REPO / "README.md").read_text()}
    for path in sorted((REPO / "docs").rglob("*.md")):
        name = path.relative_to(REPO / "docs").as_posix()
        if name not in GENERATED:
            pages[f"docs/{name}"] = path.read_text()
    return pages


@pytest.mark.parametrize("what", sorted(LAB_NOTES))
def test_no_lab_notes_in_readme_or_the_docs(what):
    """The manual states behaviour; measurements with their dates and the evidence behind them live in
    the tests and in bench/, not in README or the docs."""
    pattern = LAB_NOTES[what]
    found = {page: sorted(set(pattern.findall(text)))[:5] for page, text in _manual_pages().items() if pattern.search(text)}
    assert found == {}, f"{what} in {found}"


def test_the_lab_note_patterns_catch_what_they_name():
    """The patterns above are not vacuous: each catches its kind and lets plain prose through."""
    samples = {"a commit hash": "measured at b7f7847", "a test path": "see tests/provider/test_dags.py",
               "a dated run": "on 2026-12-05", "a load average": "at a load average of 5"}
    for what, sample in samples.items():
        assert LAB_NOTES[what].search(sample), what
    prose = "CUDA_CACHE_MAXSIZE=4294967296, cuDNN 8.5, the digits CSV, modes 0644/0755, decade"
    assert not any(pattern.search(prose) for pattern in LAB_NOTES.values())
