"""How ``make test-host`` splits the host suite over pytest-xdist workers (tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import _UNITS_FIRST, _unit_rank, _work_unit, copy_sqlite_db, pytest_xdist_make_scheduler

REPO = Path(__file__).resolve().parent.parent.parent


def test_shared_fixtures_stay_on_one_worker_and_modules_are_units():
    assert _work_unit("tests/deployment/test_stack.py::test_a") == _work_unit("tests/deployment/test_zz_down.py::t")
    assert _work_unit("tests/ui/test_browser.py::test_a") == _work_unit("tests/ui/test_plugin.py::test_b")
    assert _work_unit("tests/reliability/test_soak.py::test_x") != _work_unit("tests/reliability/test_faults.py::t")
    assert _work_unit("tests/provider/test_config.py::test_a") == _work_unit("tests/provider/test_config.py::t[1]")
    assert _work_unit("tests/provider/test_config.py::test_a") != _work_unit("tests/provider/test_specs.py::test_a")
    assert [u.rstrip("/") for u in _UNITS_FIRST] == ["tests/deployment", "tests/reliability/test_soak.py", "tests/ui"]


def test_units_are_handed_out_shared_then_long_then_container_modules_then_the_rest():
    units = ["tests/provider/test_config.py", "tests/integration/test_containers.py", "tests/ui",
             "tests/integration/test_resume.py", "tests/contract/test_lint.py", "tests/deployment",
             "tests/reliability/test_soak.py", "tests/reliability/test_config_fuzz.py"]
    assert sorted(units, key=_unit_rank) == [
        "tests/deployment", "tests/reliability/test_soak.py", "tests/ui", "tests/integration/test_resume.py",
        "tests/integration/test_containers.py", "tests/reliability/test_config_fuzz.py",
        "tests/provider/test_config.py", "tests/contract/test_lint.py"]
    # every long module named is a real module, so a rename cannot silently drop it to the end
    from tests.conftest import _LONG_MODULES
    assert all((REPO / module).is_file() for module in _LONG_MODULES)


class _Node:
    """What the scheduler sees of a worker: the test indices it was sent."""

    def __init__(self, name: str) -> None:
        self.gateway = type("Gateway", (), {"id": name})()
        self.sent: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True


def test_a_worker_gets_its_next_unit_only_on_its_last_test():
    """The scheduler itself (xdist's LoadScopeScheduling with tfpipe's units), two fake workers."""
    class Config:
        option = type("Option", (), {"loadscopereorder": False})()

        def getoption(self, name):
            return "loadscope"

        def getvalue(self, name):
            return ["2*popen"]

    collection = ["tests/deployment/test_stack.py::a", "tests/deployment/test_stack.py::b",
                  "tests/deployment/test_zz_down.py::c", "tests/reliability/test_soak.py::s",
                  "tests/ui/test_browser.py::u", "tests/integration/test_resume.py::r1",
                  "tests/integration/test_resume.py::r2", "tests/provider/test_config.py::p1"]
    sched = pytest_xdist_make_scheduler(Config(), log=None)
    one, two = _Node("gw0"), _Node("gw1")
    for node in (one, two):
        sched.add_node(node)
        sched.add_node_collection(node, collection)
    sched.schedule()
    # the deployment unit (3 tests) alone on one; the soak (1 test) needs a next test: the UI unit
    assert one.sent == [0, 1, 2] and two.sent == [3, 4]
    sched.mark_test_complete(one, 0)  # a, b, c -> b, c left: nothing more yet (xdist's default would queue)
    assert one.sent == [0, 1, 2]
    sched.mark_test_complete(one, 1)  # on its last test: the next unit
    assert one.sent == [0, 1, 2, 5, 6]
    sched.mark_test_complete(two, 3)
    assert two.sent == [3, 4, 7] and not two.shutting_down
    sched.mark_test_complete(one, 2)
    assert one.shutting_down  # nothing left to hand out


def test_make_runs_two_workers_unless_told_one():
    def line(target: str, marker: str, *args: str) -> str:
        out = subprocess.run(["make", "-n", "--no-print-directory", target, *args], cwd=REPO,
                             capture_output=True, text=True, check=True).stdout
        return next(line for line in out.splitlines() if marker in line)

    def pytest_line(*args: str) -> str:
        return line("test-host", "-m pytest", *args)

    assert "-n 2 --dist loadscope --no-loadscope-reorder" in pytest_line()
    assert " -n " not in pytest_line("TEST_WORKERS=1") and "--dist" not in pytest_line("TEST_WORKERS=1")
    # the compat suite gets the same flags from make (one home: the Makefile's XDIST_ARGS)
    assert 'XDIST_ARGS="-n 2 --dist loadscope --no-loadscope-reorder"' in line("test-compat-oldest", "test-compat.sh")
    assert 'XDIST_ARGS=""' in line("test-compat-oldest", "test-compat.sh", "TEST_WORKERS=1")
    assert 'read -r -a xdist <<<"${XDIST_ARGS:-}"' in (REPO / "scripts/test-compat.sh").read_text()


def test_make_test_runs_the_oldest_release_s_suite_and_the_host_tools_beside_the_trainer_suite_then_the_host_suite():
    """``make test`` runs the in-image trainer suite (about one core), the oldest release's suite and the host
    suite's tools (mostly downloads) at once, the stack's Debian packages before the last two, all before the
    host suite."""
    recipe = subprocess.run(["make", "-n", "--no-print-directory", "test"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    trainer_phase = next(i for i, line in enumerate(recipe) if "-j3" in line)
    packages = next(i for i, line in enumerate(recipe) if "deploy/stack.py tools" in line and i > trainer_phase)
    trainer = next(i for i, line in enumerate(recipe) if "run-in-image.sh" in line)
    host = next(i for i, line in enumerate(recipe) if "-m pytest" in line)
    compat = next(i for i, line in enumerate(recipe) if "test-compat.sh" in line and "--prepare" not in line)
    tools = next(i for i, line in enumerate(recipe) if "ensure-mlflow-server.sh" in line)
    assert trainer_phase < packages < min(compat, tools) and max(trainer, compat, tools) < host, recipe
    # one make runs the three at once (-j3)
    makefile = (REPO / "Makefile").read_text()
    assert "-j3 test-trainer test-compat-oldest host-tools" in makefile


def test_compat_prepare_builds_the_venv_and_db_then_stops_before_any_test():
    oldest = subprocess.run(["make", "-s", "--no-print-directory", "-f", "Makefile", "-f", "-", "show"],
                            cwd=REPO, input="show:\n\t@echo $(AIRFLOW_OLDEST)\n",
                            capture_output=True, text=True, check=True).stdout.strip()
    if not (REPO / f".venv-airflow-{oldest}" / ".installed").exists():
        pytest.skip(f"no .venv-airflow-{oldest} yet: `make compat-prepare-oldest` builds it (make test does)")
    out = subprocess.run(["scripts/test-compat.sh", "--prepare", oldest], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"[compat {oldest}] venv and metadata DB ready" in out.stdout
    assert "tests:" not in out.stdout and "passed" not in out.stdout


def test_each_worker_has_its_own_copy_of_the_airflow_db():
    home = Path(os.environ["AIRFLOW_HOME"])
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:  # one process (TEST_WORKERS=1): the home make configured, no copy
        assert not home.name.startswith("tfpipe-") and "tfpipe-" not in os.environ.get(
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
        return
    assert home.name.startswith(f"tfpipe-{worker}-airflow-") and home != REPO / ".airflow"
    assert os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{home / 'airflow.db'}"
    assert str(home) in (home / "airflow.cfg").read_text() and str(REPO / ".airflow") not in (home / "airflow.cfg").read_text()
    with sqlite3.connect(home / "airflow.db") as db:  # migrated: Airflow's own tables are there
        assert db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'dag_run'").fetchone() == (1,)


def test_a_two_worker_run_keeps_each_unit_on_one_worker_long_units_first():
    """A real two-worker pytest run of a few cheap modules: the deployment unit's tests all run on
    one worker, ahead of every other module on that worker."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.pop("PYTEST_ADDOPTS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadscope",
         "--no-loadscope-reorder", "tests/contract/test_schema_parity.py", "tests/deployment/test_stack_tools.py",
         "tests/contract/test_import_wall.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    ran = re.findall(r"^\[(gw\d)\] \[\s*\d+%\] PASSED (\S+?)::", proc.stdout, re.M)
    deployment = {w for w, path in ran if path.startswith("tests/deployment/")}
    assert len(deployment) == 1, ran
    worker = deployment.pop()
    on_it = [path for w, path in ran if w == worker]
    assert on_it[0].startswith("tests/deployment/"), on_it
    # The unit's tests first, then whatever else that worker got: none, when the other worker was
    # quicker with both other modules (timing decides that, not the scheduler).
    is_deployment = [path.startswith("tests/deployment/") for path in on_it]
    assert is_deployment == sorted(is_deployment, reverse=True), on_it
    assert {path for _, path in ran} == {"tests/contract/test_schema_parity.py", "tests/deployment/test_stack_tools.py",
                                         "tests/contract/test_import_wall.py"}


