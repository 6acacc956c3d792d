"""What ``tfpipe run`` shows: its stages, training's epochs and the result on a few lines, Airflow's
own log in a file it names; ``--verbose`` shows Airflow's log instead, as before.

The DAGs here are small DAGs of Python tasks (no containers); the ``train`` task of one logs the
trainer's epoch lines through the Docker provider's own ``fetch_logs``, as the train stage logs its
container's output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

from tests.conftest import REPO, parse_summary

STAGES_DAG = '''"""Four Python tasks: one fails (its message says the fix), one never runs, one fails once."""
from pathlib import Path

import pendulum
from airflow.sdk import DAG, task

MARKS = Path({marks!r})

with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    @task(retries=0)
    def prep():
        import warnings

        print("prep: a line of the task's own")
        warnings.warn("prep: a warning of the task's own")

    @task(retries=1, retry_delay=0)
    def once_flaky():
        mark = MARKS / "tried"
        if not mark.exists():
            mark.write_text("")
            raise RuntimeError("first try fails")

    @task(retries=0)
    def check():
        raise ValueError("check: the data has 3 columns, the model wants 4.\\n"
                         "Fix: set data.features to the 3 columns, or add the fourth to the CSV.")

    @task(retries=0)
    def publish():
        pass

    prep() >> once_flaky() >> check() >> publish()
'''

EPOCHS_DAG = '''"""A train task that logs the trainer's epoch lines as the Docker operator logs its container's."""
import pendulum
from airflow.providers.docker.operators.docker import fetch_logs
from airflow.sdk import DAG, BaseOperator

# as trainer/train.py prints them, through the trainer's log format
LINES = ["2026-12-07 04:00:0%d,000 INFO epoch %d/3: loss %.4f accuracy %.4f val_loss %.4f val_accuracy %.4f "
         "(900 examples/s, ETA 0:00:0%d, peak RSS 300 MiB)\\n" % (i, i, 1 - i / 4, 0.5 + i / 8, 1.1 - i / 4,
                                                               0.6 + i / 10, 3 - i)
         for i in (1, 2, 3)]


class Train(BaseOperator):
    def execute(self, context):
        fetch_logs(iter(line.encode() for line in ["training 3 epoch(s) x 9 steps\\n", *LINES]), self.log)
        return {{"epochs": 3}}


with DAG({dag_id!r}, schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    Train(task_id="train", retries=0)
'''

#: An Airflow log line as Airflow's console renderer writes it: an ISO time, then the level.
# A line of Airflow's own log: structlog's ("2026-...Z [info     ] ") from 3.1 on, the logging module's
# ("[2026-...+0000] {dagbag.py:585} INFO - ") on 3.0
AIRFLOW_LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z \[\w+\s*\] |\[\d{4}-\d\d-\d\dT[^\]]+\] \{)", re.M)


def _write(tmp_path: Path, template: str, prefix: str) -> tuple[str, Path, Path]:
    dag_id = f"{prefix}_{uuid.uuid4().hex[:8]}"
    dags, marks = tmp_path / "dags", tmp_path / "marks"
    dags.mkdir()
    marks.mkdir()
    (dags / f"{dag_id}.py").write_text(template.format(dag_id=dag_id, marks=str(marks)))
    return dag_id, dags, marks


def _command(dag_id: str, dags: Path, *extra: str) -> tuple[list[str], dict[str, str]]:
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": str(dags), "PYTHONUNBUFFERED": "1"}
    return [sys.executable, "-m", "tfpipe.cli", "run", dag_id, "--dags-folder", str(dags), *extra], env


def _logs_of(dag_id: str) -> list[Path]:
    return sorted((Path(os.environ["AIRFLOW_HOME"]) / "logs" / "tfpipe-run" / dag_id).glob("*.log"))


def test_the_first_screen_is_the_stages_their_times_errors_and_the_result_and_airflows_log_is_in_the_named_file(
        tmp_path):
    """Without ``-v``: stdout is the one summary line; stderr a line per stage start and end with its
    time, the failed stage's error in full (with its fix), the stage that never ran, the result, and
    the log file, named first and last; none of Airflow's own lines, and no Python warning (a task's,
    or Airflow's deprecations). The file has those lines and the warning."""
    dag_id, dags, _ = _write(tmp_path, STAGES_DAG, "cli_screen")
    cmd, env = _command(dag_id, dags)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    summary = parse_summary(proc.stdout, proc.stderr, proc.returncode)
    assert proc.returncode == 1 and summary["state"] == "failed", proc.stderr[-4000:]
    assert proc.stdout.splitlines() == [json.dumps(summary)], "stdout carries the summary line alone"

    screen = proc.stderr.splitlines()
    assert len(screen) <= 16, proc.stderr
    assert not AIRFLOW_LINE.search(proc.stderr), proc.stderr
    (log,) = _logs_of(dag_id)
    assert screen[0].endswith(f"{dag_id}: starting a run; Airflow's log: {log} (-v prints it here)"), screen[0]
    assert screen[-1] == f"          Airflow's log of this run: {log}"
    said = [re.sub(r"^\d\d:\d\d:\d\d  ", "", line) for line in screen]
    assert re.fullmatch(rf"{dag_id}: DAG loaded from {re.escape(str(dags))} and written to the metadata DB "
                        r"\(\d+\.\d s\)", said[1]), said[1]
    stages = [re.sub(r"\(\d+\.\d s\)", "(T)", line) for line in said[2:-2]]
    assert stages == [
        "prep: started", "prep: success (T)",
        "once_flaky: started", "once_flaky: failed, to be retried (T)",
        "          RuntimeError: first try fails",
        "once_flaky: started (try 2)", "once_flaky: success (T)",
        "check: started", "check: failed (T)",
        "          ValueError: check: the data has 3 columns, the model wants 4.",
        "          Fix: set data.features to the 3 columns, or add the fourth to the CSV.",
        "publish: upstream_failed",
    ], said
    assert re.fullmatch(rf"{dag_id}: run {re.escape(summary['run_id'])} failed in \d+\.\d s", said[-2]), said[-2]

    text = log.read_text()
    assert "a warning of the task's own" not in proc.stderr
    for airflow_said in ("Filling up the DagBag from", "[DAG TEST] starting task_id=prep",
                         "prep: a line of the task's own", "prep: a warning of the task's own", "Marking run"):
        assert airflow_said in text, airflow_said
    assert "Traceback" in text and "ValueError: check: the data has 3 columns" in text
    assert len(AIRFLOW_LINE.findall(text)) > 30, "Airflow's log lines are in the file"


