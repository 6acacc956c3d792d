"""The ``tfpipe`` Airflow plugin (entry point group ``airflow.plugins``).

* ``fastapi_apps``: the run report and TensorBoard under the api-server at ``/tfpipe``
  (:mod:`tfpipe.plugins.app`, built on its first request);
* ``listeners``: the run note written when a tfpipe DAG run ends (:mod:`tfpipe.plugins.listener`).
"""

from __future__ import annotations

from airflow.providers.common.compat.sdk import AirflowPlugin

from tfpipe.plugins import listener
from tfpipe.plugins.app import LazyApp
from tfpipe.plugins.paths import URL_PREFIX


class TfpipePlugin(AirflowPlugin):
    """Serves run reports and TensorBoards, and writes run notes."""

    name = "tfpipe"
    fastapi_apps = [{"name": "tfpipe", "app": LazyApp(), "url_prefix": URL_PREFIX}]
    listeners = [listener]
