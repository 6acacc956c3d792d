#!/usr/bin/env python3
"""``make up`` / ``make down`` / ``make status``: a real Airflow deployment on one machine.

What each part stands for in production::

    PostgreSQL ........ the metadata DB (Cloud SQL / RDS / the Helm chart's postgresql)
    Redis ............. the Celery broker
    api-server ........ UI + REST API v2 (simple auth manager, one admin user)
    scheduler, dag-processor, triggerer
    Celery workers .... N worker machines; each runs in its own mount namespace in which the GPU
                        host's disks are hidden, so nothing on a worker can touch a volume path
    registry .......... the image registry (Debian's docker-registry, the Distribution registry)
    MLflow ............ the tracking server and model registry: runs in the PostgreSQL database
                        ``mlflow``, artifacts beside the models volume (served by the server itself,
                        so workers never open that directory); Airflow's connection ``mlflow_default``
    GPU host .......... a second dockerd with its own data root, exec root and bridge, reachable
                        only over TCP with TLS client certificates; it pulls the trainer image
                        from the registry by digest, and holds the data/work/models volumes

Every server listens on 127.0.0.1, is started in the background in its own session, is waited
for until it answers, and is stopped by the pid recorded under ``$TFPIPE_STACK_DIR/run``.
Settings come from the environment (defaults in :data:`DEFAULTS`); ``$TFPIPE_STACK_DIR/stack.env``
holds the resolved values and the Airflow environment (``source`` it to use the ``airflow`` CLI
against the stack). Certificates and secrets are made on first ``up`` and stay out of git.

Usage: ``stack.py up [--fresh] | down | status``. ``--fresh`` starts from an empty metadata DB and
empty work/models volumes (keeping images, registry and certificates), as the tests do.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import pwd
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Every setting, its environment variable and its default. Ports are chosen to avoid the usual ones.
DEFAULTS = {
    "dir": ("TFPIPE_STACK_DIR", str(REPO / ".stack")),
    "api_port": ("TFPIPE_STACK_API_PORT", "28080"),
    "pg_port": ("TFPIPE_STACK_PG_PORT", "25432"),
    "redis_port": ("TFPIPE_STACK_REDIS_PORT", "26379"),
    "registry_port": ("TFPIPE_STACK_REGISTRY_PORT", "25000"),
    "mlflow_port": ("TFPIPE_STACK_MLFLOW_PORT", "25050"),
    "engine_port": ("TFPIPE_STACK_ENGINE_PORT", "22376"),
    "bridge": ("TFPIPE_STACK_BRIDGE", "tfpipe1"),
    "subnet": ("TFPIPE_STACK_SUBNET", "10.213.0.1/24"),
    "workers": ("TFPIPE_STACK_WORKERS", "2"),
    "concurrency": ("TFPIPE_STACK_WORKER_CONCURRENCY", "1"),
    "extra_dags": ("TFPIPE_STACK_EXTRA_DAGS", ""),
    "engine_args": ("TFPIPE_STACK_ENGINE_ARGS", ""),
    "image": ("TFPIPE_STACK_IMAGE", ""),
}
ADMIN_USER = "admin"
SIMPLE_AUTH = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
# pigz: the GPU host's engine unpacks pulled layers with unpigz when it finds it (Go's gzip
# otherwise): the first pull of the 4.45 GB trainer image took 92 s with it, 135 s without.
PACKAGES = {"redis-server": "redis-server", "docker-registry": "docker-registry", "postgres": "postgresql",
            "unpigz": "pigz"}


def log(msg: str) -> None:
    print(f"[stack] {msg}", file=sys.stderr, flush=True)


class StackError(RuntimeError):
    """A part of the stack did not start; the message names it and its log."""


class Stack:
    """Paths, settings and secrets of one deployment under ``dir``."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ if env is None else env)
        self.settings = {key: env.get(var) or default for key, (var, default) in DEFAULTS.items()}
        self.dir = Path(self.settings["dir"]).resolve()
        self.run = self.dir / "run"
        self.logs = self.dir / "logs"
        self.certs = self.dir / "certs"
        # Everything the "GPU host" owns; the workers' mount namespace hides this whole tree.
        self.gpuhost = self.dir / "gpuhost"
        self.volumes = self.gpuhost / "volumes"
        self.engine_sock = self.gpuhost / "docker.sock"
        self.airflow_home = self.dir / "airflow"
        self.pg_data = self.dir / "postgres" / "data"
        self.pg_sock = self.dir / "postgres" / "run"
        self.root = os.geteuid() == 0
        self.venv_bin = Path(sys.executable).parent
        self._ready_mark: dict[str, int] = {}

    # -- settings -----------------------------------------------------------------------------

    def port(self, name: str) -> int:
        return int(self.settings[f"{name}_port"])

    @property
    def engine_url(self) -> str:
        return f"tcp://127.0.0.1:{self.port('engine')}"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port('api')}"

    @property
    def registry(self) -> str:
        return f"127.0.0.1:{self.port('registry')}"

    def secret(self, name: str, make=lambda: secrets.token_urlsafe(24)) -> str:
        """A secret kept in ``secrets/<name>`` (0600), made on first use."""
        path = self.dir / "secrets" / name
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.write_text(make())
            path.chmod(0o600)
        return path.read_text().strip()

    @property
    def pg_url(self) -> str:
        """The metadata DB's SQLAlchemy URL (psycopg2, the ``airflow`` role over loopback TCP)."""
        return f"postgresql+psycopg2://airflow:{self.secret('pg-password')}@127.0.0.1:{self.port('pg')}/airflow"

    def airflow_env(self) -> dict[str, str]:
        """The environment every Airflow process of the stack runs with."""
        redis_pw = self.secret("redis-password")
        client = self.certs / "client"
        env = {
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__EXECUTOR": "airflow.providers.celery.executors.celery_executor.CeleryExecutor",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__CORE__FERNET_KEY": self.secret(
                "fernet-key", lambda: base64.urlsafe_b64encode(secrets.token_bytes(32)).decode()),
            "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(self.airflow_home / "passwords.json"),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{self.api_url}/execution/",
            "AIRFLOW__API__BASE_URL": self.api_url,
            "AIRFLOW__API__SECRET_KEY": self.secret("api-secret-key"),
            "AIRFLOW__API_AUTH__JWT_SECRET": self.secret("jwt-secret"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.pg_url,
            "AIRFLOW__CELERY__BROKER_URL": f"redis://:{redis_pw}@127.0.0.1:{self.port('redis')}/0",
            "AIRFLOW__CELERY__RESULT_BACKEND": f"db+{self.pg_url}",
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": self.settings["concurrency"],
            # The engine and the TLS files a worker presents (read by tfpipe in execute()).
            "AIRFLOW__TFPIPE__DOCKER_URL": self.engine_url,
            "AIRFLOW__TFPIPE__TLS_CA_CERT": str(client / "ca.pem"),
            "AIRFLOW__TFPIPE__TLS_CLIENT_CERT": str(client / "cert.pem"),
            "AIRFLOW__TFPIPE__TLS_CLIENT_KEY": str(client / "key.pem"),
            # Paths on the GPU host (the DAG files read TFPIPE_HOME; nothing on a worker opens them).
            "TFPIPE_HOME": str(self.volumes),
            "TFPIPE_STACK_DIR": str(self.dir),
            "TFPIPE_RETRY_DELAY": os.environ.get("TFPIPE_RETRY_DELAY", "5"),
            "PATH": f"{self.venv_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        }
        bundles = [{"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                    "kwargs": {"path": str(REPO / "dags")}}]
        if self.settings["extra_dags"]:
            bundles.append({"name": "extra-dags", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
                            "kwargs": {"path": str(Path(self.settings["extra_dags"]).resolve())}})
        env["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps(bundles)
        return env

    def process_env(self) -> dict[str, str]:
        """The caller's environment (its other AIRFLOW__* settings pass through) plus the stack's."""
        # requests would let a CA-bundle variable override the engine's CA (tls_ca_cert) in docker-py.
        drop = ("AIRFLOW_CONFIG", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
        base = {k: v for k, v in os.environ.items() if k not in drop}
        return {**base, **self.airflow_env()}

    def image_ref(self) -> str | None:
        path = self.dir / "image-ref"
        return path.read_text().strip() if path.exists() else None

    def admin_password(self) -> str:
        return self.secret("admin-password")

    def check_owner(self, command: str) -> None:
        """Refuse, before touching anything, a stack that another user started.

        Its processes run as that user (or as the users root gave them), and its secrets are that
        user's only: someone else could neither signal the one nor read the other.
        """
        if self.root:
            return
        try:
            owner = self.dir.stat().st_uid
        except FileNotFoundError:
            return
        except PermissionError:
            owner = -1
        if owner != os.geteuid():
            raise StackError(f"the stack in {self.dir} was started by {_user_name(owner)}: run `sudo make {command}`")

    # -- processes ----------------------------------------------------------------------------

    def pidfile(self, name: str) -> Path:
        return self.run / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        """The recorded pid of ``name`` if that process is alive."""
        path = self.pidfile(name)
        if not path.exists():
            return None
        try:
            pid = int(path.read_text().split()[0])
        except (ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def spawn(self, name: str, argv: list[str], *, env: dict[str, str] | None = None, user: str | None = None,
              cwd: Path | None = None) -> int:
        """Start ``argv`` in the background in its own session, logging to ``logs/<name>.log``."""
        if self.pid(name):
            log(f"{name} already runs (pid {self.pid(name)})")
            return self.pid(name)  # type: ignore[return-value]
        self.logs.mkdir(parents=True, exist_ok=True)
        self.run.mkdir(parents=True, exist_ok=True)
        out = open(self.logs / f"{name}.log", "ab")
        preexec = _drop_to(user) if user and self.root else None
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env or self.process_env(), cwd=str(cwd or self.dir),
                                start_new_session=True, preexec_fn=preexec)
        out.close()
        self.pidfile(name).write_text(f"{proc.pid}\n")
        return proc.pid

    def wait_for(self, name: str, check, timeout: float, what: str) -> None:
        """Poll ``check()`` until true; fail naming the part and its log if it dies or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if check():
                    return
            if self.pidfile(name).exists() and not self.pid(name):
                raise StackError(f"{name} exited during start-up; log: {self.logs / (name + '.log')}\n"
                                 + _tail(self.logs / f"{name}.log"))
            time.sleep(0.5)
        raise StackError(f"{name} did not {what} within {timeout:.0f} s; log: {self.logs / (name + '.log')}\n"
                         + _tail(self.logs / f"{name}.log"))

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 30) -> None:
        """Signal ``name``'s process group (it runs in its own session), then SIGKILL what is left."""
        pid = self.pid(name)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and _group_alive(pid):
                time.sleep(0.2)
            if _group_alive(pid):
                log(f"{name} (pid {pid}) ignored {signal.Signals(sig).name} for {timeout:.0f} s: SIGKILL")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                while _group_alive(pid):
                    time.sleep(0.1)
        self.pidfile(name).unlink(missing_ok=True)

    # -- the parts ----------------------------------------------------------------------------

    def airflow(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.venv_bin / "airflow"), *args], env=self.process_env(), check=check,
                              capture_output=True, text=True, cwd=str(self.dir))

    def make_certs(self) -> None:
        """A CA, the engine's server certificate (127.0.0.1, localhost) and a client certificate."""
        server, client = self.gpuhost / "tls", self.certs / "client"
        if (client / "cert.pem").exists() and (server / "cert.pem").exists():
            return
        ca = self.certs / "ca"
        for d in (ca, server, client):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(0o700)
        ossl = ["openssl"]
        _run(*ossl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "3650", "-subj", "/CN=tfpipe stack CA",
             "-keyout", ca / "key.pem", "-out", ca / "ca.pem")
        for where, cn, ext in ((server, "tfpipe gpu host", "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                "extendedKeyUsage=serverAuth\n"),
                               (client, "tfpipe worker", "extendedKeyUsage=clientAuth\n")):
            (where / "ext.cnf").write_text(ext)
            _run(*ossl, "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout", where / "key.pem",
                 "-out", where / "req.csr")
            _run(*ossl, "x509", "-req", "-in", where / "req.csr", "-CA", ca / "ca.pem", "-CAkey", ca / "key.pem",
                 "-CAcreateserial", "-days", "3650", "-extfile", where / "ext.cnf", "-out", where / "cert.pem")
            shutil.copy(ca / "ca.pem", where / "ca.pem")
            for f in ("req.csr", "ext.cnf"):
                (where / f).unlink()
        # Workers read their client key as whatever user runs them; keep it private to that user.
        for f in client.iterdir():
            f.chmod(0o600 if f.name == "key.pem" else 0o644)

    def start_postgres(self) -> None:
        bindir = _postgres_bindir()
        user = "postgres" if self.root else None
        if not (self.pg_data / "PG_VERSION").exists():
            self.pg_data.mkdir(parents=True, exist_ok=True)
            pwfile = self.dir / "postgres" / "pwfile"
            pwfile.write_text(self.secret("pg-superuser-password") + "\n")
            if user:
                _chown_tree(self.dir / "postgres", user)
            _run(str(bindir / "initdb"), "-D", self.pg_data, "-U", "postgres", "--pwfile", pwfile,
                 "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", user=user if self.root else None)
            pwfile.unlink()
        self.pg_sock.mkdir(parents=True, exist_ok=True)
        if user:
            _chown_tree(self.pg_sock, user)
        self.pg_sock.chmod(0o700)
        self.spawn("postgres", [str(bindir / "postgres"), "-D", str(self.pg_data), "-p", str(self.port("pg")),
                                "-k", str(self.pg_sock), "-c", "listen_addresses=127.0.0.1"], user=user)
        self.wait_for("postgres", lambda: _run(str(bindir / "pg_isready"), "-q", "-h", "127.0.0.1", "-p",
                                               str(self.port("pg")), check=False).returncode == 0,
                      60, "accept connections")
        psql = [str(bindir / "psql"), "-h", str(self.pg_sock), "-p", str(self.port("pg")), "-U", "postgres",
                "-v", "ON_ERROR_STOP=1", "-qtA"]
        exists = _run(*psql, "-c", "SELECT 1 FROM pg_roles WHERE rolname='airflow'", user=user).stdout.strip()
        if not exists:
            pw = self.secret("pg-password").replace("'", "''")
            _run(*psql, "-c", f"CREATE ROLE airflow LOGIN PASSWORD '{pw}'", user=user)
            _run(*psql, "-c", "CREATE DATABASE airflow OWNER airflow", user=user)

    # -- MLflow ---------------------------------------------------------------------------------

    @property
    def mlflow_url(self) -> str:
        return f"http://127.0.0.1:{self.port('mlflow')}"

    @property
    def mlflow_artifacts(self) -> Path:
        """The MLflow artifact root: beside the models volume, on the GPU host's disks."""
        return self.volumes / "mlflow-artifacts"

    def start_mlflow(self) -> None:
        """The MLflow tracking server from its own venv (scripts/ensure-mlflow-server.sh: the full mlflow
        package stays out of Airflow's), its store in the PostgreSQL database ``mlflow``, and the Airflow
        connection ``mlflow_default`` that the pipelines' ``register`` tasks log to."""
        built = _run(REPO / "scripts" / "ensure-mlflow-server.sh", check=False)
        if built.returncode:
            raise StackError(f"MLflow server venv: {built.stderr.strip()[-3000:]}")
        log(built.stdout.strip())
        bindir = _postgres_bindir()
        user = "postgres" if self.root else None
        psql = [str(bindir / "psql"), "-h", str(self.pg_sock), "-p", str(self.port("pg")), "-U", "postgres",
                "-v", "ON_ERROR_STOP=1", "-qtA"]
        if not _run(*psql, "-c", "SELECT 1 FROM pg_roles WHERE rolname='mlflow'", user=user).stdout.strip():
            pw = self.secret("mlflow-pg-password").replace("'", "''")
            _run(*psql, "-c", f"CREATE ROLE mlflow LOGIN PASSWORD '{pw}'", user=user)
            _run(*psql, "-c", "CREATE DATABASE mlflow OWNER mlflow", user=user)
        self.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
        store = f"postgresql+psycopg2://mlflow:{self.secret('mlflow-pg-password')}@127.0.0.1:{self.port('pg')}/mlflow"
        # The store's URL holds a password: through the environment, not the command line (ps shows that).
        env = {**self.process_env(), "MLFLOW_BACKEND_STORE_URI": store}
        self.spawn("mlflow", [str(REPO / ".cache" / "mlflow-server" / "bin" / "mlflow"), "server",
                              "--host", "127.0.0.1", "--port", str(self.port("mlflow")), "--workers", "1",
                              "--artifacts-destination", str(self.mlflow_artifacts)], env=env)
        self.wait_for("mlflow", lambda: _http_status(f"{self.mlflow_url}/health") == 200, 180, "answer /health")
        self.airflow("connections", "delete", "mlflow_default", check=False)
        self.airflow("connections", "add", "mlflow_default", "--conn-type", "http", "--conn-host", self.mlflow_url,
                     "--conn-description", "the stack's MLflow tracking server (tfpipe's register task)")

    def start_redis(self) -> None:
        exe = _need("redis-server")
        d = self.dir / "redis"
        d.mkdir(parents=True, exist_ok=True)
        user = "redis" if self.root and _user_exists("redis") else None
        if user:
            _chown_tree(d, user)
        # The password travels as a config line on stdin, not on the command line (ps shows that).
        conf = d / "redis.conf"
        conf.write_text(f"bind 127.0.0.1\nport {self.port('redis')}\nprotected-mode yes\ndir {d}\n"
                        f"save \"\"\nappendonly no\ndaemonize no\nrequirepass {self.secret('redis-password')}\n")
        conf.chmod(0o600)
        if user:
            _chown_tree(d, user)
        self.spawn("redis", [exe, str(conf)], user=user)
        self.wait_for("redis", lambda: _redis_ping(self.port("redis"), self.secret("redis-password")), 30, "answer PING")

    def start_registry(self) -> None:
        exe = _need("docker-registry")
        d = self.dir / "registry"
        (d / "data").mkdir(parents=True, exist_ok=True)
        conf = d / "config.yml"
        conf.write_text(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
            f"    rootdirectory: {d / 'data'}\n  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port('registry')}\n")
        user = "docker-registry" if self.root and _user_exists("docker-registry") else None
        if user:
            _chown_tree(d, user)
        self.spawn("registry", [exe, "serve", str(conf)], user=user)
        self.wait_for("registry", lambda: _http_status(f"http://{self.registry}/v2/") == 200, 30, "answer /v2/")

    def start_engine(self, *, live_restore: bool = False) -> None:
        """The stand-in GPU host: dockerd on its own roots and bridge, TLS with client certificates.

        ``live_restore``: the engine adopts the containers still running in their shims after it
        crashed, instead of stopping them (dockerd's ``live-restore``).
        """
        if not self.root:
            raise StackError("the stand-in GPU host (a second dockerd) needs root: run `sudo make up`")
        exe = _need("dockerd")
        bridge = self.settings["bridge"]
        if subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode != 0:
            # Its own bridge: never the first engine's docker0, and never --bridge=none, which
            # deletes docker0 under the first engine.
            _run("ip", "link", "add", bridge, "type", "bridge")
            _run("ip", "addr", "add", self.settings["subnet"], "dev", bridge)
        _run("ip", "link", "set", bridge, "up")
        for d in ("docker", "exec", "volumes/data", "volumes/work", "volumes/models"):
            (self.gpuhost / d).mkdir(parents=True, exist_ok=True)
        # Its own (empty) config file, so it never reads the first engine's /etc/docker/daemon.json.
        (self.gpuhost / "daemon.json").write_text(json.dumps({"live-restore": True} if live_restore else {}) + "\n")
        tls = self.gpuhost / "tls"
        ns = f"tfpipe-gpuhost-{self.port('engine')}"
        argv = [exe, "--config-file", str(self.gpuhost / "daemon.json"),
                "--data-root", str(self.gpuhost / "docker"), "--exec-root", str(self.gpuhost / "exec"),
                "--pidfile", str(self.gpuhost / "dockerd.pid"),
                "-H", self.engine_url, "-H", f"unix://{self.engine_sock}",
                "--tlsverify", "--tlscacert", str(tls / "ca.pem"), "--tlscert", str(tls / "cert.pem"),
                "--tlskey", str(tls / "key.pem"),
                "--bridge", bridge, "--iptables=false", "--ip-masq=false", "--ip-forward=false",
                "--userland-proxy=false", "--containerd-namespace", ns,
                "--containerd-plugins-namespace", f"{ns}-plugins", "--cgroup-parent", ns,
                *shlex.split(self.settings["engine_args"])]
        self.spawn("engine", argv)
        self.wait_for("engine", lambda: self.engine_docker("info", check=False).returncode == 0, 60, "answer `docker info`")

    def restart_engine(self, *, live_restore: bool) -> None:
        """Crash the GPU host's engine and start it again, as a host's dockerd crash and restart would.

        SIGKILL reaches dockerd and the containerd it manages (one process group); the containers
        run on in their shims, which containerd starts in process groups of their own. Started
        again, containerd reconnects to the shims; dockerd then adopts the running containers with
        ``live_restore``, and stops them without it.
        """
        self.stop("engine", signal.SIGKILL)
        # The dead daemons' parents are gone, so PID 1 reaps them when it gets to it; until then
        # their pid files name zombies, which a new dockerd takes for a running daemon ("pid file
        # found") and for a running containerd (it waits for that one's socket and times out).
        for pidfile in (self.gpuhost / "dockerd.pid", self.gpuhost / "exec" / "containerd" / "containerd.pid"):
            with contextlib.suppress(OSError, ValueError):
                pid = int(pidfile.read_text().strip())
                deadline = time.monotonic() + 30
                while _alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.2)  # containerd gets its parent-death signal a moment later
                if _alive(pid):
                    raise StackError(f"engine: process {pid} of {pidfile} survived SIGKILL of the engine")
                pidfile.unlink()
        self.start_engine(live_restore=live_restore)

    def engine_docker_argv(self, *args: str) -> list[str]:
        """The docker CLI's argv against the GPU host, over TLS as a worker would."""
        client = self.certs / "client"
        return ["docker", "-H", self.engine_url, "--tlsverify", "--tlscacert", str(client / "ca.pem"),
                "--tlscert", str(client / "cert.pem"), "--tlskey", str(client / "key.pem"), *args]

    def engine_docker(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """The docker CLI against the GPU host, over TLS as a worker would."""
        return _run(*self.engine_docker_argv(*args), check=check)

    def push_image(self) -> str:
        """Push the trainer image from the first engine to the registry; return its reference by digest."""
        source = self.settings["image"] or _read(REPO / ".cache" / "trainer-image")
        if not source:
            raise StackError("no trainer image: run `make image` first (or set TFPIPE_STACK_IMAGE)")
        name = source.rsplit("/", 1)[-1].split("@")[0]
        repo_tag = f"{self.registry}/tfpipe/{name}" if ":" in name else f"{self.registry}/tfpipe/{name}:latest"
        _run("docker", "tag", source, repo_tag)
        try:
            out = _run("docker", "push", repo_tag).stdout
        finally:
            # Leave the shared first engine as found: only the registry keeps the new name.
            _run("docker", "rmi", repo_tag, check=False)
        digest = next((w for w in out.split() if w.startswith("sha256:")), None)
        if not digest:
            raise StackError(f"docker push printed no digest:\n{out}")
        ref = f"{repo_tag.rsplit(':', 1)[0]}@{digest}"
        (self.dir / "image-ref").write_text(ref + "\n")
        return ref

    def start_pull(self, ref: str) -> subprocess.Popen:
        """Start the GPU host's pull of ``ref``; :meth:`up` starts Airflow meanwhile.

        The pull (decompress and unpack, about two minutes on two cores the first time) and
        Airflow's migration and start-up (about 40 s) use different resources; nothing of Airflow
        needs the image before ``up`` returns (new DAGs start paused, and a task pulls a missing
        image itself anyway).
        """
        log_file = open(self.logs / "pull.log", "w")
        with log_file:
            return subprocess.Popen(self.engine_docker_argv("pull", "-q", ref), stdout=log_file,
                                    stderr=subprocess.STDOUT)

    def finish_pull(self, proc: subprocess.Popen, ref: str) -> None:
        if proc.wait():
            raise StackError(f"the GPU host could not pull {ref} (exit {proc.returncode}); "
                             f"log: {self.logs / 'pull.log'}\n{_tail(self.logs / 'pull.log')}")

    def make_data(self) -> None:
        target = self.volumes / "data" / "digits"
        if not (target / "digits.csv").exists():
            _run(sys.executable, REPO / "scripts" / "make_digits.py", target)

    def migrate(self) -> None:
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        pw_file = self.airflow_home / "passwords.json"
        pw_file.write_text(json.dumps({ADMIN_USER: self.admin_password()}))
        pw_file.chmod(0o600)
        result = self.airflow("db", "migrate", check=False)
        (self.logs / "migrate.log").write_text(result.stdout + result.stderr)
        if result.returncode:
            raise StackError(f"airflow db migrate failed; log: {self.logs / 'migrate.log'}\n{result.stderr[-3000:]}")
        self.airflow("pools", "set", "gpu", "1", "GPUs of the GPU host: one training at a time")
        # The DAG files name no image: every task reads this Variable when it runs (tfpipe/settings.py).
        image = self.image_ref()
        if image:
            self.airflow("variables", "set", "tfpipe_image", image)

    def start_airflow(self) -> None:
        af = str(self.venv_bin / "airflow")
        self.spawn("api-server", [af, "api-server", "--host", "127.0.0.1", "--port", str(self.port("api")),
                                  "--workers", "1"])
        self.spawn("scheduler", [af, "scheduler"])
        self.spawn("dag-processor", [af, "dag-processor"])
        self.spawn("triggerer", [af, "triggerer", "--skip-serve-logs"])
        for n in range(1, int(self.settings["workers"]) + 1):
            self.start_worker(n, wait=False)
        self.wait_for("api-server", lambda: _http_status(f"{self.api_url}/api/v2/monitor/health") == 200, 180,
                      "answer /api/v2/monitor/health")
        for part in ("scheduler", "dag_processor", "triggerer"):
            self.wait_for(part.replace("_", "-"), lambda p=part: self.health().get(p, {}).get("status") == "healthy",
                          120, "report healthy")
        for n in range(1, int(self.settings["workers"]) + 1):
            self.wait_for_worker(n)

    def start_worker(self, n: int, wait: bool = True) -> int:
        """Start Celery worker ``n`` (``worker<n>@<host>``) in a namespace that hides the GPU host."""
        name = f"worker{n}"
        log_path = self.logs / f"{name}.log"
        self._ready_mark[name] = log_path.stat().st_size if log_path.exists() else 0
        pid = self.spawn(name, self.hidden_from_gpuhost(
            [str(self.venv_bin / "airflow"), "celery", "worker", "--celery-hostname", f"{name}@%h",
             "--skip-serve-logs", "--concurrency", self.settings["concurrency"]]))
        if wait:
            self.wait_for_worker(n)
        return pid

    def wait_for_worker(self, n: int) -> None:
        name = f"worker{n}"

        def ready() -> bool:
            with open(self.logs / f"{name}.log", "rb") as f:
                f.seek(self._ready_mark.get(name, 0))
                return b" ready." in f.read()

        self.wait_for(name, ready, 120, "report ready to Celery")

    def hidden_from_gpuhost(self, argv: list[str]) -> list[str]:
        """Run ``argv`` in its own mount namespace in which the GPU host's tree is an empty tmpfs.

        The mounts the engine made under that tree (container layers, network namespaces) are
        detached first, so the worker holds no reference that would keep the engine from
        unmounting them.
        """
        root = str(self.gpuhost)
        script = (
            "set -e; "
            f"awk '$5 ~ \"^{root}(/|$)\" {{print $5}}' /proc/self/mountinfo | sort -r | "
            "while read -r m; do umount -l \"$m\" 2>/dev/null || true; done; "
            f"mount -t tmpfs -o size=64k,mode=0755 tfpipe-hidden {shlex.quote(root)}; "
            'exec "$@"'
        )
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "sh", *argv]

    def health(self) -> dict:
        with urllib.request.urlopen(f"{self.api_url}/api/v2/monitor/health", timeout=5) as resp:
            return json.loads(resp.read())

    # -- commands -----------------------------------------------------------------------------

    def up(self, fresh: bool = False) -> None:
        t0 = time.monotonic()
        _check_tools(self.root)
        if fresh:
            self.down(quiet=True)
            for path in (self.airflow_home, self.dir / "postgres", self.dir / "redis", self.logs,
                         self.volumes / "work", self.volumes / "models", self.mlflow_artifacts):
                shutil.rmtree(path, ignore_errors=True)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        log(f"state in {self.dir}")
        self.make_certs()
        self.start_postgres()
        self.start_redis()
        self.start_registry()
        self.start_engine()
        ref = self.push_image()
        log(f"trainer image in the registry: {ref}; the GPU host pulls it while Airflow starts")
        pull = self.start_pull(ref)
        try:
            self.make_data()
            self.migrate()
            self.start_mlflow()
            self.start_airflow()
        except BaseException:
            pull.kill()
            pull.wait()
            raise
        self.finish_pull(pull, ref)
        log("trainer image on the GPU host")
        self.write_env()
        log(f"up in {time.monotonic() - t0:.0f} s")
        self.status()

    def write_env(self) -> None:
        lines = [f"export {k}={shlex.quote(v)}" for k, v in sorted(self.airflow_env().items())]
        lines += [f"export {var}={shlex.quote(self.settings[key])}" for key, (var, _) in DEFAULTS.items()]
        lines += [f"export TFPIPE_STACK_API_URL={shlex.quote(self.api_url)}",
                  f"export TFPIPE_STACK_ADMIN_USER={ADMIN_USER}",
                  f"export TFPIPE_STACK_ADMIN_PASSWORD={shlex.quote(self.admin_password())}"]
        path = self.dir / "stack.env"
        path.write_text("\n".join(lines) + "\n")
        path.chmod(0o600)

    PARTS = ("worker*", "scheduler", "triggerer", "dag-processor", "api-server", "mlflow", "engine", "registry",
             "redis", "postgres")

    def names(self) -> list[str]:
        found = {p.stem for p in self.run.glob("*.pid")} if self.run.exists() else set()
        ordered = sorted(n for n in found if n.startswith("worker"))
        ordered += [n for n in self.PARTS[1:] if n in found]
        return ordered

    def down(self, quiet: bool = False) -> None:
        for name in self.names():
            if name == "engine" and self.pid("engine"):
                self.remove_engine_containers()
            # PostgreSQL's "fast" shutdown is SIGINT; SIGTERM would wait for every client.
            self.stop(name, signal.SIGINT if name == "postgres" else signal.SIGTERM,
                      timeout=60 if name.startswith("worker") else 30)
            if name == "engine":
                for shim in stop_leftover_shims(self.gpuhost / "exec"):
                    log(f"engine: stopped leftover containerd shim {shim} and its container's processes")
            if not quiet:
                log(f"stopped {name}")
        self.unmount_leftovers()
        bridge = self.settings["bridge"]
        if self.root and subprocess.run(["ip", "link", "show", bridge], capture_output=True).returncode == 0:
            _run("ip", "link", "del", bridge, check=False)
        if not quiet:
            log("down: no process of the stack is left")

    def unmount_leftovers(self) -> None:
        """Unmount what a crashed engine left mounted under the state dir (a stopped one unmounts its own).

        dockerd bind-mounts its data root onto itself; killed, it cannot undo that, and the engine
        started after it mounts it once more, so one mount outlives the stack.
        """
        if not self.root:
            return
        root = str(self.dir.resolve())
        points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
        for point in sorted((p for p in points if p == root or p.startswith(root + "/")), reverse=True):
            _run("umount", "-l", point, check=False)

    def remove_engine_containers(self) -> None:
        """Every container on the GPU host belongs to the stack: remove them before the engine stops."""
        ids = _run("docker", "-H", f"unix://{self.engine_sock}", "ps", "-aq", check=False).stdout.split()
        if ids:
            _run("docker", "-H", f"unix://{self.engine_sock}", "rm", "-f", *ids, check=False)

    def status(self) -> int:
        rows, bad = [], 0
        for name in self.names() or ["(nothing started)"]:
            pid = self.pid(name)
            bad += pid is None
            rows.append(f"  {name:14} {'pid ' + str(pid) if pid else 'NOT RUNNING'}")
        print("\n".join(rows))
        if self.pid("api-server"):
            with contextlib.suppress(Exception):
                h = self.health()
                print("  health:        " + ", ".join(f"{k}={v.get('status')}" for k, v in h.items()))
            print(f"\nUI and REST API: {self.api_url}   (REST: {self.api_url}/api/v2, docs: {self.api_url}/docs)")
            print(f"admin user:      {ADMIN_USER}   password: {self.admin_password()}")
            print(f"GPU host engine: {self.engine_url} (TLS; client cert in {self.certs / 'client'})")
            print(f"registry:        http://{self.registry}   image: {self.image_ref()}")
        if self.pid("mlflow"):
            print(f"MLflow:          {self.mlflow_url}   (Airflow connection mlflow_default; artifacts in "
                  f"{self.mlflow_artifacts})")
            print(f"airflow CLI:     source {self.dir / 'stack.env'} && airflow dags list")
        return 1 if bad else 0


# -- helpers ------------------------------------------------------------------------------------

def _run(*argv, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    args = [str(a) for a in argv]
    result = subprocess.run(args, capture_output=True, text=True,
                            preexec_fn=_drop_to(user) if user and os.geteuid() == 0 else None)
    if check and result.returncode:
        raise StackError(f"{' '.join(args[:3])} ... failed (exit {result.returncode}):\n{result.stderr[-2000:]}")
    return result


def _drop_to(user: str):
    entry = pwd.getpwnam(user)

    def preexec() -> None:
        os.setgroups([])
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)

    return preexec


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "another user" if uid < 0 else f"uid {uid}"


def _user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def _chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, n) for n in dirs + files)]:
            os.chown(name, entry.pw_uid, entry.pw_gid)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not; one of our own is reaped here)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies of our own children count as gone.
    with contextlib.suppress(ChildProcessError):
        os.waitpid(-pgid, os.WNOHANG)
    return _pgid_has_live_members(pgid)


