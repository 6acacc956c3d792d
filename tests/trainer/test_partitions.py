"""Rolling windows over Hive-style date partitions (``data.window_days``): which days a run reads,
what a missing day does, and what prep records of the window."""

import datetime
import json
import os

import pytest

from tests.trainer.conftest import Workspace, write_blobs_csv
from trainer import contract, partitions, prep, sources
from trainer.errors import BadInput

FIRST_DAY = datetime.date(2026, 10, 1)


def write_partitions(data_root, days=40, rows=30, key="dt", name="part-0.csv"):
    """``days`` daily partitions ``events/<key>=YYYY-MM-DD/<name>`` from 2026-10-01, ``rows`` rows each."""
    for offset in range(days):
        day = FIRST_DAY + datetime.timedelta(days=offset)
        write_blobs_csv(os.path.join(data_root, "events", "%s=%s" % (key, day.isoformat()), name),
                        rows=rows, seed=offset)


def windowed(ws, end, stage="prep", run_id=None, **data):
    config = ws.config(stage, run_id=run_id, data=dict({"path": "events", "window_days": 7}, **data))
    config["run"][contract.WINDOW_END_KEY] = end
    return config


def read_days(files):
    return sorted({rel.split("/", 1)[0] for rel, _ in files})


@pytest.fixture
def parts(tmp_path):
    workspace = Workspace(tmp_path)
    write_partitions(workspace.data)
    return workspace


def test_window_reads_the_n_whole_days_before_the_data_interval_end(parts):
    """A daily run whose data interval ends 2026-11-01T00:00 reads the 7 days 2026-10-25 .. 2026-10-31,
    the newest being the day that ended at the interval end; the other 33 partitions are not read."""
    files = sources.input_files(windowed(parts, "2026-11-01T00:00:00+00:00"))
    assert read_days(files) == ["dt=2026-10-%02d" % d for d in range(25, 32)]
    assert len(files) == 7


def test_an_end_within_a_day_reads_only_days_that_are_over(parts):
    """An end at 13:00 UTC does not read that day (it is not over); an end given with another UTC offset
    is taken in UTC (01:00+02:00 on 2026-11-01 is 2026-10-31T23:00Z: the newest whole day is 10-30)."""
    midday = read_days(sources.input_files(windowed(parts, "2026-11-01T13:00:00+00:00")))
    assert midday[-1] == "dt=2026-10-31" and len(midday) == 7
    offset = read_days(sources.input_files(windowed(parts, "2026-11-01T01:00:00+02:00")))
    assert offset == ["dt=2026-10-%02d" % d for d in range(24, 31)]


def test_relative_paths_keep_the_partition_folder(parts):
    """Equal file names in two partitions stay two inputs: each relative path starts with its partition."""
    files = sources.input_files(windowed(parts, "2026-11-01T00:00:00+00:00", window_days=2))
    assert [rel for rel, _ in files] == ["dt=2026-10-30/part-0.csv", "dt=2026-10-31/part-0.csv"]


def test_a_missing_partition_is_an_error_naming_the_date_and_the_fix(parts):
    """A day of the window without its partition folder fails with BadInput naming that date, the
    window and both fixes; a folder without any CSV file (a lone _SUCCESS) counts as missing too."""
    os.rename(os.path.join(parts.data, "events", "dt=2026-10-28"), os.path.join(parts.data, "gone"))
    empty = os.path.join(parts.data, "events", "dt=2026-10-30")
    for name in os.listdir(empty):
        os.remove(os.path.join(empty, name))
    open(os.path.join(empty, "_SUCCESS"), "w").close()
    with pytest.raises(BadInput) as error:
        sources.input_files(windowed(parts, "2026-11-01T00:00:00+00:00"))
    text = str(error.value)
    assert "2026-10-28, 2026-10-30" in text
    assert "2026-10-25 .. 2026-10-31" in text and "5 of 7 present" in text
    assert "Fix: add the missing partitions, or set data.min_partitions" in text


def test_min_partitions_allows_missing_days_down_to_its_count(parts):
    """With data.min_partitions 6, one missing day of 7 is read around; two missing days fail."""
    os.rename(os.path.join(parts.data, "events", "dt=2026-10-28"), os.path.join(parts.data, "gone-28"))
    files = sources.input_files(windowed(parts, "2026-11-01T00:00:00+00:00", min_partitions=6))
    assert len(read_days(files)) == 6 and "dt=2026-10-28" not in read_days(files)
    os.rename(os.path.join(parts.data, "events", "dt=2026-10-29"), os.path.join(parts.data, "gone-29"))
    with pytest.raises(BadInput, match="2026-10-28, 2026-10-29.*5 of 7 present, at least 6 needed"):
        sources.input_files(windowed(parts, "2026-11-01T00:00:00+00:00", min_partitions=6))


