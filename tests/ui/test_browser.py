"""A user in headless Chromium logs in, opens the evaluate task, clicks "Run report" and sees it, plots drawn."""

from __future__ import annotations

import shutil
from urllib.parse import quote

import pytest

from tests.ui.conftest import DAG_ID, PASSWORDS

pytestmark = pytest.mark.integration


def test_run_report_link_opens_the_report_with_its_plots(ui_run):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        pytest.skip("no chromium on PATH (scripts/ensure-chromium.sh installs Debian's as root)")
    from playwright.sync_api import sync_playwright

    server, run_id = ui_run["server"], ui_run["summary"]["run_id"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            page.set_default_timeout(60_000)
            # log in through the simple auth manager's own form
            page.goto(f"{server.url}/auth/login")
            page.locator("input[name=username]").fill("mlviewer")
            page.locator("input[name=password]").fill(PASSWORDS["mlviewer"])
            page.locator("button[type=submit]").click()
            page.wait_for_url(lambda url: "/auth/login" not in url)
            # the evaluate task instance of the run; Airflow's UI lists extra links on its Details tab
            page.goto(f"{server.url}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}/tasks/evaluate/details")
            link = page.get_by_role("link", name="Run report")
            link.wait_for()
            # a same-origin link opens in the same tab (Airflow's UI gives others target=_blank)
            link.click()
            page.wait_for_url("**/report/")
            page.wait_for_load_state("load")
            report = page
            assert f"/tfpipe/runs/{DAG_ID}/" in report.url and report.url.endswith("/report/")
            assert run_id in report.content()
            widths = report.evaluate("Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0)")
            assert len(widths) >= 3 and all(w > 0 for w in widths), f"plots not rendered: {widths}"
        finally:
            browser.close()
