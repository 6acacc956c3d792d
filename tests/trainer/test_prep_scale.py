"""Prep at scale: batches on worker processes, bounded memory, the record encoder, cache modes."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

# Inside the image TensorFlow must import: a broken image fails collection, never skips.
import tensorflow as tf  # noqa: E402

from conftest import REPO, write_blobs_csv  # noqa: E402
from test_prep import read_records  # noqa: E402
from trainer import data, prep, records  # noqa: E402
from trainer.errors import BadInput, WorkerDied  # noqa: E402


@pytest.fixture
def batched(monkeypatch):
    """Prep with tiny batches on two forked workers, so a small CSV takes the parallel path."""
    monkeypatch.setattr(prep, "READ_BYTES", 1024)
    monkeypatch.setattr(prep, "BATCH_BYTES", 2048)
    monkeypatch.setattr(prep, "usable_cpus", lambda: 2)


def test_encoded_examples_parse_like_tensorflows_own():
    encoder = records.ExampleEncoder("floats")
    rows = [(np.arange(40, dtype="<f4") * 0.5, 0, "k"), (np.full(40, -1.25, "<f4"), 300, "ü" * 200),
            (np.linspace(-3, 3, 40).astype("<f4"), 2 ** 40, "")]
    spec = {"features": tf.io.FixedLenFeature([40], tf.float32),
            "label": tf.io.FixedLenFeature([], tf.int64), "key": tf.io.FixedLenFeature([], tf.string)}
    for values, label, key in rows:
        blob = encoder.encode(values.tobytes(), label, key)
        example = tf.train.Example.FromString(blob)
        assert list(example.features.feature["features"].float_list.value) == list(values)
        assert list(example.features.feature["label"].int64_list.value) == [label]
        assert example.features.feature["key"].bytes_list.value[0].decode("utf-8") == key
        parsed = tf.io.parse_single_example(blob, spec)
        assert parsed["features"].numpy().tolist() == values.tolist()
        assert int(parsed["label"]) == label and parsed["key"].numpy().decode() == key
    image = records.ExampleEncoder("image").encode(bytes(range(200)), 1, "cls/a.png")
    example = tf.train.Example.FromString(image)
    assert example.features.feature["image"].bytes_list.value[0] == bytes(range(200))
    with pytest.raises(ValueError, match="kind=.text."):
        records.ExampleEncoder("text")


def write_messy_csv(path, rows=900):
    """Blobs-like rows with blank lines, CRLF line ends and odd spacing; returns {key: (values, label)}."""
    rng = np.random.RandomState(3)
    expected = {}
    lines = ["f0,f1,f2,label"]
    for i in range(rows):
        values = rng.normal(size=3).round(4) * 10
        label = i % 3
        text = "%s,%s, %s ,%d" % (values[0], values[1], values[2], label)
        lines.append(text)
        expected["%s:%s" % (os.path.basename(path), text)] = (values, label)
        if i % 97 == 0:
            lines.append(" , ,")  # blank cells only: skipped like the csv reader does
    with open(path, "w", newline="") as handle:
        handle.write("\r\n".join(lines) + "\r\n")
    return expected


def test_batched_prep_on_workers_reads_every_row_once_in_order(ws, batched, capsys):
    expected = write_messy_csv(os.path.join(ws.data, "messy.csv"))
    result = prep.run(ws.config("prep", data={"path": "messy.csv", "shard_size": 50}))
    out = capsys.readouterr().out
    assert "batch(es) on 2 worker process(es)" in out
    ddir = result["dataset_dir"]
    schema = json.load(open(os.path.join(ddir, "schema.json")))
    stats = json.load(open(os.path.join(ddir, "stats.json")))
    seen = {}
    for split in ("train", "eval"):
        got = read_records(ddir, schema, split)
        keys = [k for k, _, _ in got]
        order = list(expected)
        assert keys == sorted(keys, key=order.index), "records keep the input order"
        assert all(prep.is_eval(k, 42, 0.2) == (split == "eval") for k in keys)
        for key, values, label in got:
            seen[key] = (values, label)
    assert sorted(seen) == sorted(expected)
    for key, (values, label) in expected.items():
        assert seen[key][1] == label
        assert seen[key][0] == pytest.approx(values.astype(np.float32), rel=1e-6)
    assert [len(schema["shards"][s]) for s in ("train", "eval")] == [
        -(-schema["counts"]["train"] // 50), -(-schema["counts"]["eval"] // 50)]
    train = np.array([v for k, (v, _) in expected.items() if not prep.is_eval(k, 42, 0.2)])
    assert stats["features"]["f2"]["mean"] == pytest.approx(train[:, 2].mean(), rel=1e-9)
    assert stats["features"]["f2"]["std"] == pytest.approx(train[:, 2].std(), rel=1e-9)
    assert stats["features"]["f0"]["min"] == pytest.approx(train[:, 0].min())
    assert sum(stats["class_histogram"]["train"]) == schema["counts"]["train"]


def test_batched_prep_equals_one_batch_prep(ws, tmp_path, monkeypatch):
    write_blobs_csv(os.path.join(ws.data, "blobs.csv"), rows=1500)
    one = prep.run(ws.config("prep"))
    other = os.path.join(str(tmp_path), "again")
    os.makedirs(other)
    monkeypatch.setattr(prep, "READ_BYTES", 1024)
    monkeypatch.setattr(prep, "BATCH_BYTES", 4096)
    monkeypatch.setattr(prep, "usable_cpus", lambda: 2)
    import conftest
    again = conftest.Workspace(other)
    write_blobs_csv(os.path.join(again.data, "blobs.csv"), rows=1500)
    many = prep.run(again.config("prep"))
    assert many["fingerprint"] == one["fingerprint"]
    schema = json.load(open(os.path.join(one["dataset_dir"], "schema.json")))
    assert json.load(open(os.path.join(many["dataset_dir"], "schema.json"))) == schema
    for name in schema["shards"]["train"] + schema["shards"]["eval"]:
        with open(os.path.join(one["dataset_dir"], name), "rb") as a, \
                open(os.path.join(many["dataset_dir"], name), "rb") as b:
            assert a.read() == b.read(), name
    stats = [json.load(open(os.path.join(r["dataset_dir"], "stats.json"))) for r in (one, many)]
    assert stats[0]["class_histogram"] == stats[1]["class_histogram"]
    for name, summary in stats[0]["features"].items():
        assert stats[1]["features"][name].pop("histogram") == summary.pop("histogram"), "histograms add up exactly"
        assert stats[1]["features"][name] == pytest.approx(summary, rel=1e-12), name


@pytest.mark.parametrize("line, text, words", [
    (1234, "1.0,abc,3.0,4.0,0", ["blobs.csv line 1234 column 'f1'", "'abc' is not a number"]),
    (1500, "1.0,2.0,0", ["blobs.csv line 1500", "expected 5 columns", "got 3"]),
    (801, "1,2,3,nan,0", ["blobs.csv line 801 column 'f3'", "not a finite number"]),
    (990, "1,2,3,4,", ["blobs.csv line 990 column 'label'", "empty label"]),
    (1100, "1,2,3,4,-2", ["blobs.csv line 1100 column 'label'", "class id -2 is negative"]),
])
def test_errors_name_the_line_whichever_batch_holds_it(ws, batched, line, text, words):
    path = os.path.join(ws.data, "blobs.csv")
    write_blobs_csv(path, rows=2000)
    lines = open(path).read().splitlines()
    lines[line - 1] = text
    open(path, "w").write("\n".join(lines) + "\n")
    with pytest.raises(BadInput) as info:
        prep.run(ws.config("prep"))
    for word in words:
        assert word in str(info.value)
    assert os.listdir(os.path.join(ws.work, "datasets")) == []


REPEATED_ERRORS = """
import faulthandler, os, sys, tempfile
import tensorflow  # noqa: F401  (like the stage's process and these tests: TF's threads are there)
sys.path.insert(0, sys.argv[1])
from conftest import Workspace, write_blobs_csv
from trainer import prep
from trainer.errors import BadInput
prep.READ_BYTES, prep.BATCH_BYTES, prep.usable_cpus = 1024, 2048, lambda: 2
bad = ["1.0,abc,3.0,4.0,0", "1.0,2.0,0", "1,2,3,nan,0", "1,2,3,4,", "1,2,3,4,-2"]
for i in range(int(sys.argv[2])):
    ws = Workspace(tempfile.mkdtemp(dir=sys.argv[3]))
    path = os.path.join(ws.data, "blobs.csv")
    write_blobs_csv(path, rows=2000)
    lines = open(path).read().splitlines()
    lines[800 + (i * 97) % 1000] = bad[i % len(bad)]
    open(path, "w").write("\\n".join(lines) + "\\n")
    faulthandler.dump_traceback_later(60, exit=True)  # a hang: every thread's stack, then exit
    try:
        prep.run(ws.config("prep"))
    except BadInput:
        faulthandler.cancel_dump_traceback_later()
        continue
    sys.exit("no BadInput at iteration %d" % i)
