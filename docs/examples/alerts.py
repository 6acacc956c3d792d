"""Airflow DAG: the digits pipeline with failure alerts by mail, through Airflow's SMTP notifier."""
import os

import airflow.providers.tfpipe  # noqa: F401
from tfpipe import PipelineConfig, training_pipeline

HOME = os.environ.get("TFPIPE_HOME", "/srv/tfpipe")
cfg = PipelineConfig(
    dag_id="digits_with_alerts",
    image={"ref": None},
    volumes={"data": f"{HOME}/data", "work": f"{HOME}/work", "models": f"{HOME}/models"},
    data={"path": "digits/digits.csv"},
)

# --8<-- [start:alerts]
from airflow.providers.smtp.notifications.smtp import SmtpNotifier  # noqa: E402

ALERT = {"smtp_conn_id": "smtp_alerts", "from_email": "airflow@example.com", "to": "ml-oncall@example.com"}
dag = training_pipeline(
    cfg,
    default_args={
        "owner": "ml-platform",
        "on_failure_callback": SmtpNotifier(
            **ALERT, subject="[tfpipe] {{ dag.dag_id }}: {{ ti.task_id }} failed in {{ run_id }}",
            html_content="<p>{{ exception | default('no error in this context: see the task log') }}</p>"),
    },
    on_failure_callback=SmtpNotifier(
        **ALERT, subject="[tfpipe] {{ dag.dag_id }}: run {{ run_id }} failed",
        html_content="<p>{{ reason | default('no reason given') }}</p>"),
)
# --8<-- [end:alerts]
