"""TensorBoards per engine stay bounded: least recently used and idle ones are removed (real engine)."""

from __future__ import annotations

import time
import uuid

import pytest

from tfpipe.plugins.run_access import TensorBoards, api_client

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


def test_requests_from_several_api_server_processes_share_one_tensorboard(trainer_image, tmp_path, monkeypatch):
    """The container is named per run, so two api-server processes (or servers) asking for the same
    run's TensorBoard at once end up with one container: one that another process created and has
    not started yet is started, not removed under it, and a create that loses the race (409) takes
    the winner's container. Each process has its own ``TensorBoards``, so its lock cannot help."""
    from tfpipe.plugins.run_access import tensorboard_container_name

    role = f"ui-tensorboard-test-{uuid.uuid4().hex[:8]}"
    cli = api_client("unix://var/run/docker.sock")
    dag_id, run_id = "tfpipe_race", f"run_{uuid.uuid4().hex[:8]}"
    location = {"work": str(tmp_path), "image": trainer_image, "docker_url": "unix://var/run/docker.sock"}
    name = tensorboard_container_name(dag_id, run_id)

    def ours() -> list[dict]:
        return cli.containers(all=True, filters={"name": f"^/{name}$"})

    try:
        # another process created it a moment ago and has not started it yet
        other = cli.create_container(trainer_image, name=name, command=["sleep", "300"], entrypoint=[],
                                     labels={"tfpipe.role": role, "tfpipe.tensorboard": f"{dag_id}/{run_id}"})
        assert TensorBoards(role=role)._ensure(cli, location, dag_id, run_id) == other["Id"]
        assert [(c["Id"], c["State"]) for c in ours()] == [(other["Id"], "running")]
        # and the other process's own start of it, coming after, changes nothing
        cli.start(other["Id"])
        assert [(c["Id"], c["State"]) for c in ours()] == [(other["Id"], "running")]

        # this process listed before the other one created it: its create gets 409 and takes that one
        cli.remove_container(other["Id"], force=True)
        other = cli.create_container(trainer_image, name=name, command=["sleep", "300"], entrypoint=[],
                                     labels={"tfpipe.role": role, "tfpipe.tensorboard": f"{dag_id}/{run_id}"})
        listings = []
        real_containers = cli.containers

        def listed_too_early(*args, **kwargs):
            listings.append(kwargs.get("filters"))
            return [] if len(listings) == 1 else real_containers(*args, **kwargs)

        monkeypatch.setattr(cli, "containers", listed_too_early)
        boards = TensorBoards(role=role)
        monkeypatch.setattr(boards, "evict", lambda cli, keep: None)  # it lists too: count the name lookups alone
        assert boards._ensure(cli, location, dag_id, run_id) == other["Id"]
        monkeypatch.setattr(cli, "containers", real_containers)
        assert len(listings) == 2, listings
        assert [(c["Id"], c["State"]) for c in ours()] == [(other["Id"], "running")]
    finally:
        for c in cli.containers(all=True, filters={"name": f"^/{name}$"}):
            cli.remove_container(c["Id"], force=True)
        cli.close()
