"""One ingest at a time on a shared catalog: a lease row in the catalog collection.

Milvus has no compare-and-swap, so the lease follows Fischer's timed mutual exclusion: read the
row; if it is free (absent, expired, or ours) write it, but only if the write landed within
``settle_s / 2`` of the read; wait ``settle_s``; read again and hold the lease only if it is still
ours. Two ingests that both read "free" both write; the one that wrote last wins, and the other
sees that when it reads back. The holder renews the row every third of ``ttl_s`` from a thread of
its own; an ingest killed without releasing it blocks others for at most ``ttl_s``. Expiry is
compared on wall clocks, so the machines' clocks must agree to well within ``ttl_s`` (NTP).

An ingest that finds it lost the lease (paused for longer than ``ttl_s``) stops before its next
write: LeaseLostError.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Protocol

from storage.shared_catalog import LEASE_ID

logger = logging.getLogger(__name__)


class LeaseLostError(RuntimeError):
    """Another ingest took the shared catalog's lease while this one held it."""


class MetaRows(Protocol):
    def meta(self, row_id: str) -> tuple[str, int] | None: ...

    def write_meta(self, row_id: str, data: str, seq: int) -> None: ...

    def delete_meta(self, row_id: str) -> None: ...


def holder_name() -> str:
    """Who holds a lease: host and process, and a nonce so two leases of one process differ."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class IngestLease:
    """The shared catalog's ingest lease, held between ``acquire`` and ``release``."""

    def __init__(
        self,
        rows: MetaRows,
        *,
        holder: str | None = None,
        ttl_s: float = 30.0,
        settle_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._rows = rows
        self.holder = holder or holder_name()
        self._ttl_s = ttl_s
        self._settle_s = settle_s
        self._clock = clock
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None
        self.lost = False
        self._expires = 0.0

    def _current(self) -> tuple[str, float] | None:
        found = self._rows.meta(LEASE_ID)
        if found is None:
            return None
        return str(json.loads(found[0])["holder"]), found[1] / 1000.0

    def _write(self) -> None:
        expires = self._clock() + self._ttl_s
        self._rows.write_meta(LEASE_ID, json.dumps({"holder": self.holder}), int(expires * 1000))
        self._expires = expires

    def _free(self, current: tuple[str, float] | None) -> bool:
        return current is None or current[0] == self.holder or current[1] < self._clock()

    def acquire(self) -> None:
        """Wait until this process holds the lease (an ingest of another machine finishes first)."""
        waiting_for: str | None = None
        while True:
            started = time.monotonic()
            current = self._current()
            if self._free(current):
                self._write()
                if time.monotonic() - started <= self._settle_s / 2:
                    time.sleep(self._settle_s)
                    current = self._current()
                    if current is not None and current[0] == self.holder:
                        break
            elif current is not None and current[0] != waiting_for:
                waiting_for = current[0]
                logger.info("the shared catalog's ingest lease is held by %s; waiting for it", waiting_for)
            time.sleep(self._settle_s)
        self._renewer = threading.Thread(target=self._renew, name="ingest-lease", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stop.wait(self._ttl_s / 3):
            try:
                current = self._current()
                if current is None or current[0] != self.holder:
                    self.lost = True
                    logger.error("the shared catalog's ingest lease was taken by %s", current and current[0])
                    return
                self._write()
            except Exception:  # Milvus unreachable: the lease may expire; check() reports that
                logger.exception("could not renew the shared catalog's ingest lease")

    def check(self) -> None:
        """Raise LeaseLostError when the lease is no longer this process's."""
        if self.lost or self._renewer is None or self._clock() >= self._expires:
            raise LeaseLostError(
                f"the shared catalog's ingest lease of {self.holder} was lost (held past {self._ttl_s:g}s "
                "without renewal, or taken by another ingest); this ingest stopped, run it again"
            )

    def release(self) -> None:
        """Stop renewing and delete the row, if it is still ours."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
            self._renewer = None
        current = self._current()
        if current is not None and current[0] == self.holder:
            self._rows.delete_meta(LEASE_ID)
