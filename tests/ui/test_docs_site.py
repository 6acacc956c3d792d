"""The documentation site as a reader sees it: built, served over HTTP on loopback and opened in
headless Chromium, its navigation and search work on the home page and the configuration page."""

from __future__ import annotations

import functools
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.conftest import chromium_path
from tests.contract.test_docs_site import build_site

# MkDocs is in the main venv only; the docs do not change with the Airflow release
pytestmark = pytest.mark.docs


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002  (the base class's signature)
        pass  # one line per asset on stderr says nothing a failure would not


@pytest.fixture(scope="module")
def served_site(tmp_path_factory):
    """The built site behind Python's HTTP server on a free loopback port (search needs HTTP: its
    index is fetched by a web worker, which a file:// page may not start)."""
    site = tmp_path_factory.mktemp("docs-site")
    proc = build_site(site)
    assert proc.returncode == 0, proc.stderr[-4000:]
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox", "--disable-gpu"])
        try:
            yield browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        finally:
            browser.close()


def test_home_page_has_navigation_search_and_the_example(served_site, page, tmp_path):
    """The home page renders with the site's navigation (every section of the manual), a search box,
    and the example DAG file highlighted as code; a screenshot is kept as the test's artifact."""
    page.goto(f"{served_site}/", wait_until="load")
    assert page.title().startswith("tfpipe")
    nav = page.locator("nav.md-nav--primary")
    for label in ("Getting started", "Your pipeline", "GPUs", "Deploying", "Troubleshooting", "Configuration"):
        assert nav.get_by_text(label, exact=True).count() >= 1, label
    assert page.locator("[data-md-component=search] input.md-search__input").count() == 1
    assert "training_pipeline" in page.locator(".highlight code").first.inner_text()
    shot = tmp_path / "docs-home.png"
    page.screenshot(path=str(shot), full_page=False)
    assert shot.stat().st_size > 10_000


def test_configuration_page_is_reachable_from_the_nav_and_search_finds_pages(served_site, page, tmp_path):
    """From the home page the nav leads to the configuration reference, and typing in the search box
    lists pages from the site's own index (the search worker ran)."""
    page.goto(f"{served_site}/", wait_until="load")
    page.locator("nav.md-nav--primary a", has_text="Configuration").first.click()
    page.wait_for_url("**/reference/configuration/")
    assert page.locator("article h1").first.inner_text().strip()
    search = page.locator("input.md-search__input")
    search.click()
    # typed key by key: the theme searches on key events, which fill() does not send
    search.press_sequentially("gpu_fallback", delay=20)
    results = page.locator(".md-search-result__item")
    results.first.wait_for(state="visible", timeout=30_000)
    assert results.count() >= 1
    assert "/gpus/" in " ".join(results.locator("a").evaluate_all("links => links.map(a => a.href)"))
    page.screenshot(path=str(tmp_path / "docs-configuration-search.png"))
