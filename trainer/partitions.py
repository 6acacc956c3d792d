"""Rolling windows over Hive-style date partitions: which ``<key>=YYYY-MM-DD/`` folders a run reads.

With ``data.window_days`` N above 0, ``data.path`` is a folder of date partitions
(``events/dt=YYYY-MM-DD/*.csv``, or ``*.parquet`` with ``data.format`` parquet) and prep reads the
table files of the partitions of the N whole days
(UTC) before the run's window end (``run.data_interval_end`` of the stage config: the run's data
interval end, or when it has none the time it was triggered). A day is whole once it is over, so the
newest day read is the one before the end's date: a daily run with the data interval [D, D+1)
reads ``dt=D`` as its newest, and so does a run whose interval ends at any time of day D+1. The
window is a pure function of the end, so a backfill of a past date reads exactly that date's
partitions and, with unchanged files, gets the same fingerprint.

A day of the window without a partition folder holding a table file is missing: an error naming the
missing dates, unless ``data.min_partitions`` (above 0) allows it by asking only that many present.
Partitions outside the window, and folders that are not ``<key>=<date>``, are never read.
"""

import datetime
import os

from trainer import contract
from trainer.errors import BadInput


def setting(data, name):
    """``data[name]``, or the contract's default where a config made by hand leaves it out."""
    return data.get(name, contract.SECTIONS["data"][name]["default"])


def enabled(data):
    """Whether ``data`` (the config's data section) reads a window of date partitions."""
    return bool(data.get("window_days"))


def parse_end(value):
    """The window end (an ISO 8601 time, with a UTC offset or naive UTC) as an aware UTC datetime."""
    if not isinstance(value, str) or not value:
        raise BadInput("data.window_days is set but the run has no window end (run.%s is %r). Fix: run "
                       "the stage from its Airflow task, which sets it from the run's data interval, or "
                       "set data.window_days to 0 to read every file under data.path" % (contract.WINDOW_END_KEY, value))
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise BadInput("run.%s %r is not an ISO 8601 time such as 2026-12-07T00:00:00+00:00"
                       % (contract.WINDOW_END_KEY, value))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment.astimezone(datetime.timezone.utc)


def window_days(end, days):
    """The ``days`` whole UTC days before ``end`` (an ISO time), oldest first, as ``datetime.date``."""
    newest = parse_end(end).date() - datetime.timedelta(days=1)
    return [newest - datetime.timedelta(days=back) for back in range(days - 1, -1, -1)]


def partition_name(key, day):
    """The folder name of ``day``'s partition: ``<key>=YYYY-MM-DD``."""
    return "%s=%s" % (key, day.isoformat())


def extension(data):
    """The file name ending of the tables ``data.format`` reads: ``.csv`` or ``.parquet``."""
    return "." + data["format"]


def table_names(folder, ending):
    """The sorted names of the files in ``folder`` whose names end in ``ending`` (any case)."""
    return sorted(n for n in os.listdir(folder)
                  if n.lower().endswith(ending) and not n.startswith(".")
                  and os.path.isfile(os.path.join(folder, n)))


def check_settings(data):
    """Refuse window settings that can never work: a window over images, a minimum above the window."""
    days, least = data["window_days"], setting(data, "min_partitions")
    if data["format"] not in contract.TABULAR_FORMATS:
        raise BadInput("data.window_days is %d but data.format is %r: date windows read CSV or Parquet partitions. "
                       "Fix: set data.window_days to 0 for image folders" % (days, data["format"]))
    if least > days:
        raise BadInput("data.min_partitions is %d, above data.window_days %d: a window of %d day(s) never "
                       "holds that many partitions. Fix: set data.min_partitions to at most %d (0: every day)"
                       % (least, days, days, days))


def window_files(root, data, end):
    """The table files of the window's partitions under ``root``, as ``(relative_path, absolute_path)``.

    Relative paths keep the partition folder (``dt=YYYY-MM-DD/part-0.csv``), so equal file names in
    two partitions stay two inputs. Raises :class:`BadInput` when days are missing beyond what
    ``data.min_partitions`` allows, or when the window holds no partition at all.
    """
    check_settings(data)
    if not os.path.isdir(root):
        raise BadInput("data.path %s must be a folder of date partitions (%s=YYYY-MM-DD/) when "
                       "data.window_days is set" % (root, setting(data, "partition_key")))
    key, days = setting(data, "partition_key"), window_days(end, data["window_days"])
    files, missing = [], []
    for day in days:
        name = partition_name(key, day)
        folder = os.path.join(root, name)
        names = table_names(folder, extension(data)) if os.path.isdir(folder) else []
        if not names:
            missing.append(day.isoformat())
        files.extend(("%s/%s" % (name, n), os.path.join(folder, n)) for n in names)
    present = len(days) - len(missing)
    least = setting(data, "min_partitions") or len(days)
    if present < least or not present:
        raise BadInput(
            "data.path %s: the window of %d day(s) %s .. %s (the %d whole UTC days before the run's data "
            "interval end %s) lacks the partition(s) %s (no %s=<date>/ folder with a *%s file); %d of %d "
            "present, %s needed. Fix: add the missing partitions, or set data.min_partitions to the number "
            "of partitions a run needs (%d are present)"
            % (root, len(days), days[0].isoformat(), days[-1].isoformat(), len(days), end,
               _shown(missing), key, extension(data), present, len(days), "every day" if not setting(data, "min_partitions")
               else "at least %d" % least, present))
    return files


def _shown(dates, most=10):
    if len(dates) <= most:
        return ", ".join(dates)
    return "%s, ... (%d more), %s" % (", ".join(dates[:most - 1]), len(dates) - most, dates[-1])


def summary(data, end, files):
    """What a run read of the window, for the data set's provenance, the run and lineage; None
    without a window. ``files`` are :func:`window_files`' answer."""
    if not enabled(data):
        return None
    key, days = setting(data, "partition_key"), window_days(end, data["window_days"])
    read = sorted({rel.split("/", 1)[0] for rel, _ in files})
    wanted = [partition_name(key, day) for day in days]
    return {"partition_key": key, "days": data["window_days"], "end": parse_end(end).isoformat(),
            "first": days[0].isoformat(), "last": days[-1].isoformat(), "partitions": read,
            "missing": [name for name in wanted if name not in read]}
