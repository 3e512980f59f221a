"""The serving process's own share of a page waits for a pause in the lookups: ``LookupPause``.

The page process is held stopped while lookups run (``builder.PageProcess.hold``), but a page
also costs the serving process something: the request's routing, the forwarding of its
arguments, and the response's bytes. That work ran on the event loop that serves the lookups,
beside their query embedding, whose OpenMP team wants both cores of a two-core machine: pages
answered from the page cache alone, with no page built at all, made lookups 9% slower at the
median (``bench/console_bench.py --what-costs``). So a page's handler starts, and sends its
response, only once no lookup has run for PAUSE_S, or after MAX_WAIT_S of lookups that never
pause: an agent's burst of calls goes first, and a busy server slows the pages but never stops
them.
"""

from __future__ import annotations

import asyncio
import math
import time

from server.console.builder import MAX_HOLD_S

# How long the lookups must have paused: longer than the gap between an agent's chained calls
# (a client answers and asks again within a few ms), far shorter than a person notices.
PAUSE_S = 0.01
# The longest a page waits at each of its two turns (its start, its response): the page process's
# own bound on being held stopped.
MAX_WAIT_S = MAX_HOLD_S


class LookupPause:
    """Told when lookups start beside none and when the last ends (``InFlight.watch``)."""

    def __init__(self) -> None:
        self._idle = asyncio.Event()  # made on the loop that serves: the console's lifespan
        self._idle.set()
        self._ended_at = -math.inf  # when the last lookup ended (time.monotonic)

    def busy(self) -> None:
        self._idle.clear()

    def idle(self) -> None:
        self._ended_at = time.monotonic()
        self._idle.set()

    async def wait(self) -> None:
        """Return once no lookup has run for PAUSE_S, or after MAX_WAIT_S."""
        deadline = time.monotonic() + MAX_WAIT_S
        while (left := deadline - time.monotonic()) > 0:
            if not self._idle.is_set():
                try:
                    await asyncio.wait_for(self._idle.wait(), left)
                except TimeoutError:
                    return
                continue
            paused = time.monotonic() - self._ended_at
            if paused >= PAUSE_S:
                return
            await asyncio.sleep(min(PAUSE_S - paused, left))
