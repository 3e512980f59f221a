"""While the serving process runs a lookup, the console's page process is held stopped: it cannot
take CPU the lookup wants, even at its idle priority. It resumes when the last lookup ends (or
after MAX_HOLD_S), a server closing with it held does not hang, and held it still dies with a
killed serving process."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp import Client
from mcp_types import RequestParamsMeta

from retrieval.service import LookupService
from server.console import builder
from server.console.builder import PageProcess
from server.protocol.admission import InFlight
from tests.test_console_process import _wait_gone, killed_owner_leaves_no_worker, stopped_within


def _running(pid: int, seconds: float = 0.25) -> bool:
    """The process is not stopped, or no longer within ``seconds``."""
    deadline = time.monotonic() + seconds
    while stopped_within(pid, seconds=0):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_watchers_hear_when_lookups_start_beside_none_and_when_the_last_ends() -> None:
    lookups = InFlight()
    heard: list[str] = []
    unwatch = lookups.watch(lambda: heard.append("busy"), lambda: heard.append("idle"))
    with lookups.admit(4):
        with lookups.admit(4):
            assert heard == ["busy"]
        assert heard == ["busy"]  # one still runs
    assert heard == ["busy", "idle"]
    unwatch()
    with lookups.admit(4):
        pass
    assert heard == ["busy", "idle"]


def test_a_failing_watcher_leaves_no_lookup_counted_in_flight() -> None:
    lookups = InFlight()

    def fail() -> None:
        raise RuntimeError("watcher failed")

    lookups.watch(fail, lambda: None)
    with pytest.raises(RuntimeError, match="watcher failed"), lookups.admit(4):
        pass
    assert lookups.count == 0


def test_a_served_lookup_holds_the_page_process_stopped_until_it_ends(
    make_resources: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server.protocol.app import create_server
    from server.transport.http_app import served_console

    resources = make_resources()
    seen: list[bool] = []
    pid = 0  # the page process's, once started
    lookup = LookupService.lookup

    async def observed(self: LookupService, *args: Any, **kwargs: Any) -> Any:
        seen.append(stopped_within(pid))
        return await lookup(self, *args, **kwargs)

    monkeypatch.setattr(LookupService, "lookup", observed)

    async def run() -> None:
        nonlocal pid
        console = served_console(resources)
        async with console.running():
            with anyio.fail_after(120):
                pid = await console.pages.pid()
            async with Client(create_server(resources), mode="legacy") as client:
                for query in ("Kafka consumer lag", "how do I rotate the API keys"):
                    meta = cast(RequestParamsMeta, {"session_id": "held"})
                    result = await client.call_tool("lookup_knowledge", {"query": query}, meta=meta)
                    assert not result.is_error
                    assert _running(pid)  # resumed once the lookup ended
            with anyio.fail_after(60):
                assert (await console.pages.stats())["pid"] == pid  # and it still answers

    anyio.run(run)
    assert seen == [True, True]


def test_a_hold_ends_by_itself_after_its_bound_and_close_resumes_a_held_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(builder, "MAX_HOLD_S", 0.3)
    pages = PageProcess()

    async def run() -> None:
        pages.start()
        with anyio.fail_after(120):
            pid = await pages.pid()
        pages.hold()
        assert stopped_within(pid)
        await asyncio.sleep(0.6)  # lookups that never end do not starve the pages
        assert _running(pid)
        pages.hold()
        assert stopped_within(pid)
        with anyio.fail_after(60):
            await asyncio.to_thread(pages.close)  # would wait for ever on a stopped worker
        assert _wait_gone(pid, seconds=30)

    try:
        anyio.run(run)
    finally:
        pages.close()


_OWNER = """
import asyncio, time
from server.console.builder import PageProcess

async def main():
    pages = PageProcess()
    pages.start()
    pid = await pages.pid()
    pages.hold()
    print(pid, flush=True)
    time.sleep(600)

if __name__ == "__main__":
    asyncio.run(main())
"""


def test_a_held_page_process_dies_with_its_killed_serving_process(tmp_path: Path) -> None:
    """Stopped, the worker runs no check of its own: the kernel kills it with its parent."""
    assert killed_owner_leaves_no_worker(tmp_path, _OWNER, held=True), (
        "a held page process outlived its killed serving process"
    )
