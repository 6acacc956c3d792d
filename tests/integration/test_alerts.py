"""Alerts: Airflow's own callbacks and notifiers, passed through ``training_pipeline``.

A nightly retraining job must tell someone when it fails. tfpipe has no alerting of its own:
``training_pipeline(cfg, default_args={...})`` hands Airflow's callbacks to every task it makes.
Here a real run fails a stage on bad input, and Airflow's SMTP notifier (the SMTP provider is in
every lock) mails the stage's error to an SMTP server on loopback, standing where a mail relay would.
"""

from __future__ import annotations

import email
import email.policy
import json
import re
import socketserver
import threading

import airflow
import pytest
from packaging.version import Version

from tests.conftest import REPO, run_dag

pytestmark = [pytest.mark.integration, pytest.mark.reliability, pytest.mark.compat]

DAG_ID = "alerting"
#: `tfpipe run` runs the tasks in its own process, through `dag.test()` and Airflow's in-process task
#: runner. Up to 3.2 that runner leaves the error out of a failure callback's context (the task
#: runner's `main`, which a worker runs, adds it; `run_task_in_process` does not); 3.3 adds it in both.
IN_PROCESS_CALLBACKS_GET_THE_ERROR = Version(airflow.__version__) >= Version("3.3")
#: The run's own callback under `dag.test()`: from 3.1 its context holds the serialized DAG, which
#: has no template environment, so a notifier fails there (and Airflow logs this); 3.0 hands it the
#: DAG. Where a deployment runs it, in the DAG processor, it mails on every release
#: (test_release_scheduler.py).
DAG_TEST_RENDERS_DAG_NOTIFIERS = Version(airflow.__version__) < Version("3.1")
NO_TEMPLATE_ENV = "'SerializedDAG' object has no attribute 'get_template_env'"


class _SmtpHandler(socketserver.StreamRequestHandler):
    """Just enough of RFC 5321 for smtplib: greet, take one envelope and its data, keep the message."""

    def _reply(self, line: str) -> None:
        self.wfile.write(line.encode() + b"\r\n")

    def handle(self) -> None:
        self._reply("220 127.0.0.1 test relay")
        envelope: dict = {"rcpt": []}
        while line := self.rfile.readline():
            verb = line[:4].decode(errors="replace").upper()
            if verb == "EHLO":
                self._reply("250-127.0.0.1")
                self._reply("250 8BITMIME")
            elif verb == "MAIL":
                envelope["from"] = line.decode().split(":", 1)[1].strip()
                self._reply("250 OK")
            elif verb == "RCPT":
                envelope["rcpt"].append(line.decode().split(":", 1)[1].strip())
                self._reply("250 OK")
            elif verb == "DATA":
                self._reply("354 end with <CRLF>.<CRLF>")
                data = bytearray()
                while (chunk := self.rfile.readline()) not in (b".\r\n", b""):
                    data += chunk[1:] if chunk.startswith(b"..") else chunk
                self.server.messages.append({**envelope, "message": bytes(data)})
                envelope = {"rcpt": []}
                self._reply("250 OK queued")
            elif verb == "QUIT":
                self._reply("221 bye")
                return
            else:  # HELO, RSET, NOOP
                self._reply("250 OK")


@pytest.fixture
def smtp_relay():
    """An SMTP server on a free loopback port; ``.messages`` holds each message it was given."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _SmtpHandler)
    server.daemon_threads = True
    server.messages = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


#: The SMTP connection a deployment would define for its alerts (the relay's port added).
SMTP_CONN_ID = "smtp_alerts"
SMTP_CONNECTION = {"conn_type": "smtp", "host": "127.0.0.1",
                   "extra": {"disable_tls": True, "disable_ssl": True, "timeout": 10, "retry_limit": 1}}


def _smtp_env(relay) -> dict[str, str]:
    """The connection as Airflow's environment variable form, for `tfpipe run`."""
    return {f"AIRFLOW_CONN_{SMTP_CONN_ID.upper()}": json.dumps({**SMTP_CONNECTION, "port": relay.server_address[1]})}


#: A user's DAG file: the pipeline as ``cfg``, then the docs' alerts example as it is printed there.
DAG_FILE = '''"""Airflow DAG written by a test: the digits pipeline with the docs' failure alerts."""
import os

import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

HOME = os.environ["TFPIPE_HOME"]
cfg = PipelineConfig(
    dag_id={dag_id!r},
    image={{"ref": os.environ["TFPIPE_IMAGE"]}},
    volumes={{"data": f"{{HOME}}/data", "work": f"{{HOME}}/work", "models": f"{{HOME}}/models"}},
    data={{"path": "digits/digits.csv", "label": {label!r}}},
    training={{"model": "mlp", "epochs": 2}},
    retry_delay_seconds=1,
)
'''


