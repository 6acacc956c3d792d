"""The deployment's engine setting (``[tfpipe] docker_url`` and TLS files) and engine error messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tfpipe.engine_settings import DEFAULT_DOCKER_URL, EngineSettings, engine_error_message
from tfpipe.exceptions import TfpipeConfigError

URL = "tcp://gpu-host.example:2376"


@pytest.fixture
def tls_files(tmp_path):
    paths = {}
    for name in ("ca", "cert", "key"):
        (tmp_path / f"{name}.pem").write_text("PEM")
        paths[name] = str(tmp_path / f"{name}.pem")
    return paths


def _set(monkeypatch, **options):
    for option, value in options.items():
        monkeypatch.setenv(f"AIRFLOW__TFPIPE__{option.upper()}", value)


class _Op:
    docker_url = DEFAULT_DOCKER_URL
    tls_ca_cert = tls_client_cert = tls_client_key = tls_hostname = None


def test_without_settings_the_local_engine_is_used(monkeypatch):
    for option in ("docker_url", "tls_ca_cert", "tls_client_cert", "tls_client_key", "tls_hostname"):
        monkeypatch.delenv(f"AIRFLOW__TFPIPE__{option.upper()}", raising=False)
    settings = EngineSettings.from_airflow_config()
    assert settings == EngineSettings() and not settings.uses_tls
    op = _Op()
    settings.apply_to(op)
    assert op.docker_url == DEFAULT_DOCKER_URL and op.tls_client_cert is None


def test_configured_engine_and_tls_reach_a_default_task(monkeypatch, tls_files):
    _set(monkeypatch, docker_url=URL, tls_ca_cert=tls_files["ca"], tls_client_cert=tls_files["cert"],
         tls_client_key=tls_files["key"])
    op = _Op()
    EngineSettings.from_airflow_config().apply_to(op)
    assert (op.docker_url, op.tls_ca_cert, op.tls_client_cert, op.tls_client_key) == (
        URL, tls_files["ca"], tls_files["cert"], tls_files["key"])


def test_a_task_with_its_own_engine_keeps_it(monkeypatch, tls_files):
    _set(monkeypatch, docker_url=URL, tls_ca_cert=tls_files["ca"], tls_client_cert=tls_files["cert"],
         tls_client_key=tls_files["key"])
    op = _Op()
    op.docker_url = "tcp://other:2376"
    EngineSettings.from_airflow_config().apply_to(op)
    assert op.docker_url == "tcp://other:2376" and op.tls_client_cert is None
    own_tls = _Op()
    own_tls.tls_client_cert = "/own/cert.pem"
    EngineSettings.from_airflow_config().apply_to(own_tls)
    assert own_tls.docker_url == DEFAULT_DOCKER_URL and own_tls.tls_client_cert == "/own/cert.pem"



def test_the_tfpipe_section_of_airflow_cfg_names_the_engine_and_the_environment_wins(tmp_path, tls_files):
    """An ``airflow.cfg`` with a ``[tfpipe]`` section, read by Airflow's own configuration in a fresh
    worker-like process: its engine and TLS files reach a default task; ``AIRFLOW__TFPIPE__*``
    in the environment overrides one option of it."""
    home = tmp_path / "airflow-home"
    home.mkdir()
    (home / "airflow.cfg").write_text(
        f"[tfpipe]\ndocker_url = {URL}\ntls_ca_cert = {tls_files['ca']}\n"
        f"tls_client_cert = {tls_files['cert']}\ntls_client_key = {tls_files['key']}\n")
    code = ("import json; from tfpipe.engine_settings import EngineSettings; "
            "print(json.dumps(vars(EngineSettings.from_airflow_config())))")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW__TFPIPE__", "AIRFLOW_CONFIG"))}
    env["AIRFLOW_HOME"] = str(home)

    def settings(**extra: str) -> dict:
        proc = subprocess.run([sys.executable, "-c", code], env={**env, **extra}, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    assert settings() == {"docker_url": URL, "tls_ca_cert": tls_files["ca"], "tls_client_cert": tls_files["cert"],
                          "tls_client_key": tls_files["key"], "tls_hostname": None}
    assert settings(AIRFLOW__TFPIPE__DOCKER_URL="tcp://gpu-host-2.example:2376")["docker_url"] == \
        "tcp://gpu-host-2.example:2376"


def test_partial_tls_names_the_missing_option_and_the_fix(monkeypatch, tls_files):
    _set(monkeypatch, docker_url=URL, tls_ca_cert=tls_files["ca"], tls_client_cert=tls_files["cert"])
    monkeypatch.delenv("AIRFLOW__TFPIPE__TLS_CLIENT_KEY", raising=False)
    with pytest.raises(TfpipeConfigError, match=r"\[tfpipe\] tls_client_key: missing.*Fix: set AIRFLOW__TFPIPE__TLS_CLIENT_KEY"):
        EngineSettings.from_airflow_config()


def test_a_certificate_missing_on_the_worker_names_the_path_and_engine(monkeypatch, tls_files):
    _set(monkeypatch, docker_url=URL, tls_ca_cert=tls_files["ca"], tls_client_cert="/nowhere/cert.pem",
         tls_client_key=tls_files["key"])
    with pytest.raises(TfpipeConfigError, match=r"tls_client_cert: /nowhere/cert.pem is not a file on this worker "
                                                r"\(engine tcp://gpu-host.example:2376\)"):
        EngineSettings.from_airflow_config()


def test_a_url_without_scheme_is_rejected(monkeypatch):
    _set(monkeypatch, docker_url="gpu-host:2376")
    with pytest.raises(TfpipeConfigError, match=r"docker_url: must be a URL"):
        EngineSettings.from_airflow_config()


@pytest.mark.parametrize("error, retryable, says", [
    (OSError("[SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca"), False, "refused the TLS connection"),
    (OSError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"), False, "tls_client_cert"),
    (OSError("400 Client Error: Client sent an HTTP request to an HTTPS server."), False, "tls_ca_cert"),
    (ConnectionRefusedError("[Errno 111] Connection refused"), True, "start dockerd on that host"),
])
def test_engine_errors_say_what_to_fix_and_whether_to_retry(error, retryable, says):
    message, can_retry = engine_error_message(URL, error)
    assert can_retry is retryable
    assert URL in message and "Fix:" in message and says in message


def test_a_ca_bundle_variable_that_overrides_the_engine_ca_is_named(monkeypatch):
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt")
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    message, _ = engine_error_message(URL, OSError("[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"))
    assert "REQUESTS_CA_BUNDLE is set on this worker" in message and "unset it" in message


def test_the_plugin_presents_the_deployment_certificate_only_to_the_deployment_engine(monkeypatch, tls_files):
    """The api-server reads reports over TLS from the [tfpipe] engine, and from other engines without it."""
    from tfpipe.plugins.run_access import engine_tls

    _set(monkeypatch, docker_url=URL, tls_ca_cert=tls_files["ca"], tls_client_cert=tls_files["cert"],
         tls_client_key=tls_files["key"])
    tls = engine_tls(URL)
    assert tls is not None and tls.cert == (tls_files["cert"], tls_files["key"]) and tls.ca_cert == tls_files["ca"]
    assert engine_tls("tcp://another-host:2376") is None
    assert engine_tls(DEFAULT_DOCKER_URL) is None
