"""tfpipe's stage gauges reach a DogStatsD agent with the tags ``dag_id`` and ``stage``.

A UDP socket on loopback stands where the Datadog agent listens and reads the DogStatsD datagrams
as the agent would (``name:value|g|#tag:value,...``). A fresh interpreter, with Airflow's Datadog
metrics switched on by its ``[metrics]`` environment variables only, runs ``emit_stage_metrics`` for
a train result and exits at once, as a task process does; nothing in tfpipe, Airflow or the
``datadog`` client is stubbed. The test holds when, for each gauge, a datagram named
``airflow.tfpipe.<dag_id>.train.<name>`` (``[metrics] statsd_prefix``, default ``airflow``, in
front) arrived with the value sent, the tags ``dag_id`` and ``stage``, and the deployment's own
``[metrics] statsd_datadog_tags``. Without the tags the datagrams carry only the deployment's and
it fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: What the child process emits, and so what the agent must receive.
TRAIN_RESULT = {"final_loss": 0.3125, "final_accuracy": 0.875, "epochs": 4, "steps": 96}
#: ``[metrics] statsd_datadog_tags``: tags a deployment puts on every metric it sends.
DEPLOYMENT_TAGS = {"team": "ml", "env": "ci"}

CHILD = """
import json, sys
from tfpipe.metrics import emit_stage_metrics

print(json.dumps(emit_stage_metrics(sys.argv[1], "train", json.loads(sys.argv[2]))))
"""


def _parse(line: str) -> tuple[str, float, str, dict[str, str]] | None:
    """A DogStatsD line as ``(name, value, type, tags)``; ``None`` for one that is not a metric."""
    head, _, rest = line.partition("|")
    name, sep, value = head.rpartition(":")
    if not sep or not rest:
        return None
    fields = rest.split("|")
    tags: dict[str, str] = {}
    for field in fields[1:]:
        if field.startswith("#"):
            for tag in field[1:].split(","):
                key, _, tag_value = tag.partition(":")
                tags[key] = tag_value
    return name, float(value), fields[0], tags


def test_train_gauges_reach_a_dogstatsd_agent_tagged_with_dag_id_and_stage(tmp_path):
    dag_id = f"datadog_tags_{uuid.uuid4().hex[:12]}"  # unique: no other process's datagrams can match
    prefix = f"airflow.tfpipe.{dag_id}.train."
    agent = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    agent.bind(("127.0.0.1", 0))
    agent.settimeout(0.2)
    try:
        env = {
            **os.environ,  # conftest's AIRFLOW_HOME, DAGs folder and DB: a working Airflow for the child
            "AIRFLOW__METRICS__STATSD_DATADOG_ENABLED": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(agent.getsockname()[1]),
            "AIRFLOW__METRICS__STATSD_DATADOG_TAGS": ",".join(f"{k}:{v}" for k, v in DEPLOYMENT_TAGS.items()),
            # The other backends, and the settings that would rename or drop the gauges or their
            # tags, are cleared so the environment of the suite cannot reroute the datagrams.
            "AIRFLOW__METRICS__STATSD_ON": "False",
            "AIRFLOW__METRICS__OTEL_ON": "False",
            "AIRFLOW__METRICS__METRICS_ALLOW_LIST": "",
            "AIRFLOW__METRICS__METRICS_BLOCK_LIST": "",
            "AIRFLOW__METRICS__STATSD_DISABLED_TAGS": "",
            "AIRFLOW__METRICS__STATSD_DATADOG_METRICS_TAGS": "True",
            "PYTHONUNBUFFERED": "1",
        }
        for name in ("AIRFLOW__METRICS__STATSD_PREFIX", "AIRFLOW__METRICS__STAT_NAME_HANDLER",
                     "DD_AGENT_HOST", "DD_DOGSTATSD_PORT", "DD_DOGSTATSD_URL", "DD_ENTITY_ID", "DD_ENV",
                     "DD_SERVICE", "DD_VERSION", "DATADOG_TAGS", "DD_TAGS"):
            env.pop(name, None)
        proc = subprocess.run([sys.executable, "-c", CHILD, dag_id, json.dumps(TRAIN_RESULT)], env=env,
                              cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
        sent = json.loads(proc.stdout.strip().splitlines()[-1])
        expected = {**{k: float(v) for k, v in TRAIN_RESULT.items()}, "resumed": 0.0}
        assert sent == {f"tfpipe.{dag_id}.train.{k}": v for k, v in expected.items()}

        # The child has exited: what it sent is in the socket's queue, or was lost. The short wait
        # is for the kernel to hand the last datagrams over, never for a sender still running.
        received: dict[str, list[tuple[float, str, dict[str, str]]]] = {}
        lines: list[str] = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and set(received) < {prefix + k for k in expected}:
            try:
                data = agent.recv(65536)
            except socket.timeout:
                continue
            for line in data.decode("utf-8", "replace").splitlines():
                lines.append(line)
                metric = _parse(line)
                if metric and metric[0].startswith(prefix):
                    received.setdefault(metric[0], []).append(metric[1:])
    finally:
        agent.close()

    assert set(received) == {prefix + k for k in expected}, (
        f"gauges received under {prefix}: {sorted(received)}; all lines: {lines[:20]}; "
        f"child stderr:\n{proc.stderr[-4000:]}")
    tags = {"dag_id": dag_id, "stage": "train", **DEPLOYMENT_TAGS}
    for name, value in expected.items():
        assert received[prefix + name] == [(value, "g", tags)], (
            f"{prefix + name}: received {received[prefix + name]}, expected one gauge {value} tagged {tags}")