print("done")
"""


def test_a_bad_line_fails_every_time_and_never_hangs_the_workers(tmp_path):
    """One batch's error leaves the others in flight on the workers; the pool is then closed
    without Pool.terminate(), which hung within a few of these runs (a stage hung for good)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        out = subprocess.run([sys.executable, "-c", REPEATED_ERRORS, os.path.join(REPO, "tests", "trainer"), "150",
                              str(tmp_path)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                             timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("prep hung on a CSV with a bad line (the worker pool did not shut down)")
    assert out.returncode == 0 and out.stdout.strip().endswith("done"), (
        "prep hung or failed on a CSV with a bad line:\n" + out.stderr[-4000:])


WORKER_KILLED = """
import faulthandler, os, signal, sys, tempfile
import tensorflow  # noqa: F401
sys.path.insert(0, sys.argv[1])
from conftest import Workspace, write_blobs_csv
from trainer import prep
from trainer.errors import WorkerDied
prep.READ_BYTES, prep.BATCH_BYTES, prep.usable_cpus = 1024, 2048, lambda: 2
real = prep.prepare_batch
calls = []


def killed_on_its_second_batch(task):  # as the out-of-memory killer would end a worker mid-batch
    calls.append(1)
    if len(calls) == 2:  # each of the two workers counts its own batches: the second of one of them
        os.kill(os.getpid(), signal.SIGKILL)
    return real(task)


prep.prepare_batch = killed_on_its_second_batch  # before the pool forks: the workers see it
ws = Workspace(tempfile.mkdtemp(dir=sys.argv[2]))
write_blobs_csv(os.path.join(ws.data, "blobs.csv"), rows=2000)
faulthandler.dump_traceback_later(60, exit=True)  # a hang: every thread's stack, then exit
try:
    prep.run(ws.config("prep"))
except WorkerDied as error:
    faulthandler.cancel_dump_traceback_later()
    print("exit", error.exit_code, error)
    print("datasets", os.listdir(os.path.join(ws.work, "datasets")))
    sys.exit(0)
sys.exit("prep finished although a worker was killed")
"""


def test_a_worker_killed_mid_batch_fails_the_stage_clearly_instead_of_waiting_for_ever(tmp_path):
    """multiprocessing.Pool waits for a dead worker's batch for ever; the stage must fail at once,
    say what killed it and what to change, write nothing, and exit 137 (retried, like a kill)."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        out = subprocess.run([sys.executable, "-c", WORKER_KILLED, os.path.join(REPO, "tests", "trainer"), str(tmp_path)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                             timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("prep waited for ever for the batch of a killed worker")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "exit 137 prep: a parse worker process died abruptly, most likely killed" in out.stdout, out.stdout
    assert "out-of-memory" in out.stdout and "resources.mem_limit" in out.stdout
    assert "datasets []" in out.stdout


def test_a_worker_that_died_before_the_next_batch_is_sent_fails_the_same_way():
    """The kill above lands while the stage waits for a result, or, as often, before it sends the
    next batch: the pool refuses the batch then, and that must be the same clear error."""
    import signal
    import time

    with prep.Workers(2) as workers:
        os.kill(next(iter(workers._pool._processes)), signal.SIGKILL)
        deadline = time.time() + 30
        while not workers._pool._broken and time.time() < deadline:
            time.sleep(0.05)
        assert workers._pool._broken, "the pool did not notice its killed worker in 30 s"
        with pytest.raises(WorkerDied, match="a parse worker process died abruptly"):
            list(workers.map(abs, range(10)))


def test_every_worker_is_forked_when_the_pool_is_made():
    """Before the stage imports TensorFlow and grows: a worker forked later would inherit TF's
    threads and the parent's memory (Python 3.9 forks workers only on demand)."""
    import multiprocessing

    before = len(multiprocessing.active_children())
    with prep.Workers(3):
        assert len(multiprocessing.active_children()) - before == 3


def test_names_as_labels_after_numbers_in_early_batches(ws, batched, capsys):
    path = os.path.join(ws.data, "blobs.csv")
    write_blobs_csv(path, rows=1200)
    lines = open(path).read().splitlines()
    lines[-1] = lines[-1].rsplit(",", 1)[0] + ",other"  # one name, in the last batch
    open(path, "w").write("\n".join(lines) + "\n")
    result = prep.run(ws.config("prep"))
    assert "labels are not all class ids: reading every label first" in capsys.readouterr().out
    schema = json.load(open(os.path.join(result["dataset_dir"], "schema.json")))
    assert schema["class_names"] == ["0", "1", "2", "other"]
    labels = {k.rsplit(",", 1)[1]: label for split in ("train", "eval")
              for k, _, label in read_records(result["dataset_dir"], schema, split)}
    assert labels == {"0": 0, "1": 1, "2": 2, "other": 3}


def test_quoted_csv_is_read_with_the_csv_module(ws, batched, capsys):
    path = os.path.join(ws.data, "quoted.csv")
    with open(path, "w") as handle:
        handle.write('id,x,label\n')
        for i in range(400):
            handle.write('"row\n%d",%d.5,"%s"\n' % (i, i, "yes" if i % 2 else "no"))
    result = prep.run(ws.config("prep", data={"path": "quoted.csv", "key": "id"}))
    # read row by row, and still parsed on the worker processes, not in the stage's own
    assert "batch(es) on 2 worker process(es)" in capsys.readouterr().out
    schema = json.load(open(os.path.join(result["dataset_dir"], "schema.json")))
    assert schema["class_names"] == ["no", "yes"]
    got = {k: (v[0], label) for s in ("train", "eval")
           for k, v, label in read_records(result["dataset_dir"], schema, s)}
    assert len(got) == 400 and got["row\n7"] == (7.5, 1)


def test_workers_follow_the_cpus_the_process_may_use():
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "from trainer import prep; print(prep.usable_cpus())")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                         universal_newlines=True, check=True).stdout
    assert out.strip() == "1"


