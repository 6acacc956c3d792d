"""The provider metadata Airflow reads (`airflow providers list`, the UI's Providers page)."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from importlib import metadata, resources

import jsonschema

from tfpipe.get_provider_info import get_provider_info


def _strings(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def test_provider_info_validates_against_airflows_own_schema():
    schema = json.loads(resources.files("airflow").joinpath("provider_info.schema.json").read_text())
    jsonschema.validate(get_provider_info(), schema)


def test_provider_info_matches_the_installed_distribution():
    info = get_provider_info()
    assert info["package-name"] == "airflow-provider-tfpipe"
    assert info["versions"][0] == metadata.version(info["package-name"])


def test_every_module_and_class_it_names_imports():
    info = get_provider_info()
    modules = [m for section in ("operators", "hooks") for entry in info.get(section, [])
               for m in entry["python-modules"]]
    assert modules
    for name in modules:
        importlib.import_module(name)
    for path in info.get("extra-links", []):
        module, cls = path.rsplit(".", 1)
        assert isinstance(getattr(importlib.import_module(module), cls), type), path


def test_provider_info_names_no_url():
    """Airflow shows these URLs as links. Nothing of tfpipe is published on the web, so any URL here
    would lead nowhere; add one only once the page it names exists."""
    urls = [s for s in _strings(get_provider_info()) if re.search(r"[a-z][a-z0-9+.-]*://", s)]
    assert urls == []


def test_the_plugin_comes_through_the_entry_point_only():
    """The docs (Monitoring): the plugin is registered by the ``airflow.plugins`` entry point, not also by the
    provider info's ``plugins`` key (Airflow would register it twice where it reads that key)."""
    assert "plugins" not in get_provider_info()
    dist = metadata.distribution("airflow-provider-tfpipe")
    plugins = [ep for ep in dist.entry_points if ep.group == "airflow.plugins"]
    assert [(ep.name, ep.value) for ep in plugins] == [("tfpipe", "tfpipe.plugins.tfpipe:TfpipePlugin")]
    assert plugins[0].load().__name__ == "TfpipePlugin"


PLUGINS_PROBE = """
import json
from airflow import plugins_manager as pm
if hasattr(pm, "_get_plugins"):  # newer releases; older ones keep module globals
    plugins, errors = pm._get_plugins()
else:
    pm.ensure_plugins_loaded()
    plugins, errors = pm.plugins, pm.import_errors
print(json.dumps({"names": [p.name for p in plugins], "errors": {str(k): str(v) for k, v in errors.items()}}))
"""


def test_airflow_loads_the_plugin_once_and_records_no_plugin_error():
    """In a fresh process, as the api-server and workers load plugins: the plugin is there once, and
    Airflow records no plugin import error for it (one it would show in the UI and ``airflow plugins``).
    A second copy of the distribution's metadata on ``sys.path`` (the ``.egg-info`` a ``pip install -e``
    leaves in ``provider/``) made Airflow read the entry point twice and record one."""
    proc = subprocess.run([sys.executable, "-c", PLUGINS_PROBE], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert loaded["names"].count("tfpipe") == 1, loaded
    assert not {k: v for k, v in loaded["errors"].items() if "tfpipe" in k + v}, loaded["errors"]
    assert sum(1 for d in metadata.distributions() if d.metadata["Name"] == "airflow-provider-tfpipe") == 1


class _Log:
    """Stands in for the discovery's module logger (Airflow routes it through structlog, past
    ``caplog``): keeps every message at warning level or above."""

    def __init__(self):
        self.problems: list[str] = []

    def _keep(self, msg, *args, **kwargs):
        self.problems.append(msg % args if args else msg)

    warning = error = exception = critical = _keep

    def __getattr__(self, name):  # debug, info: not kept
        return lambda *args, **kwargs: None


def test_example_dag_discovery_finds_a_module_for_the_distribution_and_no_example_dags(monkeypatch):
    """With ``load_examples`` on (Airflow's default), Airflow guesses each provider's package from its
    distribution name to look for an ``example_dags`` folder; for ``airflow-provider-tfpipe`` the guess
    is ``airflow_provider_tfpipe``, which must import (else an error with a traceback is logged by every
    process that loads the DAG bundles) and add no bundle."""
    manager = importlib.import_module("airflow.dag_processing.bundles.manager")
    discover = getattr(manager, "_add_provider_example_dags_to_bundle", None)
    if discover is None:  # releases before it add only Airflow's own example DAGs
        import pytest

        pytest.skip("this Airflow does not look for providers' example DAGs")
    log = _Log()
    monkeypatch.setattr(manager, "log", log)
    bundles: list = []
    discover(bundles)
    assert not [m for m in log.problems if "tfpipe" in m], log.problems
    assert not [b for b in bundles if "tfpipe" in b.name], bundles


LAZY_APP_PROBE = r'''
import asyncio, json, sys
import tfpipe.plugins.tfpipe as plugin

loaded = {name: name in sys.modules for name in ("tfpipe.plugins.app", "tfpipe.plugins.run_access")}
lazy = plugin.TfpipePlugin.fastapi_apps[0]["app"]
statuses = []

async def request():
    scope = {"type": "http", "http_version": "1.1", "method": "GET", "scheme": "http", "path": "/no-such-route",
             "raw_path": b"/no-such-route", "root_path": "", "query_string": b"", "headers": [],
             "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}
    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}
    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])
    await lazy(scope, receive, send)

asyncio.run(request())
first = lazy._app
asyncio.run(request())
print(json.dumps({"before": loaded, "after": "tfpipe.plugins.app" in sys.modules, "statuses": statuses,
                  "same_app": lazy._app is first and first is not None}))
'''


def test_the_plugin_s_web_app_is_built_on_its_first_request_only():
    """Every Airflow process loads plugins (workers, the DAG processor, the scheduler); only the
    api-server serves requests. Loading the plugin imports none of the web app's modules; the first
    request builds the app, and later requests reuse it."""
    proc = subprocess.run([sys.executable, "-c", LAZY_APP_PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen == {"before": {"tfpipe.plugins.app": False, "tfpipe.plugins.run_access": False}, "after": True,
                    "statuses": [404, 404], "same_app": True}, seen
