"""A user in headless Chromium logs in, opens the evaluate task, clicks "Run report" and sees it, plots drawn."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from urllib.parse import quote

import pytest

from tests.airflow_servers import PASSWORDS
from tests.conftest import NETWORK_CHANGED, chromium_path
from tests.ui.conftest import DAG_ID

pytestmark = pytest.mark.integration

#: Fresh browsers a scenario gets when a network change aborted a load (``NETWORK_CHANGED``: a
#: TensorBoard data request can be the one aborted); any other failure fails at once.
TRIES = 3


def _login_as_mlviewer(page, server) -> None:
    """Log ``page`` in as ``mlviewer`` through the simple auth manager's own form."""
    page.goto(f"{server.url}/auth/login")
    page.locator("input[name=username]").fill("mlviewer")
    page.locator("input[name=password]").fill(PASSWORDS["mlviewer"])
    page.locator("button[type=submit]").click()
    page.wait_for_url(lambda url: "/auth/login" not in url)


def _as_mlviewer(server, scenario: Callable) -> None:
    """Run ``scenario(page)`` in headless Chromium logged in as ``mlviewer``.

    A try that failed while Chromium reported a load aborted by a network change (in the error or
    in any request of the page) runs again in a fresh browser, up to ``TRIES`` times: the change is
    the host's, not the product's. Each retry is a warning in the run's summary. Any other failure,
    and the last try's, is raised as it is.
    """
    from playwright.sync_api import sync_playwright

    for attempt in range(1, TRIES + 1):
        aborted: list[str] = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_path(), args=[
                "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
            try:
                page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
                page.set_default_timeout(60_000)
                page.on("requestfailed", lambda r: aborted.append(r.url) if r.failure == NETWORK_CHANGED else None)
                _login_as_mlviewer(page, server)
                scenario(page)
                return
            except Exception as error:
                if attempt == TRIES or not (aborted or NETWORK_CHANGED in str(error)):
                    raise
                warnings.warn(f"Chromium: {NETWORK_CHANGED} on try {attempt} ({aborted or error}); "
                              "again in a fresh browser", stacklevel=2)
            finally:
                browser.close()


def _click_extra_link(page, server, run_id: str, task_id: str, name: str) -> None:
    """Open the task instance's Details tab (where Airflow's UI lists extra links) and click ``name``."""
    page.goto(f"{server.url}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/{task_id}/details")
    link = page.get_by_role("link", name=name)
    link.wait_for()
    # a same-origin link opens in the same tab (Airflow's UI gives others target=_blank)
    link.click()


def test_run_report_link_opens_the_report_with_its_plots(ui_run):
    server, run_id = ui_run["server"], ui_run["summary"]["run_id"]

    def scenario(page):
        _click_extra_link(page, server, run_id, "evaluate", "Run report")
        page.wait_for_url("**/report/")
        page.wait_for_load_state("load")
        assert f"/tfpipe/runs/{DAG_ID}/" in page.url and page.url.endswith("/report/")
        assert run_id in page.content()
        widths = page.evaluate("Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0)")
        assert len(widths) >= 3 and all(w > 0 for w in widths), f"plots not rendered: {widths}"

    _as_mlviewer(server, scenario)


def test_tensorboard_link_opens_tensorboard_with_the_run_s_scalars(ui_run):
    """The train task's "TensorBoard" link: TensorBoard's own app loads through the plugin and draws
    the run's scalar charts (every asset and data request goes through the engine)."""
    server, run_id = ui_run["server"], ui_run["summary"]["run_id"]

    def scenario(page):
        failed: list[str] = []
        page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        _click_extra_link(page, server, run_id, "train", "TensorBoard")
        page.wait_for_url("**/tensorboard/**", timeout=120_000)
        # TensorBoard's scalars dashboard names every tag it found in the run's event files
        for tag in ("val_accuracy", "loss"):
            page.get_by_text(tag, exact=True).first.wait_for(timeout=300_000)
        assert not [f for f in failed if "/tfpipe/" in f], failed
        # every asset and data request of TensorBoard's page (its fonts too) went to the api-server,
        # through the plugin: the page's own record of what it loaded, whenever each load started
        requested = page.evaluate("() => performance.getEntriesByType('resource').map(e => e.name)")
        plugin = f"{server.url}/tfpipe/runs/"
        assert any("/tensorboard/data/" in url for url in requested), requested
        assert [url for url in requested
                if not (url.startswith(plugin) and "/tensorboard" in url) and not url.startswith(("data:", "blob:"))] \
            == [], requested

    _as_mlviewer(server, scenario)
