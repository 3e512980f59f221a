"""A one-line progress bar for long CLI work (ingest), on stderr."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable


class ProgressBar:
    """A one-line progress bar with an ETA on a TTY stderr; silent otherwise."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._clock = clock
        self._started: float | None = None
        self._first_done = 0

    def __call__(self, done: int, total: int, current: str) -> None:
        if not self.enabled or total <= 0:
            return
        if self._started is None:
            # The first report arrives once the first batch is embedded, with no start time before
            # it: the rate (and so the ETA) is measured from this report on.
            self._started = self._clock()
            self._first_done = done
        width = 30
        filled = int(width * done / total)
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} chunks  "
            f"{self.eta(done, total):<10} {current[:40]:<40}"
        )
        sys.stderr.flush()

    def eta(self, done: int, total: int) -> str:
        """Time left at the rate since the first report: chunks embedded per second so far."""
        if self._started is None or done <= self._first_done:
            return "ETA --"
        rate = (done - self._first_done) / max(self._clock() - self._started, 1e-9)
        left = int((total - done) / rate)
        return f"ETA {left // 60}m{left % 60:02d}s"

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
