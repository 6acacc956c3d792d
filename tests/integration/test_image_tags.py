"""The image tags follow their inputs (``docker/build-image.sh --plan``, against the real engine).

The docs' image page: each layer is "tagged by a hash of its inputs so a stale image is never used". A copy of
the image's inputs (``docker/`` and ``trainer/``) is planned before and after each kind of change;
``--plan`` builds nothing and reads only the engine's image list, so each plan takes about a second.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.integration


def _run_plan(repo: Path, **env: str | None) -> subprocess.CompletedProcess:
    """``--plan`` with the image variables of ``env`` set (a value of None: unset)."""
    environ = {k: v for k, v in os.environ.items() if k not in ("TFPIPE_IMAGE_VARIANT", "TFPIPE_ROOT_IMAGE")}
    environ.update({k: v for k, v in env.items() if v is not None})
    return subprocess.run([str(repo / "docker" / "build-image.sh"), "--plan"], capture_output=True, text=True,
                          timeout=300, env=environ)


def _plan(repo: Path, **env: str | None) -> dict[str, tuple[str, str]]:
    proc = _run_plan(repo, **env)
    assert proc.returncode == 0, proc.stderr
    lines = [line.split() for line in proc.stdout.splitlines()]
    return {layer: (tag, state) for layer, tag, state in lines}


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    """A copy of what the image is built from, laid out as in the repository."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docker", copy / "docker")
    shutil.copytree(REPO / "trainer", copy / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_same_inputs_same_tags_and_the_image_built_from_them_is_present(inputs, trainer_image):
    here, copy = _plan(REPO), _plan(inputs)
    assert copy == here
    # `make image` ran before the tests: every layer the inputs ask for is in the engine
    assert {state for _, state in copy.values()} == {"present"}, copy


@pytest.mark.parametrize("change, layers", [
    ("a trainer module's code", {"trainer"}),
    ("a trainer module's name", {"trainer"}),
    ("the trainer Dockerfile", {"trainer"}),
    ("the lock", {"deps", "trainer"}),
    ("the deps recipe", {"deps", "trainer"}),
])
def test_a_changed_input_gives_a_new_tag_that_is_not_built_yet(inputs, trainer_image, change, layers):
    before = _plan(inputs)
    if change == "a trainer module's code":
        module = inputs / "trainer" / "report.py"
        module.write_text(module.read_text() + "\n# changed\n")
    elif change == "a trainer module's name":  # same bytes, another import name
        (inputs / "trainer" / "report.py").rename(inputs / "trainer" / "report_renamed.py")
    elif change == "the trainer Dockerfile":
        dockerfile = inputs / "docker" / "Dockerfile"
        dockerfile.write_text(dockerfile.read_text() + "\n# changed\n")
    elif change == "the lock":
        lock = inputs / "docker" / "requirements.lock"
        lock.write_text(lock.read_text() + "# changed\n")
    else:
        recipe = inputs / "docker" / "deps.Dockerfile"
        recipe.write_text(recipe.read_text() + "\n# changed\n")
    after = _plan(inputs)
    changed = {layer for layer in before if after[layer][0] != before[layer][0]}
    assert changed == layers, (before, after)
    # a new tag is one no image has: the next build makes it instead of reusing a stale one
    assert all(after[layer][1] == "absent" for layer in layers), after
    assert after["root"] == before["root"]


def test_the_gpu_variant_is_the_default_and_the_cpu_variant_is_another_deps_image(trainer_image):
    default, gpu, cpu = _plan(REPO), _plan(REPO, TFPIPE_IMAGE_VARIANT="gpu"), _plan(REPO, TFPIPE_IMAGE_VARIANT="cpu")
    assert default == gpu
    # the cpu variant's lock leaves the CUDA wheels out: same root, its own deps and trainer tags
    assert cpu["root"] == gpu["root"]
    assert cpu["deps"][0] != gpu["deps"][0] and cpu["trainer"][0] != gpu["trainer"][0], (gpu, cpu)


def test_an_unknown_variant_is_refused_with_the_fix(trainer_image):
    proc = _run_plan(REPO, TFPIPE_IMAGE_VARIANT="cuda12")
    assert proc.returncode != 0 and proc.stdout == ""
    assert "TFPIPE_IMAGE_VARIANT=cuda12: must be gpu or cpu. Fix: unset it (gpu) or set cpu" in proc.stderr


def test_a_pinned_root_is_the_root_it_plans_with(trainer_image):
    """``TFPIPE_ROOT_IMAGE=...@sha256:...`` names the root: --plan pulls nothing, so a pin this engine
    lacks is reported by its reference instead of falling back to the offline root."""
    pinned = "tensorflow/tensorflow@sha256:" + "0" * 64
    proc = _run_plan(REPO, TFPIPE_ROOT_IMAGE=pinned)
    assert proc.returncode != 0, proc.stdout
    assert proc.stdout.split() == ["root", pinned, "absent"]
    assert f"the root image {pinned} is not here" in proc.stderr and "make image" in proc.stderr
    # and `offline` forces the offline root, even where the official one could be pulled
    offline = _run_plan(REPO, TFPIPE_ROOT_IMAGE="offline").stdout.split()
    assert offline[:1] == ["root"] and offline[1].startswith("tfpipe/rootfs-bullseye:"), offline


@pytest.mark.parametrize("change", ["the package list", "the suite"])
def test_a_changed_offline_recipe_gives_a_new_root_and_the_script_says_which_root(inputs, trainer_image, change):
    """The offline root is tagged by its recipe (suite and package list): a changed recipe plans a
    root no image has, so the next build bootstraps it instead of reusing the old one. Either way
    the script names the root it uses on stderr."""
    before = _run_plan(inputs, TFPIPE_ROOT_IMAGE="offline")
    layer, old_tag, _ = before.stdout.splitlines()[0].split()
    assert layer == "root" and old_tag.startswith("tfpipe/rootfs-bullseye:"), before.stdout
    # one line per step, with the seconds since the build started
    assert re.search(r"^\[image +\d+s\] root: offline bullseye rootfs \(tensorflow/tensorflow:2\.9\.3-gpu could not "
                     rf"be pulled\) -> {re.escape(old_tag)}$", before.stderr, re.M), before.stderr
    script = inputs / "docker" / "build-image.sh"
    text = script.read_text()
    changed = (text.replace("packages=python3,", "packages=python3,curl,", 1) if change == "the package list"
               else text.replace("suite=bullseye", "suite=bookworm", 1))
    assert changed != text
    script.write_text(changed)
    after = _run_plan(inputs, TFPIPE_ROOT_IMAGE="offline")
    assert after.returncode != 0  # --plan builds nothing, and the deps tag needs the root's id
    assert after.stdout.split()[0] == "root"
    new_tag = after.stdout.split()[1]
    assert new_tag != old_tag and after.stdout.split()[2] == "absent", after.stdout
    assert f"-> {new_tag}" in after.stderr and "is not built" in after.stderr and "make image" in after.stderr


def test_the_make_targets_set_the_image_variable_in_this_project_s_airflow(trainer_image):
    """The docs: ``make image`` (and so ``make demo`` and ``make test``, through ``image-variable``) sets
    the Airflow Variable ``tfpipe_image`` to the image it built, so the example DAGs, which name no
    image, run without any environment variable. Read through Airflow's own CLI, with the tests'
    ``AIRFLOW_VAR_TFPIPE_IMAGE`` (which would shadow the Variable) taken away."""
    env = {k: v for k, v in os.environ.items() if k != "AIRFLOW_VAR_TFPIPE_IMAGE"}
    proc = subprocess.run([sys.executable, "-m", "airflow", "variables", "get", "tfpipe_image"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == trainer_image


def test_a_root_image_imported_from_a_failed_archive_is_removed(inputs, trainer_image, tmp_path):
    """``docker import`` makes an image of whatever ``tar`` streamed before it failed; the build must
    not leave that image under the root's tag, where the next build would take it as built. The
    real engine imports a real archive of a new root (its recipe changed, so its tag is new); the
    ``tar`` that writes it then exits 2, as one that met the host's /proc did. debootstrap and pip
    are stand-ins (no mirror or index is needed before the archive)."""
    script = inputs / "docker" / "build-image.sh"
    script.write_text(script.read_text().replace("packages=python3,", "packages=python3,curl,", 1))
    root = _run_plan(inputs, TFPIPE_ROOT_IMAGE="offline").stdout.split()[1]
    assert root.startswith("tfpipe/rootfs-bullseye:") and not _image_exists(root)
    calls, folder = tmp_path / "tar.calls", tmp_path / "stand-ins"
    folder.mkdir()
    stand_ins = {
        "debootstrap": 'mkdir -p "$4/etc" && echo root > "$4/etc/hostname"',
        "tar": f'echo "$*" >> {calls}; {shutil.which("tar")} "$@"; exit 2',
        "python3": "exit 0",  # pip download of the wheels, beside debootstrap
    }
    for name, body in stand_ins.items():
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("TFPIPE_IMAGE_VARIANT", "TFPIPE_ROOT_IMAGE")}
    env.update(PATH=f"{folder}:{os.environ['PATH']}", TFPIPE_ROOT_IMAGE="offline", TFPIPE_CACHE=str(tmp_path / "cache"),
               DEBIAN_MIRROR="http://deb.example/debian")
    try:
        proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr
        assert f"archiving {tmp_path / 'cache' / 'rootfs-bullseye'} into {root} failed" in proc.stderr, proc.stderr
        assert "the image was removed" in proc.stderr
        assert not _image_exists(root), "the image of the partial archive was left under the root's tag"
        # the archive never crosses into a file system mounted under the target
        assert "--one-file-system" in calls.read_text().split(), calls.read_text()
    finally:
        subprocess.run(["docker", "image", "rm", "-f", root], capture_output=True, timeout=120)


def _image_exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True, timeout=60).returncode == 0
