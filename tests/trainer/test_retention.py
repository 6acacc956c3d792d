"""Work-volume retention (trainer.retention) against real directory trees, inside the image."""

import json
import os
import subprocess
import sys
import time

import pytest

from trainer import contract, retention

DAG = "nightly"
HOUR = 3600.0


def _write(path, data=b"x" * 5000):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(data)


def _age(path, seconds_ago, now):
    """Set the mtime of a whole tree to ``now - seconds_ago``."""
    stamp = now - seconds_ago
    for root, dirs, files in os.walk(path, topdown=False):
        for name in files + dirs:
            os.utime(os.path.join(root, name), (stamp, stamp))
        os.utime(root, (stamp, stamp))


def make_run(work, run_id, fingerprint, age_s, now, dag=DAG):
    run_dir = os.path.join(work, "runs", contract.safe_name(dag), contract.safe_name(run_id, 120))
    _write(os.path.join(run_dir, "train", "checkpoints", "ckpt-1.data-00000-of-00001"), b"c" * 20000)
    _write(os.path.join(run_dir, "train", "tensorboard", "train", "events.out.tfevents.1"), b"e" * 3000)
    _write(os.path.join(run_dir, "dataset.json"), json.dumps({"fingerprint": fingerprint}).encode())
    _write(os.path.join(run_dir, "config", "prep.json"),
           json.dumps({"run": {"dag_id": dag, "run_id": run_id}}).encode())
    _age(run_dir, age_s, now)
    return run_dir


def make_dataset(work, fingerprint, age_s, now):
    path = os.path.join(work, "datasets", fingerprint)
    _write(os.path.join(path, "train-00000.tfrecord"), b"d" * 10000)
    _write(os.path.join(path, "_SUCCESS"), b"now\n")
    _age(path, age_s, now)
    return path


def make_version(models, name, version, run_id, dag=DAG):
    _write(os.path.join(models, name, str(version), "metadata.json"),
           json.dumps({"dag_id": dag, "run_id": run_id, "version": version}).encode())


def request(tmp_path, **overrides):
    base = {"dag_id": DAG, "run_id": "scheduled__2026-03-12T03:00:00+00:00", "model_name": "m",
            "keep_runs": 3, "min_idle_seconds": 0, "protect_run_ids": [],
            "work": str(tmp_path / "work"), "models": str(tmp_path / "models")}
    base.update(overrides)
    return base


@pytest.fixture
def volume(tmp_path):
    """Twelve nightly runs, one data set per night (a new fingerprint each), two kept versions."""
    now = time.time()
    work, models = str(tmp_path / "work"), str(tmp_path / "models")
    runs = []
    for night in range(1, 13):
        run_id = "scheduled__2026-03-%02dT03:00:00+00:00" % night
        age = (13 - night) * 24 * HOUR
        make_dataset(work, "fp%02d" % night, age, now)
        runs.append(make_run(work, run_id, "fp%02d" % night, age, now))
    # versions of nights 2 and 5 are still kept; night 12 is the current run
    make_version(models, "m", 7, "scheduled__2026-03-02T03:00:00+00:00")
    make_version(models, "m", 8, "scheduled__2026-03-05T03:00:00+00:00")
    # another DAG on the same volume uses fp01
    make_run(work, "manual__x", "fp01", 30 * 24 * HOUR, now, dag="other")
    return {"now": now, "work": work, "runs": runs}


def _names(result, kind, removed=True):
    return sorted(os.path.basename(r["path"]) for r in result["removed" if removed else "kept"]
                  if r["kind"] == kind)


def test_keeps_newest_runs_runs_with_kept_versions_and_their_data_sets(tmp_path, volume, capsys):
    before = retention.tree_usage(volume["work"])[0]
    result = retention.run(request(tmp_path), now=volume["now"])
    after = retention.tree_usage(volume["work"])[0]
    kept_runs = _names(result, "run", removed=False)
    assert kept_runs == sorted(contract.safe_name("scheduled__2026-03-%02dT03:00:00+00:00" % n, 120)
                               for n in (2, 5, 10, 11, 12))
    assert len(_names(result, "run")) == 7
    for run_dir in volume["runs"]:
        assert os.path.isdir(run_dir) == (os.path.basename(run_dir) in kept_runs)
    # TensorBoard events go with their run
    events = [os.path.join(r, "train", "tensorboard") for r in volume["runs"]]
    assert sum(os.path.isdir(e) for e in events) == 5
    # data sets: those of kept runs (any DAG), the newest; the rest removed
    assert sorted(os.listdir(os.path.join(volume["work"], "datasets"))) == ["fp01", "fp02", "fp05", "fp10",
                                                                          "fp11", "fp12"]
    assert result["freed_bytes"] == before - after > 0
    log = capsys.readouterr().out
    assert "retention: removed run " in log and "retention: removed dataset datasets/fp03" in log
    assert "freed %s" % retention.human_bytes(result["freed_bytes"]) in log
    assert not [n for n in os.listdir(os.path.join(volume["work"], "runs", DAG)) if n.startswith(".tmp-")]
    # the other DAG's run dir is never touched
    assert os.path.isdir(os.path.join(volume["work"], "runs", "other", "manual__x"))


