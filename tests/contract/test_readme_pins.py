"""Versions README names are the versions the locks pin: a lock bumped alone fails here, before a
reader installs what README says and gets something else."""

from __future__ import annotations

import re

from tests.conftest import REPO


def _pins(lock: str) -> dict[str, str]:
    return dict(line.split("==", 1) for line in (REPO / lock).read_text().splitlines()
                if "==" in line and not line.startswith("#"))


def test_readme_s_cuda_wheels_are_the_image_lock_s():
    """The GPU-ready offline paragraph names every CUDA 11 wheel of ``docker/requirements.lock`` with
    its major.minor version (cuDNN's 8.5 is the one TF 2.9 can load)."""
    readme = " ".join((REPO / "README.md").read_text().split())
    paragraph = readme[readme.index("**GPU-ready offline.**"):]
    paragraph = paragraph[:paragraph.index("(multi-GPU)")]
    named = dict(re.findall(r"`(nvidia-[a-z0-9-]+-cu11)` \**([0-9]+\.[0-9]+)\**", paragraph))
    locked = {name: ".".join(version.split(".")[:2]) for name, version in _pins("docker/requirements.lock").items()
              if name.startswith("nvidia-")}
    assert named == locked
    assert locked["nvidia-cudnn-cu11"] == "8.5"


def test_readme_s_celery_provider_for_airflow_3_0_is_the_3_0_lock_s():
    readme = " ".join((REPO / "README.md").read_text().split())
    said = re.search(r"on Airflow 3\.0 the tested `==([0-9.]+)`", readme)
    assert said, "README no longer names the Celery provider it tested on Airflow 3.0"
    assert said.group(1) == _pins("requirements/airflow-3.0.lock")["apache-airflow-providers-celery"]