def test_a_window_without_any_partition_fails_even_with_min_partitions(parts):
    """A window wholly outside the data (all 7 days missing) is an error whatever data.min_partitions allows."""
    with pytest.raises(BadInput, match="0 of 7 present"):
        sources.input_files(windowed(parts, "2027-06-01T00:00:00+00:00", min_partitions=1))


def test_a_window_needs_an_end_and_csv(parts):
    """No run.data_interval_end, a bad one, data.format images, or data.min_partitions above the window:
    each a BadInput that names the field and the fix."""
    with pytest.raises(BadInput, match="no window end .*Fix"):
        sources.input_files(windowed(parts, None))
    with pytest.raises(BadInput, match="'yesterday' is not an ISO 8601 time"):
        sources.input_files(windowed(parts, "yesterday"))
    with pytest.raises(BadInput, match="data.format is 'images'.*Fix: set data.window_days to 0"):
        partitions.check_settings({"window_days": 7, "min_partitions": 0, "format": "images"})
    with pytest.raises(BadInput, match="data.min_partitions is 8, above data.window_days 7"):
        partitions.check_settings({"window_days": 7, "min_partitions": 8, "format": "csv"})


def test_partition_key_names_the_folders(tmp_path):
    """data.partition_key "day" reads day=YYYY-MM-DD folders."""
    ws = Workspace(tmp_path)
    write_partitions(ws.data, days=5, key="day")
    files = sources.input_files(windowed(ws, "2026-10-06T00:00:00+00:00", window_days=3, partition_key="day"))
    assert read_days(files) == ["day=2026-10-03", "day=2026-10-04", "day=2026-10-05"]


def test_without_a_window_every_csv_of_the_folder_is_read_as_before(ws):
    """data.window_days 0 (the default) keeps reading data.path as a file or a folder of CSV files."""
    assert [rel for rel, _ in sources.input_files(ws.config("prep"))] == ["blobs.csv"]


def test_prep_records_the_window_and_fingerprints_by_what_it_read(parts):
    """Prep's result, the run's dataset.json and the data set's fingerprint.json name the window and the
    partitions read; two ends give two fingerprints; the same end again (a backfill, here another run
    on a fresh work volume) gives the same fingerprint, and on the first volume a cache hit that still
    records its own window."""
    first = prep.run(windowed(parts, "2026-11-01T00:00:00+00:00", run_id="scheduled__2026-11-01"))
    later = prep.run(windowed(parts, "2026-11-08T00:00:00+00:00", run_id="scheduled__2026-11-08"))
    assert first["fingerprint"] != later["fingerprint"]
    window = first["window"]
    assert window == {"partition_key": "dt", "days": 7, "end": "2026-11-01T00:00:00+00:00",
                      "first": "2026-10-25", "last": "2026-10-31", "missing": [],
                      "partitions": ["dt=2026-10-%02d" % d for d in range(25, 32)]}
    assert later["window"]["partitions"][0] == "dt=2026-11-01"
    assert parts.read("dataset.json", run_id="scheduled__2026-11-01")["window"] == window
    with open(os.path.join(first["dataset_dir"], "fingerprint.json")) as handle:
        recorded = json.load(handle)
    assert recorded["window"] == window
    assert sorted(i["path"] for i in recorded["inputs"]) == ["%s/part-0.csv" % p for p in window["partitions"]]

    again = prep.run(windowed(parts, "2026-11-01T00:00:00+00:00", run_id="backfill__2026-11-01"))
    assert again["cache_hit"] and again["fingerprint"] == first["fingerprint"] and again["window"] == window
    fresh = Workspace(os.path.join(parts.base, "elsewhere"))
    os.rmdir(fresh.data)
    os.symlink(parts.data, fresh.data)
    elsewhere = prep.run(windowed(fresh, "2026-11-01T00:00:00+00:00", run_id="backfill__2026-11-01"))
    assert not elsewhere["cache_hit"] and elsewhere["fingerprint"] == first["fingerprint"]


def test_prep_without_a_window_records_none(ws):
    """A run without data.window_days has no window in its result or its dataset.json."""
    result = prep.run(ws.config("prep"))
    assert "window" not in result and "window" not in ws.read("dataset.json")
