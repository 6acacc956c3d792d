"""The plugin's FastAPI app, mounted by the api-server at ``/tfpipe``: a run's report, its files and its TensorBoard.

Every route needs a user who may read the DAG's runs (Airflow's ``requires_access_dag``). Where a
run's files are comes from its location record in XCom, never from the request.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from tfpipe.plugins.paths import LOCATION_XCOM_KEY, REPORT_FILES, REPORT_HTML, parse_location


def login_url(auth_manager: Any, back_to: str) -> str:
    """The auth manager's login page, sending the browser back to ``back_to`` (added as ``next`` where
    the URL has none, as Airflow 3.0's simple auth manager drops it)."""
    url = auth_manager.get_url_login(next_url=back_to)
    query = urlsplit(url).query
    if "next" in parse_qs(query):
        return url
    return f"{url}{'&' if query else '?'}{urlencode({'next': back_to})}"


_MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".png": "image/png"}
# The report is one self-contained page (inline style, data: images): nothing else may load.
_REPORT_CSP = "default-src 'none'; img-src 'self' data:; style-src 'unsafe-inline'"
# TensorBoard's page names its Roboto font files from the server's root (``url(/font-roboto/...)``);
# behind this route that root is the api-server's, which has no such files.
_ROOT_FONTS = b"url(/font-roboto/"


def fonts_under_route(body: bytes, path: str) -> bytes:
    """TensorBoard's HTML at ``path`` (below the run's TensorBoard route) with its root-relative font
    URLs made relative, so the browser fetches the fonts through this route too."""
    return body.replace(_ROOT_FONTS, b"url(" + b"../" * path.count("/") + b"font-roboto/")


def read_location(dag_id: str, run_id: str) -> dict[str, str] | None:
    """The newest location record any task of the run pushed, or ``None``."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from tfpipe.compat import xcom_query

    with create_session() as session:
        query = xcom_query(session, run_id=run_id, dag_id=dag_id, key=LOCATION_XCOM_KEY)
        for row in session.scalars(query.order_by(XComModel.timestamp.desc())):
            location = parse_location(XComModel.deserialize_value(row))
            if location:
                return location
    return None


def create_app() -> FastAPI:
    """Build the FastAPI app (imports the api-server's security module: call it in the api-server)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    from tfpipe.plugins.run_access import TensorBoards, read_run_file

    app = FastAPI(title="tfpipe", docs_url=None, redoc_url=None, openapi_url=None)
    may_read_runs = [Depends(requires_access_dag("GET", DagAccessEntity.RUN))]
    tensorboards = TensorBoards()

    @app.exception_handler(StarletteHTTPException)
    async def login_for_browsers(request: Request, exc: StarletteHTTPException) -> Response:
        # A link clicked without a session lands on the login page and comes back, as Airflow's own pages do.
        if exc.status_code == 401 and "text/html" in request.headers.get("accept", ""):
            return RedirectResponse(login_url(get_auth_manager(), str(request.url)))
        return await http_exception_handler(request, exc)

    def location_or_404(dag_id: str, run_id: str) -> dict[str, str]:
        location = read_location(dag_id, run_id)
        if location is None:
            raise HTTPException(404, f"No tfpipe run {run_id!r} of DAG {dag_id!r}: no stage task of it recorded "
                                     "where its files are (none started yet, or it ran on the Kubernetes backend, "
                                     "whose volumes the plugin cannot read).")
        return location

    @app.get("/runs/{dag_id}/{run_id}/report/{name:path}", dependencies=may_read_runs)
    def report(dag_id: str, run_id: str, name: str) -> Response:
        name = name or REPORT_HTML  # the folder's own URL is the page: its plots resolve next to it
        if name not in REPORT_FILES:
            raise HTTPException(404, f"{name!r} is not a report file; the report has {', '.join(REPORT_FILES)}.")
        data = read_run_file(location_or_404(dag_id, run_id), dag_id, run_id, name)
        if data is None:
            raise HTTPException(404, f"No {name} for run {run_id!r} of DAG {dag_id!r} yet: the evaluate task "
                                     "writes the report when it ends.")
        headers = {"Cache-Control": "private, max-age=0"}
        if name == REPORT_HTML:
            headers["Content-Security-Policy"] = _REPORT_CSP
        return Response(data, media_type=_MEDIA_TYPES[name[name.rfind("."):]], headers=headers)

    @app.get("/runs/{dag_id}/{run_id}/tensorboard", dependencies=may_read_runs)
    def tensorboard_root(request: Request) -> Response:
        # TensorBoard's page loads its data with relative URLs: they need the trailing slash.
        return RedirectResponse(str(request.url.replace(path=request.url.path + "/")))

    @app.api_route("/runs/{dag_id}/{run_id}/tensorboard/{path:path}", methods=["GET", "POST"],
                   dependencies=may_read_runs)
    async def tensorboard(dag_id: str, run_id: str, path: str, request: Request) -> Response:
        from starlette.concurrency import run_in_threadpool

        location = await run_in_threadpool(location_or_404, dag_id, run_id)
        body = await request.body()
        try:
            answer = await run_in_threadpool(
                tensorboards.forward, location, dag_id, run_id, path, method=request.method,
                query=request.url.query, body=body, content_type=request.headers.get("content-type", ""))
        except RuntimeError as err:
            raise HTTPException(502, f"TensorBoard for run {run_id!r} of DAG {dag_id!r}: {err}") from err
        if answer.status == 0:
            raise HTTPException(504, f"TensorBoard for run {run_id!r} of DAG {dag_id!r} did not start in time.")
        headers = {k.lower(): v for k, v in answer.headers.items()}
        body = answer.body
        if headers.get("content-type", "").startswith("text/html") and \
                headers.get("content-encoding", "identity") == "identity":  # TensorBoard says identity
            body = fonts_under_route(body, path)
        return Response(body, status_code=answer.status, headers=answer.headers)

    return app