def stop_leftover_shims(exec_root: Path, timeout: float = 10) -> list[int]:
    """SIGKILL the containerd shims of the engine whose exec root is ``exec_root``, and what they run.

    Shims run in process groups of their own, so stopping the engine's group never reaches them.
    One whose container was just removed exits when containerd tells it to; if containerd stops
    first (``make down`` stops it right after ``docker rm -f``), or the engine crashed, nobody
    does, and the shim, with any container still under it, would outlive the stack. Returns the
    shims' pids.
    """
    address = f"-address {exec_root.resolve()}/"
    procs = _processes()
    shims = [pid for pid, (_, cmdline) in procs.items() if "containerd-shim" in cmdline and address in cmdline]
    doomed = set()
    todo = list(shims)
    while todo:  # each shim and everything under it: its container's init and that one's children
        pid = todo.pop()
        if pid not in doomed:
            doomed.add(pid)
            todo += [child for child, (ppid, _) in procs.items() if ppid == pid]
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in doomed):
        time.sleep(0.1)
    if left := [pid for pid in doomed if _alive(pid)]:
        raise StackError(f"engine: processes {left} of its leftover shims survived SIGKILL")
    return sorted(shims)


def _processes() -> dict[int, tuple[int, str]]:
    """Every process now: pid -> (parent pid, command line)."""
    found = {}
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found[int(proc.name)] = (int(fields[1]), cmdline)
    return found


