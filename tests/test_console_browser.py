"""The web console in a real browser: headless Chromium from the system packages, through Selenium.

A real ``serve`` over streamable HTTP with a token answers a scripted set of lookups from two
MCP sessions; then every page is loaded, its numbers checked against the log, screenshotted
(into ``$CONSOLE_SCREENSHOTS`` as well, when set) and checked for console errors. Without a
browser (``scripts/install-chromium`` could not install one) the module skips, saying why.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.helpers import ROOT, cli_env, http_server

# A real serve subprocess driven through a real browser: end to end.
pytestmark = pytest.mark.slow

SAMPLE_DOCS = [
    p for p in (ROOT / "examples" / "knowledge").rglob("*") if p.suffix in (".md", ".markdown", ".txt")
]

CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and Path(p).exists()), None)
DRIVER = next(
    (p for p in (shutil.which("chromedriver"), "/usr/bin/chromedriver") if p and Path(p).exists()), None
)
if CHROMIUM is None or DRIVER is None:
    pytest.skip(
        "no headless Chromium: install the chromium and chromium-driver packages (scripts/install-chromium)",
        allow_module_level=True,
    )
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

TOKEN = "console-test-token-5c1e"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
UNANSWERED = [
    "How do I bake sourdough bread at home?",
    "What is the recipe for homemade sourdough bread?",
    "Steps to make sourdough bread",
]
SCRIPT_QUERY = "<script>alert('x')</script> parental leave rules"
SESSIONS = [["ERR_TIMEOUT 是什么", *UNANSWERED], [*UNANSWERED, "数据库连接池怎么配置", SCRIPT_QUERY]]
# Flags without which Chromium's background connections are refused on a closed network.
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,1000",
]


async def _lookups(url: str) -> None:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    for queries in SESSIONS:
        async with (
            create_mcp_http_client(headers=AUTH) as http,
            Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
        ):
            for query in queries:
                with anyio.fail_after(120):
                    result = await client.call_tool("lookup_knowledge", {"query": query})
                assert not result.is_error, result


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[tuple[str, Path]]:
    """(console URL, log path) of a serve process whose log holds the scripted lookups."""
    data_dir = tmp_path_factory.mktemp("console") / "data"
    shutil.copytree(sample_template, data_dir)
    env = cli_env(data_dir) | {"LOOKUP_KNOWLEDGE_AUTH_TOKEN": TOKEN}
    with http_server(env) as (port, _):
        anyio.run(_lookups, f"http://127.0.0.1:{port}/mcp")
        yield f"http://127.0.0.1:{port}/console", data_dir / "log.sqlite"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in [*FLAGS, f"--user-data-dir={tempfile.mkdtemp(prefix='chromium-')}"]:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(180)
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": AUTH})
    try:
        yield driver
    finally:
        driver.quit()


def scalar(log: Path, sql: str) -> Any:
    conn = sqlite3.connect(f"{log.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.close()


def load(browser: Any, url: str, name: str, tmp_path: Path) -> Any:
    """Load a page, screenshot it, and check it ran no script and logged no console error."""
    browser.get(url)
    # The first gap report of a window is built in the background; its pages reload until it is.
    WebDriverWait(browser, 300, poll_frequency=0.5).until(lambda d: not d.find_elements(By.ID, "pending"))
    shots = [tmp_path / f"{name}.png"]
    if os.environ.get("CONSOLE_SCREENSHOTS"):
        shots.append(Path(os.environ["CONSOLE_SCREENSHOTS"]) / f"console-{name}.png")
    for shot in shots:
        assert browser.save_screenshot(str(shot)), shot
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert errors == [], errors
    assert browser.find_elements(By.TAG_NAME, "script") == []
    return browser


def cell(browser: Any, row: int, column: int) -> str:
    return str(
        browser.find_element(By.CSS_SELECTOR, f"table tbody tr:nth-child({row}) td:nth-child({column})").text
    )


def test_the_overview_shows_the_calls_lookups_and_sessions_of_the_log(
    served: tuple[str, Path], browser: Any, tmp_path: Path
) -> None:
    url, log = served
    page = load(browser, f"{url}?since=all", "overview", tmp_path)
    assert page.title.startswith("Overview")
    calls = scalar(log, "SELECT COUNT(*) FROM tool_invocation")
    lookups = scalar(log, "SELECT COUNT(*) FROM tool_invocation WHERE tool_name = 'lookup_knowledge'")
    sessions = scalar(
        log, "SELECT COUNT(DISTINCT session_key) FROM tool_invocation WHERE session_key IS NOT NULL"
    )
    assert page.find_element(By.CSS_SELECTOR, "#calls b").text == str(calls)
    assert (
        page.find_element(By.CSS_SELECTOR, "#lookups b").text == str(lookups) == str(sum(map(len, SESSIONS)))
    )
    assert page.find_element(By.CSS_SELECTOR, "#sessions b").text == str(sessions) == "2"
    assert len(page.find_elements(By.CSS_SELECTOR, "svg")) == 3


def test_the_gaps_page_ranks_the_unanswered_question_first_and_expands_to_its_questions(
    served: tuple[str, Path], browser: Any, tmp_path: Path
) -> None:
    url, _ = served
    page = load(browser, f"{url}/gaps?since=all", "gaps", tmp_path)
    assert (cell(page, 1, 1), cell(page, 1, 2), cell(page, 1, 3)) == ("1", "6", "2")
    assert all(question in cell(page, 1, 4) for question in UNANSWERED)
    group = page.find_element(By.ID, "group-1")
    group.find_element(By.TAG_NAME, "summary").click()
    asked = [row.text for row in group.find_elements(By.CSS_SELECTOR, "tbody tr td:nth-child(2)")]
    assert sorted(asked) == sorted(UNANSWERED * 2)


def test_the_documents_page_counts_deliveries_as_the_log_does_and_sorts_without_script(
    served: tuple[str, Path], browser: Any, tmp_path: Path
) -> None:
    url, log = served
    page = load(browser, f"{url}/documents?since=all", "documents", tmp_path)
    delivered = scalar(
        log,
        "SELECT COUNT(*) FROM tool_invocation, json_each(result_doc_keys) j"
        " WHERE tool_name = 'lookup_knowledge' AND j.value = 'error-codes/err-timeout.md'",
    )
    rows = {
        r.find_element(By.CSS_SELECTOR, "td").text: r
        for r in page.find_elements(By.CSS_SELECTOR, "table#documents tbody tr")
    }
    assert (
        rows["error-codes/err-timeout.md"].find_elements(By.TAG_NAME, "td")[2].text == str(delivered) != "0"
    )
    page.find_element(By.LINK_TEXT, "doc key").click()
    keys = [
        r.find_element(By.CSS_SELECTOR, "td").text
        for r in page.find_elements(By.CSS_SELECTOR, "table#documents tbody tr")
    ]
    assert keys == sorted(keys, reverse=True) and len(keys) == len(SAMPLE_DOCS)


def test_the_sessions_page_lists_each_session_and_shows_a_script_query_as_text(
    served: tuple[str, Path], browser: Any, tmp_path: Path
) -> None:
    url, log = served
    page = load(browser, f"{url}/sessions?since=all", "sessions", tmp_path)
    listed = page.find_elements(By.CSS_SELECTOR, "table#sessions tbody tr")
    assert len(listed) == scalar(
        log, "SELECT COUNT(DISTINCT session_key) FROM tool_invocation WHERE session_key IS NOT NULL"
    )
    for summary in page.find_elements(By.TAG_NAME, "summary"):
        summary.click()
    assert SCRIPT_QUERY in page.find_element(By.TAG_NAME, "main").text
    assert "&lt;script&gt;" in page.page_source and page.execute_script("return window.__x === undefined")


def test_the_knowledge_map_lists_the_domains(served: tuple[str, Path], browser: Any, tmp_path: Path) -> None:
    url, _ = served
    page = load(browser, f"{url}/map?since=all", "map", tmp_path)
    domains = [cell(page, i, 1) for i in range(1, 6)]
    assert domains == ["api", "error-codes", "infrastructure", "onboarding", "troubleshooting"]


def test_pages_refuse_a_request_without_the_token(served: tuple[str, Path], browser: Any) -> None:
    url, _ = served
    for path in ("", "/gaps", "/documents", "/sessions", "/map"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}{path}", timeout=30)
        assert refused.value.code == 401
    browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
    try:
        browser.get(f"{url}/gaps")
        assert "unauthorized" in browser.page_source and "sourdough" not in browser.page_source
    finally:
        browser.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": AUTH})
