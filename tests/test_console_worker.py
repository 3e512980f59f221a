"""Served beside /mcp, the console builds the gaps, documents and map pages (and the gap report
behind them) in its page process, not in the serving process; and a burst of page requests
beyond the cap is refused at once with 503 and Retry-After, without building anything."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from starlette.testclient import TestClient

from server.config.loading import load_settings
from server.console import app as console_module
from server.console.app import Console, console_app
from tests.test_console_pages import SCRIPT, _no_runtime, write_log


def _served(
    make_resources: Any, monkeypatch: pytest.MonkeyPatch, **overrides: Any
) -> tuple[Any, list[Console]]:
    """The app ``serve`` builds, and the console it made (captured)."""
    from server.protocol.app import create_server
    from server.transport import http_app

    made: list[Console] = []
    served = http_app.served_console

    def capture(resources: Any) -> Console:
        made.append(served(resources))
        return made[-1]

    monkeypatch.setattr(http_app, "served_console", capture)
    resources = make_resources(overrides=overrides)
    write_log(resources.settings.log_path)
    app = http_app.build_http_app(
        create_server(resources), resources, resources.settings, transport="streamable-http"
    )
    return app, made


def _built(client: TestClient, path: str) -> httpx.Response:
    """The page at ``path`` once its gap report is built (it says "pending" until then)."""
    deadline = time.monotonic() + 240
    while True:
        response = client.get(path)
        if 'id="pending"' not in response.text or time.monotonic() > deadline:
            return response
        time.sleep(0.3)


def test_served_the_report_pages_and_the_gap_report_are_built_in_the_page_process(
    make_resources: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, made = _served(make_resources, monkeypatch)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        gaps = _built(client, "/console/gaps?since=all")
        documents = client.get("/console/documents?since=all&sort=title")
        knowledge_map = client.get("/console/map?since=all")
        portal = client.portal
        assert portal is not None
        stats = portal.call(made[0].pages.stats)
    assert gaps.status_code == 200 and "&lt;script&gt;alert(" in gaps.text and "<script" not in gaps.text
    assert documents.status_code == 200 and knowledge_map.status_code == 200
    assert 'id="pending"' not in documents.text + knowledge_map.text
    # The serving process built no page itself; the page process built each, and embedded the
    # logged questions with an embedder of its own.
    assert made[0].built_here == 0
    assert stats["pid"] != os.getpid()
    assert {"gaps", "documents", "map"} <= set(stats["built"]) and stats["embedder_loaded"]


def test_served_with_queries_not_logged_the_page_process_shows_no_question_text(
    make_resources: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, made = _served(make_resources, monkeypatch, log={"log_queries": False})
    with TestClient(app, base_url="http://127.0.0.1") as client:
        gaps = _built(client, "/console/gaps?since=all")
        portal = client.portal
        assert portal is not None
        stats = portal.call(made[0].pages.stats)
    assert gaps.status_code == 200 and "not logged" in gaps.text
    assert "alert" not in gaps.text and SCRIPT not in gaps.text
    assert made[0].built_here == 0 and stats["built"].get("gaps") == 1
    assert not stats["embedder_loaded"]  # no question is embedded when none may be shown


def test_a_burst_beyond_the_cap_is_refused_at_once_with_retry_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings(None, data_dir=tmp_path)
    console = Console(settings.log_path, lambda: settings, _no_runtime)
    gate = asyncio.Event()
    building: list[int] = [0, 0]  # now, most at once

    async def slow_page(name: str, *args: object) -> str:
        building[0] += 1
        building[1] = max(building)
        try:
            await gate.wait()
            return f"<p>{name}</p>"
        finally:
            building[0] -= 1

    monkeypatch.setattr(console._log_pages, "page", slow_page)
    cap = console_module.PAGES_IN_FLIGHT + console_module.PAGES_WAITING
    burst = cap + 2

    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=console_app(console))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            # Each at an address of its own: the page cache answers none of them.
            tasks = [asyncio.create_task(client.get(f"/console?since=all&n={i}")) for i in range(burst)]
            with anyio.fail_after(30):
                while sum(task.done() for task in tasks) < burst - cap:
                    await asyncio.sleep(0.01)
                refused = [task.result() for task in tasks if task.done()]
                assert building == [1, 1]  # the admitted ones wait; one is built
                gate.set()
                return refused + [r for r in await asyncio.gather(*tasks) if r not in refused]

    responses = anyio.run(run)
    refused, served = responses[: burst - cap], responses[burst - cap :]
    assert [r.status_code for r in refused] == [503] * (burst - cap)
    assert all(r.headers["retry-after"] == str(console_module.RETRY_AFTER_S) for r in refused)
    assert all('id="busy"' in r.text and r.headers["cache-control"] == "no-store" for r in refused)
    assert [r.status_code for r in served] == [200] * cap
    assert building[1] == 1  # never two pages built at once


_OWNER = """
import asyncio, time
from server.console.builder import PageProcess

if __name__ == "__main__":
    pages = PageProcess()
    pages.start()
    print(asyncio.run(pages.pid()), flush=True)
    time.sleep(600)
"""


def test_a_page_process_whose_serving_process_is_killed_exits_by_itself(tmp_path: Path) -> None:
    """Killed, the serving process cannot stop its worker: the worker notices and exits."""
    from tests.test_console_process import killed_owner_leaves_no_worker

    assert killed_owner_leaves_no_worker(tmp_path, _OWNER, held=False), (
        "the page process outlived its killed serving process"
    )
