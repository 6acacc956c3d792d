"""Versions the docs name are the versions the locks pin: a lock bumped alone fails here, before a
reader installs what the docs say and gets something else."""

from __future__ import annotations

import re

from tests.conftest import REPO

DOCS = REPO / "docs"


def _pins(lock: str) -> dict[str, str]:
    return dict(line.split("==", 1) for line in (REPO / lock).read_text().splitlines()
                if "==" in line and not line.startswith("#"))


def _text(page: str) -> str:
    return " ".join((DOCS / page).read_text().split())


def test_the_image_page_s_cuda_wheels_are_the_image_lock_s():
    """The image page's GPU-ready offline paragraph names every CUDA 11 wheel of
    ``docker/requirements.lock`` with its major.minor version (cuDNN's 8.5 is the one TF 2.9 can load)."""
    text = _text("image.md")
    paragraph = text[text.index("**GPU-ready offline.**"):]
    paragraph = paragraph[:paragraph.index("(multi-GPU)")]
    named = dict(re.findall(r"`(nvidia-[a-z0-9-]+-cu11)` \**([0-9]+\.[0-9]+)\**", paragraph))
    locked = {name: ".".join(version.split(".")[:2]) for name, version in _pins("docker/requirements.lock").items()
              if name.startswith("nvidia-")}
    assert named == locked
    assert locked["nvidia-cudnn-cu11"] == "8.5"


def test_the_celery_provider_the_docs_pin_for_airflow_3_0_is_the_3_0_lock_s():
    """Every page that tells a 3.0 deployment which Celery provider to pin (the README too) names the
    release ``requirements/airflow-3.0.lock`` pins and the compat suite runs."""
    locked = _pins("requirements/airflow-3.0.lock")["apache-airflow-providers-celery"]
    pages = {"README.md": " ".join((REPO / "README.md").read_text().split()),
             **{page: _text(page) for page in ("airflow-versions.md", "deploying.md", "troubleshooting.md")}}
    for page, text in pages.items():
        said = re.findall(r"apache-airflow-providers-celery==([0-9.]+)", text)
        assert said, f"{page} no longer names the Celery provider tested on Airflow 3.0"
        assert set(said) == {locked}, page


def test_the_docs_tooling_is_pinned_in_the_host_lock():
    """``make docs`` builds with the main venv: MkDocs, its theme and mkdocstrings are exact pins of
    ``requirements/host.lock``, so every checkout builds the site with the same versions."""
    pins = {name.lower(): version for name, version in _pins("requirements/host.lock").items()}
    for name in ("mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "pymdown-extensions"):
        assert re.fullmatch(r"[0-9][0-9a-z.]*", pins.get(name, "")), name