def docs_alerts_example() -> str:
    """The docs' alerts example (Monitoring > Alerts when a run fails), as printed there: the
    ``alerts`` snippet section of ``docs/examples/alerts.py``, which the page includes."""
    text = (REPO / "docs" / "examples" / "alerts.py").read_text()
    found = re.findall(r"# --8<-- \[start:alerts\]\n(.*?)# --8<-- \[end:alerts\]\n", text, re.S)
    assert len(found) == 1 and "SmtpNotifier(" in found[0], "the docs' alerts example is not one snippet section"
    assert f'"smtp_conn_id": "{SMTP_CONN_ID}"' in found[0], "the example names another connection"
    return found[0]


def write_alerting_dag(folder, dag_id: str = DAG_ID) -> None:
    """The DAG file above, its ``data.label`` naming no column of the digits CSV: prep fails at once
    (bad input is not retried) and names the columns it found."""
    folder.mkdir(parents=True, exist_ok=True)
    text = DAG_FILE.format(dag_id=dag_id, label="digit") + "\n" + docs_alerts_example()
    (folder / f"{dag_id}.py").write_text(text)


def alert_mails(relay) -> dict[str, list[str]]:
    """The relay's mails as ``{"task": [body, ...], "run": [body, ...]}`` by their subjects."""
    found: dict[str, list[str]] = {"task": [], "run": []}
    for received in relay.messages:
        mail = email.message_from_bytes(received["message"], policy=email.policy.default)
        assert received["rcpt"] == ["<ml-oncall@example.com>"], received
        kind = "run" if " run manual__" in mail["Subject"] else "task"
        found[kind].append(f"{mail['Subject']}\n{mail.get_body(('html',)).get_content()}")
    return found


def assert_prep_alert(mails: dict[str, list[str]], dag_id: str, *, with_error: bool, why: str = "") -> None:
    """Exactly one task's mail, about prep, carrying prep's error when the context has it."""
    assert len(mails["task"]) == 1, (mails, why)
    subject, body = mails["task"][0].split("\n", 1)
    assert subject.startswith(f"[tfpipe] {dag_id}: prep failed in manual__"), subject
    if not with_error:
        assert "no error in this context: see the task log" in body, body
        return
    # the mail carries the same error the task log names: what is wrong and how to fix it
    assert "column 'digit' (data.label) is not in the header, which has 65 columns: 'pixel_0'" in body, body
    assert "'pixel_5', ... (53 more), 'pixel_59'" in body and "'pixel_63', 'label'. Fix:" in body, body
    assert "Fix: set data.label to a column of the header" in body, body
    assert "prep rejected its input" in body and "retrying cannot fix this" in body, body


def assert_run_alert(mails: dict[str, list[str]], dag_id: str, run_id: str) -> None:
    """Exactly one mail for the failed run, from the DAG's own callback, saying why it failed."""
    assert len(mails["run"]) == 1, mails
    subject, body = mails["run"][0].split("\n", 1)
    assert subject == f"[tfpipe] {dag_id}: run {run_id} failed", subject
    assert "task_failure" in body, body


def test_a_failed_stage_mails_its_clear_error_once_and_the_other_tasks_mail_nothing(
        tfpipe_home, trainer_image, tmp_path, smtp_relay):
    dags = tmp_path / "dags"
    write_alerting_dag(dags)
    summary, log = run_dag(DAG_ID, {}, home=tfpipe_home, image=trainer_image, dags_folder=dags,
                           extra_env=_smtp_env(smtp_relay))
    assert summary["state"] == "failed", log[-4000:]
    assert summary["tasks"]["prep"] == {"state": "failed", "try_number": 1}, log[-4000:]
    assert summary["tasks"]["train"]["state"] == "upstream_failed"
    mails = alert_mails(smtp_relay)
    assert_prep_alert(mails, DAG_ID, with_error=IN_PROCESS_CALLBACKS_GET_THE_ERROR, why=log[-4000:])
    if DAG_TEST_RENDERS_DAG_NOTIFIERS:
        assert_run_alert(mails, DAG_ID, summary["run_id"])
    else:
        assert mails["run"] == [] and NO_TEMPLATE_ENV in log, log[-4000:]
