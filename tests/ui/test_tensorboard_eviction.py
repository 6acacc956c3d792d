"""TensorBoards per engine stay bounded: least recently used and idle ones are removed (real engine)."""

from __future__ import annotations

import time
import uuid

import pytest

from tfpipe.plugins.engine import TensorBoards, api_client

pytestmark = pytest.mark.integration


def test_least_recently_used_and_idle_tensorboards_are_removed(trainer_image, monkeypatch):
    # a role of this test's own, so TensorBoards of real runs on the shared engine are never touched
    boards = TensorBoards(role=f"ui-tensorboard-test-{uuid.uuid4().hex[:8]}")
    cli = api_client("unix://var/run/docker.sock")
    runs = [("tfpipe_evict", f"run_{i}") for i in range(3)]
    try:
        for dag_id, run_id in runs:  # created, never started: eviction goes by labels alone
            cli.create_container(trainer_image, command=["true"], entrypoint=[],
                                 labels={"tfpipe.role": boards.role, "tfpipe.tensorboard": f"{dag_id}/{run_id}"})
        now = time.time()
        for age, (dag_id, run_id) in zip((30, 10, 20), runs):
            boards.mark_used(dag_id, run_id, at=now - age)

        def left() -> list[str]:
            found = cli.containers(all=True, filters={"label": f"tfpipe.role={boards.role}"})
            return sorted(c["Labels"]["tfpipe.tensorboard"] for c in found)

        monkeypatch.setenv("TFPIPE_TENSORBOARD_IDLE_S", "1800")
        boards.evict(cli, keep=2)
        assert left() == ["tfpipe_evict/run_1", "tfpipe_evict/run_2"], "the least recently used one went first"
        monkeypatch.setenv("TFPIPE_TENSORBOARD_IDLE_S", "15")
        boards.evict(cli, keep=5)
        assert left() == ["tfpipe_evict/run_1"], "one idle longer than TFPIPE_TENSORBOARD_IDLE_S went too"
        assert boards.stop_all("unix://var/run/docker.sock") == 1 and left() == []
    finally:
        for c in cli.containers(all=True, filters={"label": f"tfpipe.role={boards.role}"}):
            cli.remove_container(c["Id"], force=True)
        cli.close()
