"""The ``tfpipe`` Airflow plugin: the api-server app at ``/tfpipe`` and the run-note listener."""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import AirflowPlugin

from tfpipe.plugins import listener
from tfpipe.plugins.paths import URL_PREFIX


class LazyApp:
    """An ASGI app that builds :func:`create_app` on its first request: only the api-server serves any."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self._app is None:
            from tfpipe.plugins.app import create_app

            self._app = create_app()
        await self._app(scope, receive, send)


class TfpipePlugin(AirflowPlugin):
    """Serves run reports and TensorBoards, and writes run notes."""

    name = "tfpipe"
    fastapi_apps = [{"name": "tfpipe", "app": LazyApp(), "url_prefix": URL_PREFIX}]
    listeners = [listener]