def test_never_removes_active_current_or_recently_written_runs(tmp_path, volume):
    now = volume["now"]
    oldest = "scheduled__2026-03-01T03:00:00+00:00"   # up for retry per the metadata DB
    current = "scheduled__2026-03-03T03:00:00+00:00"  # the run the cleanup task belongs to
    recent = volume["runs"][3]                          # night 4: written to a minute ago
    _write(os.path.join(recent, "train", "checkpoints", "ckpt-2.index"), b"i")
    result = retention.run(request(tmp_path, run_id=current, protect_run_ids=[oldest],
                                   min_idle_seconds=2 * HOUR), now=now)
    kept = {os.path.basename(r["path"]): r["reasons"] for r in result["kept"] if r["kind"] == "run"}
    assert "active or retryable in the metadata DB" in kept[contract.safe_name(oldest, 120)]
    assert "the current run" in kept[contract.safe_name(current, 120)]
    assert any("written to" in reason for reason in kept[os.path.basename(recent)])
    for run_dir in (volume["runs"][0], volume["runs"][2], recent):
        assert os.path.isdir(os.path.join(run_dir, "train", "checkpoints"))


def test_dry_run_removes_nothing(tmp_path, volume):
    before = retention.tree_usage(volume["work"])[0]
    result = retention.run(request(tmp_path), dry_run=True, now=volume["now"])
    assert result["removed"] and result["freed_bytes"] > 0
    assert retention.tree_usage(volume["work"])[0] == before


def test_recently_reused_data_set_is_kept(tmp_path, volume):
    # prep touches a data set on a cache hit; a concurrent run may not have written its pointer yet
    os.utime(os.path.join(volume["work"], "datasets", "fp04"), None)
    result = retention.run(request(tmp_path, min_idle_seconds=600), now=time.time())
    assert "fp04" in _names(result, "dataset", removed=False)


def test_the_newest_data_set_is_kept_even_when_no_run_uses_it(tmp_path, volume):
    # a prep that published fp13 and failed before its run dir pointed at it: the next prep's cache hit
    make_dataset(volume["work"], "fp13", 60, volume["now"])
    result = retention.run(request(tmp_path), now=volume["now"])
    kept = {os.path.basename(r["path"]): r["reasons"] for r in result["kept"] if r["kind"] == "dataset"}
    assert kept["fp13"] == ["the newest data set"]
    assert "fp12" in kept and "fp03" in _names(result, "dataset")


def test_a_removal_renames_first_so_an_interrupted_one_leaves_nothing_half_gone_at_the_name(tmp_path):
    from trainer import atomic

    run_dir = tmp_path / "runs" / DAG / "r1"
    _write(str(run_dir / "train" / "checkpoints" / "ckpt-1.index"))
    _write(str(run_dir / "stuck" / "events"))
    os.chmod(str(run_dir / "stuck"), 0o500)  # its file cannot be unlinked: the removal stops part way
    try:
        atomic.remove_dir(str(run_dir))
        assert not os.path.lexists(str(run_dir))
        hidden = [n for n in os.listdir(str(run_dir.parent)) if n.startswith(".tmp-deleted-")]
        assert len(hidden) == 1, os.listdir(str(run_dir.parent))
        # what could not go waits under the hidden name, for the next cleanup's stale-temp sweep
        assert os.path.isfile(str(run_dir.parent / hidden[0] / "stuck" / "events"))
        assert not os.path.exists(str(run_dir.parent / hidden[0] / "train"))
    finally:
        for folder, _dirs, _files in os.walk(str(tmp_path)):
            os.chmod(folder, 0o700)


