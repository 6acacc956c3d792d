"""Sharded prep through Airflow (``tfpipe run`` = ``dag.test()``) with real containers.

The digits CSV is cut into 5 files and prepared by 4 mapped ``prep_shard`` tasks and a
``prep_merge``; the model trains one epoch on the merged data set. In the first scenario the labels
are names ("zero" to "nine") and the DAG declares them in ``data.classes``, in an order that is not
their sorted one: every shard numbers them by the list, and the exported model keeps it. In the
second scenario the input is a mixed table (a text column, a yes/no column, empty and ``NA``
cells, rows without a label that ``data.drop_missing_labels`` drops) and shard 3's container is
SIGKILLed (``docker kill``) after it wrote its records but before it committed them (the
``TFPIPE_TEST_HOLD_SHARD`` hook holds it there on its first try): Airflow retries that task alone,
the parts the other shards committed are the ones the merge used, unchanged, and the merged data set
is the one a single prep task (run in the trainer image on the same files) writes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, dag_command, parse_summary, run_dag, write_dag
from tfpipe import contract
from tfpipe.hooks.docker import ROLE_LABEL

pytestmark = pytest.mark.integration

SHARDS = 4
#: The shard whose container is killed: the last, so that (when dag.test runs the instances in
#: order, as it does here) the others' parts are committed before the kill.
KILLED = 3
TRAINING = {"model": "mlp", "epochs": 1, "batch_size": 64, "learning_rate": 0.002}
#: The digits' labels as names, declared in digit order (their sorted order starts "eight", "five").
NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _split_digits(home: Path, pieces: int = 5, names: list[str] | None = None) -> list[str]:
    """Cut data/digits/digits.csv into ``pieces`` files under data/digits_parts (a header in each);
    with ``names``, label ``i`` (the last column) is written as ``names[i]``."""
    header, *rows = (home / "data" / "digits" / "digits.csv").read_text().splitlines()
    assert header.rsplit(",", 1)[1] == "label", header[-40:]
    if names:
        rows = [f"{pixels},{names[int(label)]}" for pixels, label in (row.rsplit(",", 1) for row in rows)]
    folder = home / "data" / "digits_parts"
    folder.mkdir()
    step = -(-len(rows) // pieces)
    for i in range(pieces):
        (folder / f"part-{i}.csv").write_text("\n".join([header] + rows[i * step:(i + 1) * step]) + "\n")
    return sorted(p.name for p in folder.iterdir())


#: The mixed table's columns: ``churn`` is the label (empty in every 97th row).
MIXED_HEADER = "customer_id,tenure,monthly,plan,autopay,churn"


def _write_mixed_parts(home: Path, pieces: int = 5, rows: int = 200) -> list[str]:
    """data/mixed_parts/part-K.csv: ``pieces`` files of ``rows`` rows of a learnable churn-like table
    (an id and a plan as texts, a yes/no column, every 7th tenure empty, every 11th monthly ``NA``,
    every 13th plan empty, every 97th label empty)."""
    import random

    rng = random.Random(7)
    folder = home / "data" / "mixed_parts"
    folder.mkdir()
    for k in range(pieces):
        lines = [MIXED_HEADER]
        for i in range(k * rows, (k + 1) * rows):
            plan, tenure, autopay = rng.choice(["basic", "standard", "premium"]), rng.uniform(0, 60), rng.random() < 0.5
            churn = int((plan == "basic") + (tenure < 20) + (not autopay) >= 2)
            lines.append(",".join([f"c{i:05d}", "" if i % 7 == 3 else f"{tenure:.2f}",
                                   "NA" if i % 11 == 5 else f"{rng.uniform(20, 120):.2f}", "" if i % 13 == 6 else plan,
                                   "yes" if autopay else "no", "" if i % 97 == 40 else str(churn)]))
        (folder / f"part-{k}.csv").write_text("\n".join(lines) + "\n")
    return sorted(p.name for p in folder.iterdir())


def _single_prep_files(home: Path, stage_config: dict, image: str, tmp_path: Path) -> dict[str, bytes]:
    """The data set one ``prep`` task writes (in the trainer image, on a fresh work volume) with the
    data section of ``stage_config``: its files' bytes but fingerprint.json (it names the run) and
    _SUCCESS (a time)."""
    work = tmp_path / "single_work"
    work.mkdir()
    work.chmod(0o777)  # the stage runs as the image's user
    config = dict(stage_config, stage="prep", run=dict(stage_config["run"], task_id="prep"))
    config.pop(contract.SHARD_INDEX_KEY, None)
    proc = subprocess.run(["docker", "run", "--rm", "-v", f"{home / 'data'}:{contract.CONTAINER_DATA}:ro",
                           "-v", f"{work}:{contract.CONTAINER_WORK}", "-e", f"{contract.CONFIG_ENV}={json.dumps(config)}",
                           image, "python3", "-m", "trainer", "prep"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (dataset,) = (work / "datasets").iterdir()
    return {p.name: p.read_bytes() for p in sorted(dataset.iterdir()) if p.name not in ("fingerprint.json", "_SUCCESS")}


def _expected_fingerprint(home: Path, shards: int, classes: list[str] | None = None) -> str:
    """The fingerprint one (unsharded) prep task computes for the same files and data settings."""
    from tfpipe.config import DataConfig
    from trainer import prep

    data = DataConfig(path="digits_parts", shards=shards, classes=classes).to_dict()
    files = [(p.name, str(p)) for p in sorted((home / "data" / "digits_parts").iterdir())]
    return prep.fingerprint(data, files)[0]


def _run_dir(home: Path, dag_id: str) -> Path:
    (run,) = (home / "work" / "runs" / dag_id).iterdir()
    return run


def _dataset(home: Path, dag_id: str) -> Path:
    pointer = json.loads((_run_dir(home, dag_id) / "dataset.json").read_text())
    return home / "work" / "datasets" / pointer["fingerprint"]


def test_four_shards_make_the_unsharded_data_set_and_train_on_it(tfpipe_home, trainer_image, tmp_path):
    files = _split_digits(tfpipe_home, names=NAMES)
    dags = tmp_path / "dags"
    write_dag(dags, "sharded_prep", data={"path": "digits_parts", "shards": SHARDS, "classes": NAMES},
              training=TRAINING)
    started = time.monotonic()
    summary, log = run_dag("sharded_prep", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    print(f"sharded run: {time.monotonic() - started:.0f} s")
    assert summary["state"] == "success", log[-6000:]
    tasks = summary["tasks"]
    assert {f"prep_shard[{k}]" for k in range(SHARDS)} | {"prep_merge", "train"} <= set(tasks)
    assert "prep" not in tasks
    assert all(tasks[f"prep_shard[{k}]"] == {"state": "success", "try_number": 1} for k in range(SHARDS))

    dataset = _dataset(tfpipe_home, "sharded_prep")
    assert dataset.name == _expected_fingerprint(tfpipe_home, SHARDS, NAMES), \
        "the fingerprint of an unsharded prep of the same files"
    schema = json.loads((dataset / "schema.json").read_text())
    assert sum(schema["counts"].values()) == 1797 and schema["num_classes"] == 10
    assert schema["class_names"] == NAMES, "class ids follow data.classes, not the names' sorted order"
    # class i holds exactly the examples of digit i (174 to 183 each): no shard numbered them otherwise
    _, *rows = (tfpipe_home / "data" / "digits" / "digits.csv").read_text().splitlines()
    digits = [int(row.rsplit(",", 1)[1]) for row in rows]
    histogram = json.loads((dataset / "stats.json").read_text())["class_histogram"]
    assert [a + b for a, b in zip(histogram["train"], histogram["eval"], strict=True)] == \
        [digits.count(i) for i in range(10)], histogram
    parts = json.loads((dataset / "fingerprint.json").read_text())["parts"]
    assert [f for p in parts for f in p["files"]] == files, "the shards' slices cover the files once, in order"
    assert not (_run_dir(tfpipe_home, "sharded_prep") / "prep_shards").exists(), "the parts are removed"
    # training read the merged data set
    train_config = json.loads((_run_dir(tfpipe_home, "sharded_prep") / "config" / "train.json").read_text())
    assert train_config["data"]["shards"] == SHARDS
    assert train_config["data"]["classes"] == NAMES
    history = json.loads((_run_dir(tfpipe_home, "sharded_prep") / "metrics.json").read_text())
    assert [h["epoch"] for h in history] == [1]
    assert summary["model_dir"] and Path(summary["model_dir"]).is_dir()
    metadata = json.loads((Path(summary["model_dir"]) / "metadata.json").read_text())
    assert metadata["data"]["class_names"] == NAMES, metadata["data"]


def _shard_container(client, dag_id: str, index: int):
    """The running stage container of shard ``index``. Not a helper container: those the operator
    runs for the task (preparing its directories) carry the task's labels too, plus a role, and
    end within a second (a helper listed here once was gone before its logs could be read)."""
    found = client.containers.list(filters={"label": [f"tfpipe.dag_id={dag_id}", "tfpipe.task_id=prep_shard",
                                                      f"tfpipe.map_index={index}"], "status": "running"})
    found = [c for c in found if ROLE_LABEL not in c.labels]
    return found[0] if found else None


def _holding(container, err_path: Path) -> bool:
    """Whether the shard's stage container logged the hold; one that ended first fails the test."""
    import docker.errors

    try:
        return b"holds before committing" in container.logs()
    except docker.errors.APIError as error:  # NotFound included: removed once it exited
        raise AssertionError(f"the stage container {container.short_id} of shard {KILLED} ended before its hold "
                             f"({error.explanation or error}):\n" + err_path.read_text()[-4000:]) from None


