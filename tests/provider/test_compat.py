"""tfpipe.compat finds each feature on whichever Airflow 3 release runs the tests.

`make test` runs these on the newest and the oldest supported release, `make test-compat
AIRFLOW_VERSION=X.Y.Z` on any other; each test holds on every one of them.
"""

from __future__ import annotations

import datetime
import importlib.util
import inspect

import pytest

from tfpipe import PipelineConfig, compat, training_pipeline


def _config(**overrides) -> PipelineConfig:
    return PipelineConfig.from_dict({
        "dag_id": "compat", "image": {"ref": "tfpipe/trainer:0.1.0"}, "data": {"path": "digits/digits.csv"},
        "volumes": {"data": "/srv/data", "work": "/srv/work", "models": "/srv/models"},
        "retry_delay_seconds": 60, **overrides})


def test_dagbag_comes_from_its_current_home():
    newer = importlib.util.find_spec("airflow.dag_processing.dagbag") is not None
    home = "airflow.dag_processing.dagbag" if newer else "airflow.models.dagbag"
    assert compat.DagBag is getattr(importlib.import_module(home), "DagBag")


def test_train_retries_double_the_wait_as_airflow_computes_it():
    """Airflow's own retry arithmetic: waits of retry_delay * 2 ** (try - 1), plus up to as much jitter."""
    from airflow.models.taskinstance import TaskInstance

    train = training_pipeline(_config()).get_task("train")
    assert train.retries >= 2
    needs_version = "dag_version_id" in inspect.signature(TaskInstance.__init__).parameters
    ti = TaskInstance(train, run_id="manual__compat", **({"dag_version_id": None} if needs_version else {}))
    ti.end_date = datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
    for try_number in (1, 2, 3, 4):
        ti.try_number = try_number
        wait = (ti.next_retry_datetime() - ti.end_date).total_seconds()
        least = 60 * 2 ** (try_number - 1)
        assert least <= wait < 2 * least, (try_number, wait)


def test_asset_or_time_schedule_survives_serialization():
    """A cron schedule plus a data asset: the scheduler sees both, on every release."""
    dag = training_pipeline(_config(schedule="0 3 * * *", data_asset="file:///srv/raw/digits"))
    assert isinstance(dag.timetable, compat.AssetOrTimeSchedule)
    restored = compat.DagSerialization.from_dict(compat.DagSerialization.to_dict(dag)).timetable
    assert restored.summary == "Asset or 0 3 * * *"
    assert "file:///srv/raw/digits" in repr(restored.asset_condition)


def test_resumable_jobs_are_airflows_or_the_stand_in():
    native = importlib.util.find_spec("airflow.sdk.bases.resumablejobmixin") is not None
    assert compat.has_resumable_jobs() is native
    assert callable(getattr(compat.ResumableJobMixin, "execute_resumable"))
    if not native:  # before 3.3: the common-compat stand-in that submits a new job on every try
        assert compat.ResumableJobMixin.__module__ == "airflow.providers.common.compat._resumable_job_mixin"
    assert compat.task_state_store({}) is None
    store = object()
    assert compat.task_state_store({"task_state_store": store}) is store


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'DagFolder'"):
        compat.DagFolder  # noqa: B018


def _lock_pins() -> dict[str, str]:
    """Lock file name -> the apache-airflow release it pins."""
    from tests.conftest import REPO

    pins = {}
    for lock in sorted((REPO / "requirements").glob("airflow-*.lock")):
        pins[lock.name] = next(line.split("==")[1].strip() for line in lock.read_text().splitlines()
                               if line.startswith("apache-airflow=="))
    return pins


def test_lower_bound_readme_and_locks_agree():
    """pyproject's lower bound is the oldest locked (and so tested) release; the README lists every lock."""
    import tomllib

    from packaging.version import Version

    from tests.conftest import REPO

    pins = _lock_pins()
    assert len(pins) >= 4, pins
    dependencies = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    bound = next(d for d in dependencies if d.startswith("apache-airflow>="))
    assert bound == "apache-airflow>=" + min(pins.values(), key=Version)
    readme = (REPO / "README.md").read_text()
    for lock, version in pins.items():
        assert f"| {version} | `" in readme and lock.split("-")[1].removesuffix(".lock") in version, lock


def test_the_main_venv_s_lock_is_the_newest_release_s_lock_as_readme_says():
    """README's table: the main venv's ``host.lock`` (= ``airflow-X.Y.lock``) pins the newest release.
    The twin is a symlink today; were it a copy, bumping one of the two alone would fail here."""
    import re

    from packaging.version import Version

    from tests.conftest import REPO

    def pins(path):
        return sorted(line for line in path.read_text().splitlines() if line and not line.startswith("#"))

    readme = (REPO / "README.md").read_text()
    row = re.search(r"^\| (\S+) \| `host\.lock` \(= `(airflow-[\d.]+\.lock)`\) \|", readme, re.M)
    assert row, "README's table has no host.lock row"
    version, twin = row.groups()
    newest = max(_lock_pins().items(), key=lambda item: Version(item[1]))
    assert (twin, version) == newest
    assert pins(REPO / "requirements" / "host.lock") == pins(REPO / "requirements" / twin)


def test_a_params_rejection_is_recognised_in_both_forms_and_nothing_else_is():
    """3.2 refuses a conf its Params reject with a plain ValueError while creating the run; the other
    releases with ParamValidationError (raised here by this release's own Param)."""
    from airflow.sdk import Param

    with pytest.raises(Exception) as raised:
        Param(3, type="integer", minimum=1).resolve("three")
    assert compat.is_param_rejection(raised.value), repr(raised.value)
    assert compat.is_param_rejection(ValueError("Invalid input for param epochs: 'three' is not of type 'integer'"))
    assert not compat.is_param_rejection(ValueError("invalid literal for int() with base 10: 'three'"))
    assert not compat.is_param_rejection(TypeError("Invalid input for param epochs: not a ValueError"))


def test_an_xcom_query_leaves_the_callers_session_open():
    """The scheduler and ``dag.test()`` hand the run-note listener their own (scoped) session. On 3.0,
    ``XComModel.get_many`` without a session committed and closed that one, which detached the run
    the listener was writing the note on: the note was lost without an error."""
    from airflow import settings
    from airflow.models.pool import Pool
    from sqlalchemy import inspect as orm_inspect
    from sqlalchemy import select

    session = settings.Session()  # the thread's scoped session, as the scheduler's loop has it
    try:
        pool = session.scalars(select(Pool).where(Pool.pool == Pool.DEFAULT_POOL_NAME)).one()
        rows = session.scalars(compat.xcom_query(session, run_id="no-such-run", dag_id="no_such_dag",
                                                 key="return_value")).all()
        assert rows == []
        assert orm_inspect(pool).session is session, "the query closed the caller's session"
    finally:
        session.close()
