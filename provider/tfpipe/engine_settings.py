"""Which Docker engine a deployment's stages run on, and how the workers authenticate to it.

The ``[tfpipe]`` section of Airflow's configuration (``docker_url``, ``tls_ca_cert``,
``tls_client_cert``, ``tls_client_key``, ``tls_hostname``; or ``AIRFLOW__TFPIPE__*``) names the engine
once per deployment. A task left at the local default uses it; one given its own engine keeps it.
Read in ``execute()`` only: only workers hold the client keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from tfpipe.exceptions import TfpipeConfigError

SECTION = "tfpipe"
DEFAULT_DOCKER_URL = "unix://var/run/docker.sock"
TLS_OPTIONS = ("tls_ca_cert", "tls_client_cert", "tls_client_key")


def _airflow_option(option: str) -> str | None:
    """``[tfpipe] option`` from Airflow's config (env ``AIRFLOW__TFPIPE__OPTION`` wins, as in Airflow)."""
    try:
        from airflow.configuration import conf

        value = conf.get(SECTION, option, fallback=None)
    except ImportError:  # a worker with only the task SDK reads the environment alone
        value = os.environ.get(f"AIRFLOW__{SECTION.upper()}__{option.upper()}")
    if not isinstance(value, str):
        return None
    return value.strip() or None


@dataclass(frozen=True)
class EngineSettings:
    """The Docker engine of a deployment and the TLS files a worker presents to it.

    :param docker_url: ``unix://...`` or ``tcp://host:port`` (TLS when certificates are given).
    :param tls_ca_cert: the CA that signed the engine's server certificate (PEM file on the worker).
    :param tls_client_cert: the worker's client certificate, signed by a CA the engine trusts.
    :param tls_client_key: the private key of ``tls_client_cert``.
    :param tls_hostname: the name to check the server certificate against, if not the URL's host.
    """

    docker_url: str = DEFAULT_DOCKER_URL
    tls_ca_cert: str | None = None
    tls_client_cert: str | None = None
    tls_client_key: str | None = None
    tls_hostname: str | None = None

    @classmethod
    def from_airflow_config(cls) -> EngineSettings:
        """The ``[tfpipe]`` settings of this Airflow, validated (a clear error names what is missing)."""
        settings = cls(docker_url=_airflow_option("docker_url") or DEFAULT_DOCKER_URL,
                       **{name: _airflow_option(name) for name in (*TLS_OPTIONS, "tls_hostname")})
        settings.validate()
        return settings

    @property
    def uses_tls(self) -> bool:
        return any(getattr(self, name) for name in TLS_OPTIONS)

    def validate(self) -> None:
        """Raise :class:`TfpipeConfigError` unless the URL and the TLS files make a usable whole."""
        if "://" not in self.docker_url:
            raise TfpipeConfigError(
                f"[{SECTION}] docker_url: must be a URL like 'tcp://gpu-host:2376', got {self.docker_url!r}. "
                f"Fix: set AIRFLOW__TFPIPE__DOCKER_URL (or docker_url in airflow.cfg's [{SECTION}] section).")
        if not self.uses_tls:
            return
        for name in TLS_OPTIONS:
            path = getattr(self, name)
            if not path:
                raise TfpipeConfigError(
                    f"[{SECTION}] {name}: missing; TLS needs tls_ca_cert, tls_client_cert and tls_client_key "
                    f"together. Fix: set AIRFLOW__TFPIPE__{name.upper()} to a PEM file on every worker.")
            if not os.path.isfile(path):
                raise TfpipeConfigError(
                    f"[{SECTION}] {name}: {path} is not a file on this worker (engine {self.docker_url}). "
                    "Fix: install the engine's CA and this worker's client certificate and key there, "
                    f"or point AIRFLOW__TFPIPE__{name.upper()} at them.")

    def apply_to(self, operator: Any, *, tls_for_named_engine: bool = False) -> None:
        """Point a ``DockerOperator`` at this engine, unless the task named its own engine or TLS.

        ``tls_for_named_engine``: a ``tcp://`` engine the task named still gets this deployment's TLS
        files (the engines of one deployment trust one client CA).
        """
        if any(getattr(operator, name, None) for name in TLS_OPTIONS):
            return
        url = getattr(operator, "docker_url", DEFAULT_DOCKER_URL)
        names: tuple[str, ...] = TLS_OPTIONS
        if url == DEFAULT_DOCKER_URL:
            operator.docker_url = self.docker_url
            names = (*TLS_OPTIONS, "tls_hostname")  # that name is the deployment engine's, not another's
        elif not (tls_for_named_engine and url.startswith("tcp://")):
            return
        for name in names:
            if getattr(self, name):
                setattr(operator, name, getattr(self, name))

    def tls_config(self) -> Any:
        """A ``docker.tls.TLSConfig`` for a bare ``DockerHook``, or None without TLS."""
        if not self.uses_tls:
            return None
        from airflow.providers.docker.hooks.docker import DockerHook

        return DockerHook.construct_tls_config(ca_cert=self.tls_ca_cert, client_cert=self.tls_client_cert,
                                               client_key=self.tls_client_key, verify=True,
                                               assert_hostname=self.tls_hostname)


#: requests lets these override a session's CA file (docker-py's ``tls_ca_cert``) on every call.
CA_BUNDLE_ENV = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


def diagnose(docker_url: str, tls: Any) -> BaseException | None:
    """The error docker-py raises connecting to the engine, or None if it answers (``DockerHook``
    raises a generic error and only logs the cause)."""
    from docker import APIClient

    url = docker_url.replace("tcp://", "https://", 1) if tls else docker_url
    try:
        APIClient(base_url=url, version="auto", tls=tls or False, timeout=15).ping()
    except Exception as err:  # docker-py raises several types; the caller classifies the text
        return err
    return None


def engine_error_message(docker_url: str, err: BaseException) -> tuple[str, bool]:
    """Explain why the engine at ``docker_url`` did not answer; the flag says whether retrying can help
    (a TLS problem is configuration; a refused connection may be an engine restarting)."""
    text = f"{type(err).__name__}: {err}"
    lowered = text.lower()
    tls_words = ("ssl", "certificate", "tls", "handshake", "http request to an https server")
    if any(word in lowered for word in tls_words):
        hint = ""
        overriding = [name for name in CA_BUNDLE_ENV if os.environ.get(name)]
        if "verify failed" in lowered and overriding:
            verb = "is" if len(overriding) == 1 else "are"
            hint = (f" Note: {' and '.join(overriding)} {verb} set on this worker, and requests (under docker-py) "
                    "uses that instead of tls_ca_cert: unset it in the workers' environment.")
        return (
            f"the Docker engine at {docker_url} refused the TLS connection ({text}). Fix: give the workers a "
            "client certificate and key signed by the CA the engine trusts (its dockerd --tlscacert), and the "
            "CA that signed the engine's server certificate: set [tfpipe] tls_ca_cert, tls_client_cert and "
            "tls_client_key (AIRFLOW__TFPIPE__TLS_*), or the task's tls_* arguments." + hint,
            False,
        )
    return (
        f"cannot reach the Docker engine at {docker_url}: {text}. Fix: start dockerd on that host or point "
        "docker_url ([tfpipe] docker_url, AIRFLOW__TFPIPE__DOCKER_URL) at a running engine.",
        True,
    )