def _pgid_has_live_members(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def _postgres_bindir() -> Path:
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(os.path.realpath(on_path)).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    if not versions:
        raise StackError(_install_hint(["postgresql"]))
    return versions[-1]


def _need(exe: str) -> str:
    path = shutil.which(exe) or (f"/usr/sbin/{exe}" if os.path.exists(f"/usr/sbin/{exe}") else None)
    if not path:
        raise StackError(_install_hint([PACKAGES.get(exe, exe)]))
    return path


def _install_hint(packages: list[str]) -> str:
    return ("missing: " + ", ".join(packages) + ". Install them: sudo apt-get install -y " + " ".join(packages)
            + " (or run `make up` as root on Debian, which installs them)")


def _check_tools(root: bool) -> None:
    """Install the Debian packages the stack needs when root on Debian; otherwise name them."""
    missing = [pkg for exe, pkg in PACKAGES.items()
               if not (shutil.which(exe) or (exe == "postgres" and Path("/usr/lib/postgresql").exists()))]
    if not missing:
        return
    if root and Path("/etc/debian_version").exists() and shutil.which("apt-get"):
        log(f"installing Debian packages: {' '.join(missing)}")
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive", "NEEDRESTART_SUSPEND": "1"},
                       stdout=subprocess.DEVNULL)
        return
    raise StackError(_install_hint(missing))


