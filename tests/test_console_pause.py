"""A console page waits for a pause in the serving process's lookups before it starts and before it
answers, for at most MAX_WAIT_S at each turn: the lookups never wait for a page."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import anyio
import httpx
import pytest

from server.config.settings import Settings
from server.console import pause as pause_module
from server.console.app import Console, console_app
from server.console.pause import PAUSE_S, LookupPause
from server.protocol.admission import InFlight
from tests.test_console_pages import write_log


def _watched() -> tuple[InFlight, LookupPause]:
    lookups, pause = InFlight(), LookupPause()
    lookups.watch(pause.busy, pause.idle)
    return lookups, pause


def test_with_no_lookup_ever_run_a_page_does_not_wait() -> None:
    async def run() -> None:
        waiting = LookupPause().wait()
        with pytest.raises(StopIteration):
            waiting.send(None)  # finished without suspending once

    anyio.run(run)


def test_a_page_waits_for_the_lookup_in_flight_then_for_a_pause_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pause_module, "MAX_WAIT_S", 60.0)  # only the lookup can end the wait here
    lookups, pause = _watched()

    async def run() -> None:
        with lookups.admit(4):
            waiting = asyncio.create_task(pause.wait())
            await asyncio.sleep(PAUSE_S * 5)
            assert not waiting.done()
        ended = time.monotonic()
        with anyio.fail_after(10):
            await waiting
        assert time.monotonic() - ended >= PAUSE_S

    anyio.run(run)


def test_lookups_that_never_pause_delay_a_page_by_the_bound_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pause_module, "MAX_WAIT_S", 0.2)
    lookups, pause = _watched()

    async def run() -> None:
        with lookups.admit(4):
            started = time.monotonic()
            with anyio.fail_after(10):
                await pause.wait()
            assert time.monotonic() - started >= 0.2

    anyio.run(run)


async def _no_runtime() -> Any:
    raise AssertionError("the sessions page needs no retrieval stack")


def test_a_page_asked_for_during_a_lookup_is_answered_after_it(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pause_module, "MAX_WAIT_S", 60.0)
    write_log(settings.log_path)
    lookups = InFlight()
    console = Console(settings.log_path, lambda: settings, _no_runtime, lookups)
    transport = httpx.ASGITransport(app=console_app(console))

    async def run() -> None:
        async with console.running(), httpx.AsyncClient(transport=transport, base_url="http://x") as http:
            address = "/console/sessions?since=all"
            with anyio.fail_after(120):
                assert (await http.get(address)).status_code == 200  # now in the page cache
            with lookups.admit(4):
                # Answered from this process's cache, with no page process to hold: only the
                # wait can keep it back.
                page = asyncio.create_task(http.get(address))
                await asyncio.sleep(0.3)
                assert not page.done()
            with anyio.fail_after(120):
                response = await page
            assert response.status_code == 200
            assert "leave" in response.text

    anyio.run(run)