def _committed_parts(home: Path, dag_id: str) -> dict[str, tuple[int, str]]:
    """``{part dir name: (inode, sha256 of part.json)}`` of the parts committed so far."""
    found = {}
    for part in (_run_dir(home, dag_id) / "prep_shards").glob("*/shard-*"):
        if (part / "_SUCCESS").exists():
            found[part.name] = (part.stat().st_ino, hashlib.sha256((part / "part.json").read_bytes()).hexdigest())
    return found


def test_a_killed_shard_is_retried_alone_and_the_others_parts_are_kept(tfpipe_home, trainer_image, docker_client,
                                                                       tmp_path):
    _write_mixed_parts(tfpipe_home)
    dags = tmp_path / "dags"
    write_dag(dags, "sharded_kill", data={"path": "mixed_parts", "label": "churn", "drop_missing_labels": True,
                                          "shards": SHARDS}, training=TRAINING,
              resources={"environment": {"TFPIPE_TEST_HOLD_SHARD": str(KILLED)}})
    cmd, env = dag_command("sharded_kill", {}, home=tfpipe_home, image=trainer_image, dags_folder=dags)
    out_path, err_path = tmp_path / "out.log", tmp_path / "err.log"
    started = time.monotonic()
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=out, stderr=err, text=True)
        try:
            deadline = time.monotonic() + 300
            container = None
            while time.monotonic() < deadline:
                container = _shard_container(docker_client, "sharded_kill", KILLED)
                if container is not None and _holding(container, err_path):
                    break
                assert proc.poll() is None, err_path.read_text()[-4000:]
                time.sleep(0.2)
            else:
                raise AssertionError(f"shard {KILLED} never reached its hold point:\n" + err_path.read_text()[-4000:])
            committed = _committed_parts(tfpipe_home, "sharded_kill")
            (temp,) = (_run_dir(tfpipe_home, "sharded_kill") / "prep_shards").glob(f"*/.tmp-shard-{KILLED:05d}-*")
            assert any(temp.glob("train-*.tfrecord")), "killed after writing its records, before committing them"
            assert f"shard-{KILLED:05d}-of-{SHARDS:05d}" not in committed, "killed before committing its part"
            container.kill()  # SIGKILL, mid-work
            # dag.test runs the mapped instances in no fixed order, so the others may commit before
            # or after the kill: record each part as first committed, to compare with what is merged
            deadline = time.monotonic() + 600
            while proc.poll() is None and time.monotonic() < deadline:
                for name, seen in _committed_parts(tfpipe_home, "sharded_kill").items():
                    committed.setdefault(name, seen)
                time.sleep(0.2)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    print(f"killed-shard run: {time.monotonic() - started:.0f} s; parts seen committed: {sorted(committed)}")
    summary = parse_summary(out_path.read_text(), err_path.read_text(), proc.returncode)
    log = err_path.read_text()
    assert summary["state"] == "success", log[-6000:]
    tasks = summary["tasks"]
    assert tasks[f"prep_shard[{KILLED}]"] == {"state": "success", "try_number": 2}
    assert all(tasks[f"prep_shard[{k}]"] == {"state": "success", "try_number": 1} for k in range(SHARDS) if k != KILLED)
    assert tasks["prep_merge"]["try_number"] == 1 and tasks["train"]["state"] == "success"

    dataset = _dataset(tfpipe_home, "sharded_kill")
    parts = json.loads((dataset / "fingerprint.json").read_text())["parts"]
    assert [p["try_number"] for p in parts] == [2 if k == KILLED else 1 for k in range(SHARDS)]
    by_name = {f"shard-{p['index']:05d}-of-{SHARDS:05d}": p for p in parts}
    others = {f"shard-{k:05d}-of-{SHARDS:05d}" for k in range(SHARDS) if k != KILLED}
    assert others <= set(committed), committed
    for name, (_, digest) in committed.items():  # every part merged as it was first committed
        assert by_name[name]["part_sha256"] == digest, f"{name} changed after shard {KILLED} was killed"
    assert "left by an earlier try of this shard" in log, "the retry removed its own leftover temp dir"

    # the merged data set of the mixed table is the one a single prep task writes, byte for byte
    merge_config = json.loads((_run_dir(tfpipe_home, "sharded_kill") / "config" / "prep_merge.json").read_text())
    single = _single_prep_files(tfpipe_home, merge_config, trainer_image, tmp_path)
    merged = {p.name: p.read_bytes() for p in sorted(dataset.iterdir()) if p.name not in ("fingerprint.json", "_SUCCESS")}
    assert sorted(merged) == sorted(single) and all(merged[n] == single[n] for n in single), \
        [n for n in single if merged.get(n) != single[n]]
    schema = json.loads(merged["schema.json"])
    assert {f["name"]: f["type"] for f in schema["features"]}["plan"] == "categorical"
    assert schema["dropped_rows"]["count"] == 10 and "frequencies" in json.loads(merged["stats.json"])["features"]["plan"]

    # `tfpipe shell` reproduces that shard's instance: its map index, its newest try (2) and its
    # slice; the stage reruns inside (the merged data set is cached, so it has nothing to redo)
    shell = subprocess.run([*cmd[:cmd.index("run")], "shell", "sharded_kill", "prep_shard", "--map-index",
                            str(KILLED), "--run", summary["run_id"], "--detach", "--dags-folder", str(dags)],
                           env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert shell.returncode == 0, shell.stderr[-3000:]
    assert f"sharded_kill / {summary['run_id']} / prep_shard[{KILLED}] try 2" in shell.stderr, shell.stderr
    cid = shell.stdout.strip().splitlines()[-1]
    try:
        labels = docker_client.api.inspect_container(cid)["Config"]["Labels"]
        assert (labels["tfpipe.role"], labels["tfpipe.map_index"], labels["tfpipe.try_number"]) == (
            "shell", str(KILLED), "2")
        rerun = subprocess.run(["docker", "exec", cid, "python3", "-m", "trainer", "prep_shard"],
                               capture_output=True, text=True, timeout=180)
        assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
        result = contract.parse_result_line(rerun.stdout.splitlines())
        assert (result["shard"], result["shards"], result["cache_hit"]) == (KILLED, SHARDS, True), result
    finally:
        subprocess.run(["docker", "rm", "-f", cid], capture_output=True)