def _redis_ping(port: int, password: str) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(f"AUTH {password}\r\nPING\r\n".encode())
        data = b""
        while b"PONG" not in data and len(data) < 1000:
            chunk = s.recv(100)
            if not chunk:
                break
            data += chunk
        return b"PONG" in data


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _tail(path: Path, n: int = 25) -> str:
    return "\n".join(_read(path).splitlines()[-n:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["up", "down", "status", "tools"],
                        help="tools: only install (as root on Debian) or name the Debian packages the stack "
                             "needs; the tests that start PostgreSQL or Redis need them too")
    parser.add_argument("--fresh", action="store_true", help="up: empty metadata DB and work/models volumes")
    args = parser.parse_args(argv)
    if args.command == "tools":
        try:
            _check_tools(os.geteuid() == 0)
        except StackError as err:
            print(f"[stack] error: {err}", file=sys.stderr)
            return 1
        return 0
    stack = Stack()
    try:
        stack.check_owner(args.command)
        if args.command == "up":
            try:
                stack.up(fresh=args.fresh)
            except BaseException:
                log("up failed: stopping what started (`make status` shows nothing left)")
                stack.down(quiet=True)
                raise
            return 0
        if args.command == "down":
            stack.down()
            return 0
        return stack.status()
    except StackError as err:
        print(f"[stack] error: {err}", file=sys.stderr)
        return 1
    except PermissionError as err:
        # A part of the state dir another user owns (check_owner saw only the dir itself).
        print(f"[stack] error: {err}: the stack in {stack.dir} belongs to another user: run `sudo make "
              f"{args.command}`", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