def test_idempotent_and_empty_volume(tmp_path, volume):
    retention.run(request(tmp_path), now=volume["now"])
    again = retention.run(request(tmp_path), now=volume["now"])
    assert again["removed"] == [] and again["freed_bytes"] == 0
    empty = retention.run(request(tmp_path / "nothing"))
    assert empty["removed"] == [] and empty["kept"] == []


@pytest.mark.parametrize("field,value,message", [
    ("keep_runs", 0, "keep_runs must be >= 1"),
    ("keep_runs", "3", "keep_runs is missing or not a int"),
    ("min_idle_seconds", -1, "min_idle_seconds must be >= 0"),
    ("protect_run_ids", "run1", "protect_run_ids must be a list"),
])
def test_bad_request_is_bad_input(tmp_path, field, value, message):
    from trainer.errors import BadInput

    with pytest.raises(BadInput, match=message):
        retention.run(request(tmp_path, **{field: value}))


def test_command_line_prints_result_line_and_exit_codes(tmp_path, volume):
    env = dict(os.environ, **{retention.REQUEST_ENV: json.dumps(request(tmp_path))})
    proc = subprocess.run([sys.executable, "-m", "trainer.retention"], env=env, capture_output=True,
                          universal_newlines=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = contract.parse_result_line(proc.stdout.splitlines())
    assert len([r for r in result["removed"] if r["kind"] == "run"]) == 7
    # a request file and a result file work as the environment and the result line do
    request_file, result_file = tmp_path / "request.json", tmp_path / "result.json"
    request_file.write_text(json.dumps(request(tmp_path)))
    proc = subprocess.run([sys.executable, "-m", "trainer.retention", "--request", str(request_file),
                           "--result", str(result_file)], capture_output=True, universal_newlines=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(result_file.read_text())["removed"] == [], "the second pass finds nothing left to remove"
    env[retention.REQUEST_ENV] = json.dumps(request(tmp_path, keep_runs=0))
    proc = subprocess.run([sys.executable, "-m", "trainer.retention"], env=env, capture_output=True,
                          universal_newlines=True, timeout=60)
    assert proc.returncode == contract.ExitCode.BAD_INPUT and "keep_runs must be >= 1" in proc.stderr


def test_program_does_not_import_tensorflow():
    code = "import sys, trainer.retention; print('tensorflow' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, universal_newlines=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def _plant_temps(parent, now):
    """An old (2 h) and a fresh hidden temporary dir in ``parent``, as an interrupted removal
    (``.tmp-deleted-*``) or a killed stage (``.tmp-*``) leaves them; return their paths."""
    old_removal = os.path.join(parent, ".tmp-deleted-old")
    old_stage = os.path.join(parent, ".tmp-killedprep")
    fresh = os.path.join(parent, ".tmp-deleted-fresh")
    for path in (old_removal, old_stage, fresh):
        _write(os.path.join(path, "left", "part"), b"p" * 4000)
    _age(old_removal, 2 * HOUR, now)
    _age(old_stage, 2 * HOUR, now)
    _age(fresh, 60, now)
    return {"old": [old_removal, old_stage], "fresh": fresh}


def test_cleanup_finishes_interrupted_removals_in_its_runs_dir_only(tmp_path, volume):
    """Cleanup deletes ``.tmp-*`` dirs older than an hour in ``runs/<its dag>/`` (an interrupted
    removal), keeps younger ones there, and leaves those under ``datasets/`` (prep's to remove) and
    under another DAG's runs dir alone; a dry run removes none."""
    now = volume["now"]
    work = volume["work"]
    runs = _plant_temps(os.path.join(work, "runs", DAG), time.time())
    datasets = _plant_temps(os.path.join(work, "datasets"), time.time())
    other = _plant_temps(os.path.join(work, "runs", "other"), time.time())
    retention.run(request(tmp_path), dry_run=True, now=now)
    assert all(os.path.isdir(p) for p in runs["old"] + [runs["fresh"]])
    result = retention.run(request(tmp_path), now=now)
    assert not any(os.path.exists(p) for p in runs["old"]), "an old temp dir in runs/<dag>/ survived cleanup"
    assert os.path.isdir(runs["fresh"]), "a temp dir younger than an hour was removed"
    for place in (datasets, other):
        assert all(os.path.isdir(p) for p in place["old"] + [place["fresh"]])
    # temp dirs are never reported as run dirs or data sets, kept or removed
    assert not [r for r in result["removed"] + result["kept"] if ".tmp-" in r["path"]]
