"""Load shedding: a bound on the lookups a server process runs at once.

Without it a burst queued up (300 requests waited up to 12.7 s) and nothing was ever refused.
A lookup past ``retrieval.max_lookups_in_flight`` is refused at once, before it embeds,
searches or touches the session's memory, with a tool error that names the limit and says to
retry; the call recorder logs it like any other call. An admitted lookup therefore waits behind
at most the limit's other lookups, never behind a queue.

The same count tells whoever watches it (``InFlight.watch``: the console's page process) when
the process starts and stops serving lookups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

# What a refused caller is told to wait before retrying: about the time the admitted calls take.
RETRY_AFTER_S = 1


class ServerBusyError(RuntimeError):
    """The lookup was refused because the bound on lookups in flight was reached."""


Watcher = tuple[Callable[[], None], Callable[[], None]]  # called when lookups start, and when none runs


class InFlight:
    """The lookups running now. The event loop is the only writer, so no lock is needed."""

    def __init__(self) -> None:
        self.count = 0
        self._watchers: list[Watcher] = []

    def watch(self, busy: Callable[[], None], idle: Callable[[], None]) -> Callable[[], None]:
        """Call ``busy`` when a lookup starts beside none, ``idle`` when the last one ends; returns
        the call that stops watching. Both run on the event loop, inside the lookup, and must not
        raise."""
        watcher = (busy, idle)
        self._watchers.append(watcher)
        return lambda: self._watchers.remove(watcher)

    @contextmanager
    def admit(self, limit: int) -> Iterator[None]:
        """Run the block as one more lookup in flight, or raise ServerBusyError at once."""
        if self.count >= limit:
            raise ServerBusyError(
                f"server busy: {self.count} lookups are in flight, the limit "
                f"(retrieval.max_lookups_in_flight) is {limit}; nothing was looked up or counted "
                f"against this session: retry in about {RETRY_AFTER_S} s"
            )
        self.count += 1
        try:
            if self.count == 1:  # inside the try: the count is given back whatever a watcher does
                for busy, _ in self._watchers:
                    busy()
            yield
        finally:
            self.count -= 1
            if not self.count:
                for _, idle in self._watchers:
                    idle()
