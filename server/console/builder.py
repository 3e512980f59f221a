"""The console's log pages (overview, sessions), built in a process of their own.

Those two pages change with every row the server logs, so no cache can spare their work: the
log's running totals are brought up to date, a window is summarised, 50 sessions' calls are read
and the HTML and SVG are rendered. Done in the serving process, that work held its event loop and
its interpreter lock while lookups waited (lookup p95 80 -> 139 ms while pages loaded without
pause, docs/observability.md). ``PageProcess`` runs it in one spawned worker process instead,
started and stopped by the lifespan of the app that serves the console, at the idle CPU priority
(``SCHED_IDLE``; where that is refused, nice 19): it runs only on a core no lookup wants, so a
page waits for the lookups, never the other way round.

``LogPages`` is the work itself: the worker keeps one per log file (its running totals persist
between pages), and a console whose process is not running (a test's client without a lifespan)
keeps its own and builds on its event loop.

The worker is spawned, not forked (a fork would copy the serving process's threads, locks and
Milvus Lite state mid-use), so it imports this package afresh; like any spawned worker it also
re-imports the main module, which the entry points (``lookup-knowledge-mcp``, ``python -m ...``,
pytest) guard with ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from server.console import pages
from storage import usage_queries
from storage.log_digest import LogDigest, Overview
from storage.log_reads import log_position, read_only

logger = logging.getLogger(__name__)

SESSIONS_SHOWN = 100
SESSION_DETAILS = 50
# The worker's priority where SCHED_IDLE is refused. At nice 5 the worker still took a core
# from the lookups' thread team while pages loaded back to back (lookup p95 1.45x); at the idle
# priority the kernel runs it only when a core is free. The console's pages, at 10-70 ms of
# work each, still answer inside their 300 ms target on a server that is not saturated.
FALLBACK_NICENESS = 19


class PageProcessStopped(RuntimeError):
    """The worker process died (killed, out of memory); the next page starts a new one."""


class LogPages:
    """The overview and sessions pages of one log file, over running totals kept between pages."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._digest = LogDigest()

    async def digest(self) -> LogDigest:
        """The log's running totals, with the rows written since the last page folded in."""
        async with read_only(self.log_path) as conn:
            if await log_position(conn) < self._digest.last_id:  # the log was recreated
                self._digest = LogDigest()
            await self._digest.refresh(conn)
        return self._digest

    async def overview(self, label: str, since: float | None) -> str:
        if not self.log_path.exists():
            return pages.overview_page(Overview(bucket_seconds=3600), label)
        return pages.overview_page((await self.digest()).overview(since), label)

    async def sessions(self, label: str, since: float | None, show_queries: bool) -> str:
        if not self.log_path.exists():
            return pages.sessions_page([], {}, label, show_queries)
        rows = (await self.digest()).active_sessions(since, SESSIONS_SHOWN)
        async with read_only(self.log_path) as conn:
            calls = await usage_queries.session_calls(conn, [s.session_key for s in rows[:SESSION_DETAILS]])
        return pages.sessions_page(rows, calls, label, show_queries)


# -- in the worker process ------------------------------------------------------------
_loop: asyncio.AbstractEventLoop | None = None
_logs: dict[Path, LogPages] = {}


def _start_worker(idle: bool) -> None:
    global _loop
    if idle:
        _lower_priority()
    # One loop for the worker's life: the aiosqlite reads and the digest's lock live on it.
    _loop = asyncio.new_event_loop()


def _build(log_path: Path, page: str, args: tuple[Any, ...]) -> str:
    if _loop is None:  # pragma: no cover - the pool's initializer always runs first
        raise RuntimeError("the console's page process was not started")
    log = _logs.setdefault(log_path, LogPages(log_path))
    build: Callable[..., Awaitable[str]] = getattr(log, page)
    return _loop.run_until_complete(build(*args))


def _lower_priority() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or refused: the lowest nice value instead
        os.nice(FALLBACK_NICENESS)


def _pid() -> int:
    return os.getpid()


# -- in the serving process -----------------------------------------------------------
class PageProcess:
    """One worker process that builds log pages, one page at a time; ``start`` and ``close`` it."""

    def __init__(self, *, idle: bool = True) -> None:
        self.idle = idle
        self._pool: ProcessPoolExecutor | None = None
        self._wanted = False  # between start() and close(): a worker that died is replaced
        # One build at a time: a burst of console requests queues here, and the worker never
        # runs more than one page beside the lookups.
        self._one = asyncio.Semaphore(1)

    @property
    def running(self) -> bool:
        """Started and not closed (a worker that died is replaced by the next page)."""
        return self._wanted

    def start(self) -> None:
        """Spawn the worker now (in the background), so the first page does not wait for it."""
        self._wanted = True
        self._pool = ProcessPoolExecutor(
            max_workers=1,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start_worker,
            initargs=(self.idle,),
        )
        self._pool.submit(_pid)

    def close(self) -> None:
        """Stop the worker (waiting for a page in progress) and forget it."""
        self._wanted = False
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    async def pid(self) -> int:
        """The worker's process id (it is started if it is not running)."""
        return int(await self._submit(_pid))

    async def build(self, log_path: Path, page: str, *args: Any) -> str:
        """The page ``page`` (a ``LogPages`` method) of the log at ``log_path``, built by the worker."""
        return str(await self._submit(_build, log_path, page, args))

    async def _submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        async with self._one:
            if self._pool is None and self._wanted:
                self.start()
            pool = self._pool
            if pool is None:
                raise PageProcessStopped("the console's page process is not running")
            try:
                return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
            except BrokenProcessPool as exc:
                # The worker died: this page says so; the next one starts a new worker.
                logger.error("the console's page process stopped: %s", exc)
                if self._pool is pool:
                    self._pool = None
                    pool.shutdown(wait=False, cancel_futures=True)
                raise PageProcessStopped("the console's page process stopped") from exc
