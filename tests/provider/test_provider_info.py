"""The provider metadata Airflow reads (`airflow providers list`, the UI's Providers page)."""

from __future__ import annotations

import importlib
import json
import re
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
    """The README: the plugin is registered by the ``airflow.plugins`` entry point, not also by the
    provider info's ``plugins`` key (Airflow would register it twice where it reads that key)."""
    assert "plugins" not in get_provider_info()
    dist = metadata.distribution("airflow-provider-tfpipe")
    plugins = [ep for ep in dist.entry_points if ep.group == "airflow.plugins"]
    assert [(ep.name, ep.value) for ep in plugins] == [("tfpipe", "tfpipe.plugins.tfpipe:TfpipePlugin")]
    assert plugins[0].load().__name__ == "TfpipePlugin"


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
