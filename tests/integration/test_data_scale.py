"""Training data larger than the container's memory: ``training.cache: auto`` caches to a file.

A wide synthetic data set (4,096 float features, 45,000 examples: about 714 MiB once parsed, and
as much in TFRecords) is trained for one epoch by the real trainer image in a container limited
to 640 MiB of memory (no swap). With the default ``auto`` the train stage logs that it caches in a
file on the work volume and completes; with ``memory`` the same container is killed by the
out-of-memory killer, which shows the limit is really below what memory caching needs.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO
from tfpipe import contract

pytestmark = pytest.mark.integration

FEATURES, TRAIN, EVAL = 4096, 44000, 1000
LIMIT = "640m"
DAG, RUN = "data_scale", "manual__wide"
HELPERS = REPO / "tests" / "integration" / "in_image"


def _run(client, image, command, home: Path, *, mem_limit=None, environment=None, timeout=300):
    """Run one container to its end; return ``(exit code, OOM-killed, logs)``."""
    kwargs = {"mem_limit": mem_limit, "memswap_limit": mem_limit} if mem_limit else {}
    container = client.containers.run(
        image, command, detach=True, user="1000:1000", name=f"tfpipe-data-scale-{uuid.uuid4().hex[:8]}",
        labels={"io.tfpipe.test": "data_scale"}, environment=environment or {},
        volumes={str(home / "work"): {"bind": contract.CONTAINER_WORK, "mode": "rw"},
                 str(home / "data"): {"bind": contract.CONTAINER_DATA, "mode": "ro"},
                 str(home / "models"): {"bind": contract.CONTAINER_MODELS, "mode": "rw"},
                 str(HELPERS): {"bind": "/helpers", "mode": "ro"}}, **kwargs)
    try:
        code = container.wait(timeout=timeout)["StatusCode"]
        container.reload()
        return code, container.attrs["State"]["OOMKilled"], container.logs().decode("utf-8", "replace")
    finally:
        container.remove(force=True)


@pytest.fixture(scope="module")
def wide_home(tmp_path_factory, trainer_image, docker_client):
    """Volumes holding the wide data set and a run pointing at it; removed afterwards (1.4 GB)."""
    home = tmp_path_factory.mktemp("data_scale")
    for name in ("data", "work", "models"):
        (home / name).mkdir()
        (home / name).chmod(0o777)  # the stage user (uid 1000) writes there
    run_dir = contract.run_dir(DAG, RUN)
    code, _, logs = _run(docker_client, trainer_image,
                         ["python3", "/helpers/write_wide_dataset.py", contract.CONTAINER_WORK, run_dir,
                          str(FEATURES), str(TRAIN), str(EVAL)], home)
    assert code == 0, logs[-3000:]
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _train(client, image, home, cache, try_number, epochs):
    config = {"schema_version": contract.SCHEMA_VERSION, "stage": "train",
              "run": {"dag_id": DAG, "run_id": RUN, "task_id": "train", "try_number": try_number},
              "paths": {"data": contract.CONTAINER_DATA, "work": contract.CONTAINER_WORK,
                        "models": contract.CONTAINER_MODELS, "run_dir": contract.run_dir(DAG, RUN)},
              "training": {"epochs": epochs, "batch_size": 256, "model_kwargs": {"hidden_units": [8]},
                           "shuffle_buffer": 1000, "checkpoint_every_steps": 0, "cache": cache}}
    return _run(client, image, ["python3", "-m", "trainer", "train"], home, mem_limit=LIMIT,
                environment={contract.CONFIG_ENV: contract.dumps(config)})


def test_training_data_larger_than_memory_trains_with_a_file_cache(wide_home, trainer_image, docker_client):
    work = wide_home / "work"
    parsed_mib = (TRAIN + EVAL) * (4 * FEATURES) / 2 ** 20
    assert parsed_mib > 640, "the data set must be larger than the container's memory limit"

    code, oom, logs = _train(docker_client, trainer_image, wide_home, "auto", 1, epochs=1)
    assert (code, oom) == (0, False), logs[-4000:]
    assert "data: train split: cached in a file, /work/cache/tfdata/" in logs
    assert "above the budget of" in logs and "640 MiB memory limit" in logs
    history = json.loads((work / contract.run_dir(DAG, RUN)[len("/work/"):] / contract.METRICS_FILE).read_text())
    assert [h["epoch"] for h in history] == [1]
    assert list((work / "cache" / "tfdata").iterdir()) == [], "the file cache is removed when the stage ends"

    # the control: the same container caching in memory (a second epoch, resumed from the first)
    # is killed by the OOM killer
    code, oom, logs = _train(docker_client, trainer_image, wide_home, "memory", 2, epochs=2)
    assert oom is True and code == 137, (code, oom, logs[-2000:])
    assert "data: train split: cached in memory (training.cache is memory)" in logs