def test_verbose_prints_airflows_log_as_before_and_writes_no_file(tmp_path):
    """``tfpipe run -v``: Airflow's own lines on stderr, no stage lines, no log file."""
    dag_id, dags, marks = _write(tmp_path, STAGES_DAG, "cli_verbose")
    cmd, env = _command(dag_id, dags, "-v")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    summary = parse_summary(proc.stdout, proc.stderr, proc.returncode)
    assert summary["state"] == "failed" and proc.stdout.splitlines() == [json.dumps(summary)]
    assert len(AIRFLOW_LINE.findall(proc.stderr)) > 30, proc.stderr[-3000:]
    for airflow_said in ("Filling up the DagBag from", "[DAG TEST] starting task_id=prep", "Marking run"):
        assert airflow_said in proc.stderr, airflow_said
    assert "Airflow's log of this run" not in proc.stderr and "prep: started" not in proc.stderr
    assert _logs_of(dag_id) == []


def test_training_progress_is_a_plain_line_per_epoch_when_stderr_is_not_a_terminal(tmp_path):
    """Piped (CI, ``make``): one line per epoch of the train task, with its loss and accuracies."""
    dag_id, dags, _ = _write(tmp_path, EPOCHS_DAG, "cli_epochs")
    cmd, env = _command(dag_id, dags)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert parse_summary(proc.stdout, proc.stderr, proc.returncode)["state"] == "success", proc.stderr[-3000:]
    said = [line[10:] for line in proc.stderr.splitlines()]
    start = said.index("train: started")
    assert said[start + 1:start + 4] == [
        "train: epoch 1/3  loss 0.7500  accuracy 0.6250  val_loss 0.8500  val_accuracy 0.7000",
        "train: epoch 2/3  loss 0.5000  accuracy 0.7500  val_loss 0.6000  val_accuracy 0.8000",
        "train: epoch 3/3  loss 0.2500  accuracy 0.8750  val_loss 0.3500  val_accuracy 0.9000",
    ], said
    assert said[start + 4].startswith("train: success (")
    assert "\x1b[" not in proc.stderr, "no terminal control codes in a pipe"


def test_training_progress_is_a_bar_on_a_terminal_and_its_last_epoch_stays_as_a_line(tmp_path):
    """On a terminal (stderr a pty) the epochs move a progress bar, which gives way to the last
    epoch's line when the task ends; the summary still goes alone to stdout."""
    dag_id, dags, _ = _write(tmp_path, EPOCHS_DAG, "cli_bar")
    cmd, env = _command(dag_id, dags)
    primary, secondary = os.openpty()
    proc = subprocess.Popen(cmd, env={**env, "COLUMNS": "160"}, stdout=subprocess.PIPE, stderr=secondary,
                            cwd=REPO, text=True)
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the command ended and closed its end of the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(primary)
    stdout, _ = proc.communicate(timeout=300)
    screen = shown.decode()
    assert proc.returncode == 0 and parse_summary(stdout, screen)["state"] == "success", screen[-3000:]
    assert stdout.splitlines()[-1].startswith("{") and len(stdout.splitlines()) == 1
    assert "━" in screen and "3/3" in screen, screen  # rich's bar and its count
    after_bar = screen[screen.rindex("━"):]
    assert "train: epoch 3/3  loss 0.2500  accuracy 0.8750  val_loss 0.3500  val_accuracy 0.9000" in after_bar
    assert "train: epoch 1/3  loss" not in screen, "on a terminal the epochs move the bar, not a line each"
