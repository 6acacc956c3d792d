"""tfpipe's stage gauges reach an OpenTelemetry collector with the tags ``dag_id`` and ``stage``.

A real OTLP/HTTP receiver listens on loopback and decodes what arrives as the collector would
(``ExportMetricsServiceRequest`` protobuf). A fresh interpreter, with Airflow's OTel metrics
switched on by its ``[metrics]`` environment variables only, runs ``emit_stage_metrics`` for a train
result; nothing in tfpipe or Airflow is stubbed. The test holds when the collector received, for
each gauge, a data point named ``airflow.tfpipe.<dag_id>.train.<name>`` (Airflow's OTel logger puts
``[metrics] otel_prefix``, default ``airflow``, and a dot in front) with the value sent and the
attributes ``dag_id`` and ``stage``. Without the tags the points carry no attributes and it fails.
"""

from __future__ import annotations

import gzip
import http.server
import json
import os
import subprocess
import sys
import threading
import time
import uuid
import zlib
from pathlib import Path

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

REPO = Path(__file__).resolve().parents[2]

#: What the child process emits, and so what the collector must receive.
TRAIN_RESULT = {"final_loss": 0.3125, "final_accuracy": 0.875, "epochs": 4, "steps": 96}

# The child exits as soon as the gauges are sent, as a task process does, with the periodic reader's
# first export still far off (an interval of 60 s). Airflow 3.3 flushes at exit; Airflow 3.0 does
# not, so on 3.0 (the compat suite) the gauges arrive only because tfpipe exports them itself.
CHILD = """
import json, sys
from tfpipe.metrics import emit_stage_metrics

print(json.dumps(emit_stage_metrics(sys.argv[1], "train", json.loads(sys.argv[2]))))
"""


class _Collector(http.server.ThreadingHTTPServer):
    """An OTLP/HTTP metrics receiver on an ephemeral loopback port; keeps every decoded request."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _OtlpHandler)
        self.requests: list[ExportMetricsServiceRequest] = []
        self.errors: list[str] = []
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return self.server_address[1]


class _OtlpHandler(http.server.BaseHTTPRequestHandler):
    server: _Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            if self.path != "/v1/metrics":
                raise ValueError(f"POST to {self.path}, not /v1/metrics")
            # The exporter may compress (OTEL_EXPORTER_OTLP_COMPRESSION); the collector accepts both.
            encoding = (self.headers.get("Content-Encoding") or "").lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            request = ExportMetricsServiceRequest()
            request.ParseFromString(body)
        except Exception as error:  # recorded for the assertion message; the exporter gets a 400
            with self.server.lock:
                self.server.errors.append(repr(error))
            self.send_response(400)
            self.end_headers()
            return
        # Recorded before the reply: once the child's flush returns, its data is already here.
        with self.server.lock:
            self.server.requests.append(request)
        reply = ExportMetricsServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args) -> None:
        pass  # the exporter's traffic is not test output


@pytest.fixture
def collector():
    server = _Collector()
    thread = threading.Thread(target=server.serve_forever, name="otlp-collector", daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def _attribute_value(any_value) -> object:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def _gauge_points(requests: list[ExportMetricsServiceRequest], prefix: str) -> dict[str, list[tuple[float, dict]]]:
    """Every gauge data point whose metric name starts with ``prefix``: name -> [(value, attributes)]."""
    points: dict[str, list[tuple[float, dict]]] = {}
    for request in requests:
        for resource in request.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if not metric.name.startswith(prefix) or metric.WhichOneof("data") != "gauge":
                        continue
                    for point in metric.gauge.data_points:
                        value = point.as_double if point.WhichOneof("value") == "as_double" else float(point.as_int)
                        attributes = {a.key: _attribute_value(a.value) for a in point.attributes}
                        points.setdefault(metric.name, []).append((value, attributes))
    return points


def test_train_gauges_reach_an_otlp_collector_tagged_with_dag_id_and_stage(collector):
    dag_id = f"otel_tags_{uuid.uuid4().hex[:12]}"  # unique: no other process's points can match
    prefix = f"airflow.tfpipe.{dag_id}.train."
    env = {
        **os.environ,  # conftest's AIRFLOW_HOME, DAGs folder and DB: a working Airflow for the child
        "AIRFLOW__METRICS__OTEL_ON": "True",
        "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
        "AIRFLOW__METRICS__OTEL_PORT": str(collector.port),
        "AIRFLOW__METRICS__OTEL_SSL_ACTIVE": "False",
        "AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS": "60000",
        # Each backend Airflow picks before OTel, and the OTel settings that would win over the
        # [metrics] ones, are cleared so the environment of the suite cannot reroute the export.
        "AIRFLOW__METRICS__STATSD_ON": "False",
        "AIRFLOW__METRICS__STATSD_DATADOG_ENABLED": "False",
        "AIRFLOW__METRICS__METRICS_ALLOW_LIST": "",
        "AIRFLOW__METRICS__METRICS_BLOCK_LIST": "",
        "PYTHONUNBUFFERED": "1",
    }
    # The prefix is left to Airflow's default, which the asserted names spell out.
    for name in ("AIRFLOW__METRICS__OTEL_PREFIX", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
                 "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "OTEL_METRICS_EXPORTER",
                 "OTEL_METRIC_EXPORT_INTERVAL", "OTEL_SDK_DISABLED"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", CHILD, dag_id, json.dumps(TRAIN_RESULT)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    sent = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = {**{k: float(v) for k, v in TRAIN_RESULT.items()}, "resumed": 0.0}
    assert sent == {f"tfpipe.{dag_id}.train.{k}": v for k, v in expected.items()}

    # Everything should be here already (the handler records a request before it replies, and the
    # flush waits for the replies); the short poll is a margin for a slow handler thread.
    deadline = time.monotonic() + 5
    while True:
        with collector.lock:
            points = _gauge_points(collector.requests, prefix)
        if set(points) >= {prefix + k for k in expected} or time.monotonic() > deadline:
            break
        time.sleep(0.05)

    assert not collector.errors, f"the collector could not decode: {collector.errors}"
    assert set(points) == {prefix + k for k in expected}, (
        f"gauges received under {prefix}: {sorted(points)}; child stderr:\n{proc.stderr[-4000:]}")
    tags = {"dag_id": dag_id, "stage": "train"}
    for name, value in expected.items():
        received = points[prefix + name]
        # A gauge is exported once per collection, each time with its last value and its attributes.
        assert (value, tags) in received, f"{prefix + name}: received {received}, expected ({value}, {tags})"
        assert all(attributes == tags for _, attributes in received), f"{prefix + name}: {received}"
