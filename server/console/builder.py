"""The console's page process, as the serving process sees it: ``PageProcess``.

Every console page and the gap report behind the gaps, documents and map pages are built in one
spawned worker process (``server.console._worker``), started and stopped by the lifespan of the
app that serves the console, at the idle CPU priority (``SCHED_IDLE``; where that is refused,
nice 19). Built in the serving process, the pages held its event loop and its interpreter lock
while lookups waited (docs/observability.md), and the gap report's first build (embedding every
logged question: tens of seconds of CPU over a large log) competed with them outright.

The idle priority is not enough on its own: on a machine of two virtual cores, a process at
``SCHED_IDLE`` that only burns CPU still made lookups 12% slower at the median and 37% at the
95th percentile (``bench/console_bench.py --what-costs``), as the cores it runs on share what
lies below the scheduler. So while the serving process runs a lookup the worker is held stopped
(``hold``: SIGSTOP, then SIGCONT when the last lookup ends), for at most MAX_HOLD_S at a time, so
that lookups that never stop overlapping slow the pages down but cannot starve them. A page
waits for the lookups, never the other way round. The worker is killed by the kernel if the
serving process dies while it is held (``_worker.start``).
The serving process forwards a page's arguments and sends back the bytes; its one other piece
of work is the store searches of a report build (each group's nearest document), which the
worker cannot run because the serving process holds the store.

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
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np

from server.console import _worker
from server.console._worker import Answer, Asked, ReportSpec
from server.gap_report import Hits

logger = logging.getLogger(__name__)

Search = Callable[[np.ndarray], Hits]  # one centre's hits in the store (blocking)
# Between two of a report build's store searches in the serving process (one per gap group):
# the searches share this process's interpreter with the lookups, so they are spread out.
SEARCH_PAUSE_S = 0.02
# The longest the worker is held stopped while lookups run: past it, lookups that keep overlapping
# let it build again (at its idle priority), so a busy server slows the pages but never stops them.
MAX_HOLD_S = 0.5


class PageProcessStopped(RuntimeError):
    """The worker process died (killed, out of memory); the next page starts a new one."""


class PageProcess:
    """One worker process that builds the console's pages, one at a time; ``start`` and ``close`` it."""

    def __init__(self, *, idle: bool = True) -> None:
        self.idle = idle
        self._pool: ProcessPoolExecutor | None = None
        self._wanted = False  # between start() and close(): a worker that died is replaced
        # One call at a time: the worker never builds more than one page beside the lookups.
        self._one = asyncio.Semaphore(1)
        self._searching: set[asyncio.Task[None]] = set()
        self._pid: int | None = None  # the worker's, once it answered its first call
        self._release: asyncio.TimerHandle | None = None  # set while the worker is held stopped

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
            initializer=_worker.start,
            initargs=(self.idle,),
        )
        self._pool.submit(_worker.stats).add_done_callback(self._learn_pid)

    def _learn_pid(self, first: Any) -> None:
        # On the pool's thread; the loop reads the attribute, set at once.
        if not first.cancelled() and first.exception() is None:
            self._pid = int(first.result()["pid"])

    def hold(self) -> None:
        """Stop the worker while lookups run (``InFlight.watch``), for at most MAX_HOLD_S."""
        if self._release is not None or self._pid is None or not self._wanted:
            return
        if self._signal(signal.SIGSTOP):
            self._release = asyncio.get_running_loop().call_later(MAX_HOLD_S, self.release)

    def release(self) -> None:
        """Let the worker run again (when no lookup runs, or after MAX_HOLD_S of them)."""
        release, self._release = self._release, None
        if release is not None:
            release.cancel()
            self._signal(signal.SIGCONT)

    def _signal(self, signum: int) -> bool:
        pid = self._pid
        if pid is None:
            return False
        try:
            os.kill(pid, signum)
        except OSError:  # the worker is gone: the next page starts a new one
            self._pid = None
            return False
        return True

    def close(self) -> None:
        """Stop the worker (waiting for a page in progress) and forget it."""
        self._wanted = False
        if self._release is not None:  # a stopped worker would never finish its page
            self._signal(signal.SIGCONT)
        self._pid = None
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    async def settle(self) -> None:
        """Cancel the store searches still running for the worker (before ``close``)."""
        tasks = list(self._searching)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def pid(self) -> int:
        """The worker's process id (it is started if it is not running)."""
        return int((await self.stats())["pid"])

    async def stats(self) -> dict[str, Any]:
        """The worker's id, memory (kB), CPU time and pages built, by name."""
        return dict(await self._submit(_worker.stats))

    async def build(self, log_path: Path, page: str, *args: Any) -> str:
        """The overview or sessions page (``LogPages.page``) of the log at ``log_path``."""
        return str(await self._submit(_worker.log_page, log_path, page, args))

    async def report_page(self, spec: ReportSpec, page: str, search: Search, *args: Any) -> str | None:
        """A report page (``ReportPages.page``), None while its report is pending.

        The store searches the worker asks for with the page are run here in the background,
        paced (SEARCH_PAUSE_S apart), and their hits sent back: the page does not wait for them.
        """
        body, asked = await self._submit(_worker.report_page, spec, page, args)
        if asked:
            task = asyncio.create_task(self._answer(asked, search))
            self._searching.add(task)
            task.add_done_callback(self._searching.discard)
        return None if body is None else str(body)

    async def _answer(self, asked: Sequence[Asked], search: Search) -> None:
        answers: list[Answer] = [(ask, await self._searched(centres, search)) for ask, centres in asked]
        try:
            await self._submit(_worker.answer, answers)
        except PageProcessStopped:  # the worker died or the server stops: its builds went with it
            logger.info("the gap report's searches were not delivered: the page process stopped")

    @staticmethod
    async def _searched(centres: Sequence[list[float]], search: Search) -> list[Hits] | None:
        """Each centre's hits, or None when the store failed (that build fails, the next retries)."""
        hits: list[Hits] = []
        for centre in centres:
            try:
                hits.append(await asyncio.to_thread(search, np.asarray(centre, dtype=np.float32)))
            except Exception:  # the top of a background task: the failure is logged, not raised
                logger.exception("the store search for the gap report failed")
                return None
            # One search at a time, then a pause: a lookup waits behind at most one search.
            await asyncio.sleep(SEARCH_PAUSE_S)
        return hits

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
                    self._pool, self._pid = None, None
                    pool.shutdown(wait=False, cancel_futures=True)
                raise PageProcessStopped("the console's page process stopped") from exc