PEAK = """
import json, os, resource, sys
from trainer import prep
prep.READ_BYTES, prep.BATCH_BYTES = 64 << 10, 256 << 10  # many batches at both sizes
prep.run(json.loads(sys.argv[1]))
with open("/proc/self/status") as f:
    own = [int(l.split()[1]) for l in f if l.startswith("VmHWM:")][0] // 1024
print("PEAK", own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024)
"""


def test_peak_memory_does_not_grow_with_the_row_count(tmp_path):
    """20,000 and 200,000 rows: the same peak RSS (MiB) in prep and in its workers.

    Rows held in memory would cost about 400 bytes each here (a list of 8 floats, the key and
    the record): 70 MiB more at 200,000 rows than at 20,000.
    """
    import conftest

    rng = np.random.RandomState(0)
    lines = ["%s,%d" % (",".join("%.3f" % v for v in rng.normal(size=8)), i % 10)
             for i in range(2000)]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    peaks = {}
    for rows in (20000, 200000):
        ws = conftest.Workspace(os.path.join(str(tmp_path), str(rows)))
        with open(os.path.join(ws.data, "big.csv"), "w") as handle:
            handle.write(",".join(["x%d" % i for i in range(8)] + ["label"]) + "\n")
            for _ in range(0, rows, len(lines)):
                handle.write("\n".join(lines) + "\n")
        config = ws.config("prep", data={"path": "big.csv"})
        out = subprocess.run([sys.executable, "-c", PEAK, json.dumps(config)], env=env,
                             stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout
        peaks[rows] = [int(v) for v in out.split("PEAK")[1].split()]
    (own_small, workers_small), (own_big, workers_big) = peaks[20000], peaks[200000]
    assert workers_small > 0, "both sizes must run on the worker processes"
    assert own_big - own_small < 25 and workers_big - workers_small < 25, peaks


def test_cache_modes_yield_the_same_examples(trained, capsys, monkeypatch):
    from trainer import common

    dataset_dir, schema, _ = common.load_dataset(trained.config("train"))
    reference = [(x.numpy().tolist(), int(y)) for x, y in data.base_dataset(dataset_dir, schema, "train", "none")]
    for mode in ("memory", "file", "auto"):
        dataset = data.base_dataset(dataset_dir, schema, "train", mode)
        for _ in range(2):  # the second pass reads the cache
            assert [(x.numpy().tolist(), int(y)) for x, y in dataset] == reference, mode
    out = capsys.readouterr().out
    assert "data: train split: cached in a file, %s" % data.cache_root(dataset_dir) in out
    assert "data: train split: cached in memory (about 0 MiB parsed, within the budget of" in out
    assert "data: train split: not cached, the shards are parsed again every epoch (training.cache is none)" in out
    # a container with less memory than the data set needs: auto takes the file
    monkeypatch.setattr(common, "memory_limit", lambda: common.rss_bytes() + 1000)
    assert data.cache_mode("auto", schema)[0] == "file"
    with pytest.raises(ValueError, match="cache=.disk."):
        data.cache_mode("disk", schema)


def test_file_caches_of_dead_processes_are_removed(tmp_path):
    root = os.path.join(str(tmp_path), "work", "datasets", "abc")
    os.makedirs(root)
    cache = os.path.join(str(tmp_path), "work", "cache", "tfdata")
    os.makedirs(os.path.join(cache, "abc-train-dead"))
    open(os.path.join(cache, "abc-train-dead", ".owner.lock"), "w").close()  # nobody holds it
    prefix = data.cache_file(root, "train")
    assert prefix.startswith(os.path.join(cache, "abc-train-"))
    assert os.listdir(cache) == [os.path.basename(os.path.dirname(prefix))]
    data.cache_file(root, "eval")  # our own live cache is kept
    assert len(os.listdir(cache)) == 2


def test_auto_is_the_default_cache_and_takes_memory_only_within_half_of_what_the_limit_leaves(monkeypatch):
    """The docs' rule for ``training.cache`` (the default ``auto``): the parsed size (values, an
    8-byte label and 256 bytes per example) against half of what the memory limit leaves to the
    process; the limit from cgroup v2, else v1, else the machine's memory."""
    import builtins
    import io

    from trainer import common, contract

    assert contract.SECTIONS["training"]["cache"]["default"] == "auto"
    schema = {"format": "csv", "class_names": ["a", "b"], "features": [{"name": "f%d" % i} for i in range(10)],
              "counts": {"train": 800, "eval": 200}}
    need = 1000 * (10 * 4 + 8 + 256)
    assert data.cached_bytes(schema) == need
    rss = 50 << 20
    monkeypatch.setattr(common, "rss_bytes", lambda: rss)
    monkeypatch.setattr(common, "memory_limit", lambda: rss + 2 * need)  # leaves 2x: half is exactly it
    assert data.cache_mode("auto", schema)[0] == "memory"
    monkeypatch.setattr(common, "memory_limit", lambda: rss + 2 * need - 2)  # one byte of budget short
    mode, reason = data.cache_mode("auto", schema)
    assert mode == "file" and "above the budget of" in reason and "half of what the" in reason
    monkeypatch.undo()

    # where the limit comes from: the smallest of cgroup v2's, v1's (a huge number means none) and
    # the machine's memory
    def reading(files):
        real_open = builtins.open

        def fake_open(path, *args, **kwargs):
            if path in files:
                if files[path] is None:
                    raise FileNotFoundError(path)
                return io.StringIO(files[path])
            return real_open(path, *args, **kwargs)
        monkeypatch.setattr(builtins, "open", fake_open)
        try:
            return common.memory_limit()
        finally:
            monkeypatch.setattr(builtins, "open", real_open)

    v2, v1, meminfo = "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes", "/proc/meminfo"
    machine = "MemTotal:       16384 kB\n"
    assert reading({v2: "1048576\n", v1: None, meminfo: machine}) == 1048576
    assert reading({v2: None, v1: "2097152\n", meminfo: machine}) == 2097152
    assert reading({v2: "max\n", v1: None, meminfo: machine}) == 16384 * 1024
    assert reading({v2: None, v1: "9223372036854771712\n", meminfo: machine}) == 16384 * 1024


def test_batches_are_about_4_mib_and_at_most_two_per_worker_are_in_flight():
    """The docs (Data at scale): prep cuts a CSV into batches of about 4 MiB, and at most two batches per worker are in
    flight, so memory does not grow with the input: the pool takes the next batch from the reader
    only once the oldest result is handed on."""
    assert prep.BATCH_BYTES == 4 << 20
    taken, handed = [], []

    def batches():
        for i in range(40):
            taken.append(i)
            yield i

    taken_at_each_result = []
    with prep.Workers(3) as workers:
        for result in workers.map(abs, batches()):
            handed.append(result)
            taken_at_each_result.append(len(taken))
    assert handed == list(range(40))
    # the window fills to two per worker, then each result handed on lets one more batch in
    in_flight = [taken - (i + 1) for i, taken in enumerate(taken_at_each_result)]
    assert taken_at_each_result[0] == 2 * 3 and max(in_flight) <= 2 * 3 - 1, taken_at_each_result