DAMAGING_TESTS = '''
import os
from pathlib import Path


def test_leaves_the_db_alone():
    pass


def test_damages_the_db():
    db = Path(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].removeprefix("sqlite:///"))
    with open(db, "r+b") as f:  # the schema's pages: garbage where SQLite keeps its b-trees
        f.seek(4096)
        f.write(b"\\xff" * 4096 * 8)


def test_runs_after_the_damage():
    pass
'''


def test_the_test_that_damages_the_metadata_db_is_named_once(tmp_path):
    """A test run in which one test overwrites pages of the metadata DB: that test, and only that
    one, fails after it runs, naming itself; the tests before and after it pass."""
    db = tmp_path / "airflow.db"
    copy_sqlite_db(REPO / ".airflow" / "airflow.db", db)
    (tmp_path / "test_damage.py").write_text(DAMAGING_TESTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.pop("PYTEST_ADDOPTS", None)
    env.update(AIRFLOW_HOME=str(tmp_path), AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{db}")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_damage.py")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 1, out[-4000:] + proc.stderr[-2000:]
    assert re.search(r"test_leaves_the_db_alone PASSED", out), out[-4000:]
    assert re.search(r"test_damages_the_db PASSED", out) and re.search(r"test_damages_the_db ERROR", out), out[-4000:]
    assert f"the metadata DB {db} was damaged during test_damage.py::test_damages_the_db" in out, out[-4000:]
    assert re.search(r"test_runs_after_the_damage PASSED", out), out[-4000:]
    assert "3 passed, 1 error" in out and out.count("ERROR at teardown") == 1, out[-4000:]


def test_a_db_copy_carries_the_commits_still_in_the_wal_which_a_file_copy_misses(tmp_path):
    """A metadata DB in WAL mode (as Airflow keeps SQLite) with a commit not yet checkpointed, its
    connection still open: :func:`copy_sqlite_db` carries that commit; a copy of the file does not."""
    import shutil

    live = tmp_path / "live.db"
    with contextlib.closing(sqlite3.connect(live)) as writer:
        assert writer.execute("PRAGMA journal_mode=WAL").fetchone() == ("wal",)
        writer.execute("PRAGMA wal_autocheckpoint=0")  # the commit stays in live.db-wal
        writer.execute("CREATE TABLE variable (key TEXT)")
        writer.execute("INSERT INTO variable VALUES ('tfpipe_image')")
        writer.commit()
        copy_sqlite_db(live, tmp_path / "backup.db")
        shutil.copy(live, tmp_path / "file.db")  # a file copy, on purpose
    with contextlib.closing(sqlite3.connect(tmp_path / "backup.db")) as db:
        assert db.execute("SELECT key FROM variable").fetchall() == [("tfpipe_image",)]
    with contextlib.closing(sqlite3.connect(tmp_path / "file.db")) as db:
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            db.execute("SELECT key FROM variable")


def test_no_test_copies_a_metadata_db_as_a_file():
    """Every copy of an ``airflow.db`` in the tests goes through :func:`copy_sqlite_db`."""
    found = [f"{path.relative_to(REPO)}:{n}" for path in sorted((REPO / "tests").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if re.search(r"shutil\.copy\w*\(", line) and ".db" in line and "on purpose" not in line]
    assert found == [], found


def test_the_release_s_own_servers_run_in_the_oldest_release_s_suite_and_not_again_in_the_host_suite():
    """The tests that start a release's own scheduler, Celery worker and api-server are marked ``compat`` (the
    oldest release's suite runs them) and ``older_releases`` (the host suite, on the newest, leaves them to
    make up's stack, the sweep's scheduler and tests/ui)."""
    recipe = subprocess.run(["make", "-n", "--no-print-directory", "test-host"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    assert '-m "not older_releases"' in recipe
    for module in ("tests/integration/test_release_scheduler.py", "tests/integration/test_release_celery.py",
                   "tests/ui/test_plugin_releases.py"):
        text = (REPO / module).read_text()
        assert "pytest.mark.compat, pytest.mark.older_releases" in text, module
    script = (REPO / "scripts" / "test-compat.sh").read_text()
    assert '-m "(not integration or compat) and not docs"' in script
