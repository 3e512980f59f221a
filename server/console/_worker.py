"""The console's page process: every page and the gap report are built here, at the idle priority.

``server.console.builder.PageProcess`` spawns one such process and submits calls to it. The
process keeps one event loop on a thread of its own, so the gap report's builds (embedding the
logged questions, grouping them) go on in the background between pages, as they would on the
serving process's loop. What the process holds:
- per log file, a ``LogPages`` (the running totals of the overview and sessions pages);
- per log and catalog, a ``ReportPages`` over a ``GapReporter`` whose sources are the catalog,
  opened read-only here, and an embedder built here from the same settings (loaded on the first
  build that embeds a question: e5-small costs about 150 MB of memory);
- the store searches the report needs (each gap group's nearest document): the store is held by
  the serving process (Milvus Lite locks its file), so the worker hands the group centres back
  with the next page and the serving process answers with the hits (``SearchBroker``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import os
import resource
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from retrieval.embedders import Embedder, create_embedder
from retrieval.knowledge_map import knowledge_map_of
from retrieval.models import KnowledgeMap
from server.config.sections import EmbedderSettings
from server.console.log_pages import LogPages
from server.console.report_pages import ReportPages, ReportPending
from server.gap_report import GapReporter, Hits
from storage.catalog import Catalog
from storage.catalog_records import CatalogEntry

T = TypeVar("T")
# Questions per call of the embedder: larger than the serving process's batches, as no lookup
# here waits behind one.
WORKER_EMBED_BATCH = 32
# Where SCHED_IDLE is refused: the lowest priority nice gives.
FALLBACK_NICENESS = 19
# How often the process checks that the serving process still lives (seconds).
PARENT_CHECK_S = 2.0
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when the thread that spawned it ends

Asked = tuple[int, list[list[float]]]  # a search request: its id and the centres, as lists
Answer = tuple[int, list[Hits] | None]  # its hits, or None when the serving process failed


@dataclass(frozen=True)
class ReportSpec:
    """What the worker needs for the report pages (sent with each call, so it is plain data)."""

    log_path: Path
    catalog_path: Path
    embedder: EmbedderSettings
    # The serving embedder's name and dimension: the worker's must match, as the centres are
    # searched in the store of the serving embedder's vectors.
    embedder_name: str
    embedder_dim: int


class SearchBroker:
    """Store searches asked for by report builds here, taken by the serving process with a page."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._asked: dict[int, tuple[list[list[float]], asyncio.Future[list[Hits]]]] = {}
        self._taken: set[int] = set()

    async def search(self, centroids: Sequence[np.ndarray]) -> list[Hits]:
        """The centres' hits, once the serving process has searched them (with a later page)."""
        future: asyncio.Future[list[Hits]] = asyncio.get_running_loop().create_future()
        ask = next(self._ids)
        self._asked[ask] = ([[float(x) for x in c] for c in centroids], future)
        try:
            return await future
        finally:
            self._asked.pop(ask, None)
            self._taken.discard(ask)

    def take(self) -> list[Asked]:
        """The searches not yet handed to the serving process."""
        fresh = [(ask, centres) for ask, (centres, _) in self._asked.items() if ask not in self._taken]
        self._taken.update(ask for ask, _ in fresh)
        return fresh

    def answer(self, answers: Sequence[Answer]) -> None:
        for ask, hits in answers:
            entry = self._asked.get(ask)
            if entry is None or entry[1].done():
                continue
            if hits is None:  # the search failed there: this build fails, the next page starts another
                entry[1].set_exception(RuntimeError("the store search for the gap report failed"))
            else:
                entry[1].set_result(hits)


class WorkerSources:
    """The gap report's sources in the worker: the catalog read-only, an embedder of its own."""

    def __init__(self, spec: ReportSpec, broker: SearchBroker) -> None:
        self.spec = spec
        self._broker = broker
        self._lock = threading.Lock()  # the catalog's connection and the embedder, from threads
        self._catalog: Catalog | None = None
        self._entries: tuple[int, list[CatalogEntry], KnowledgeMap] | None = None
        self.embedder: Embedder | None = None

    def entries(self) -> tuple[list[CatalogEntry], KnowledgeMap]:
        """The catalog's entries and map, read again only when its generation moved (blocking)."""
        with self._lock:
            if self._catalog is None:
                self._catalog = Catalog(self.spec.catalog_path, read_only=True)
            catalog = self._catalog
            with catalog.snapshot():
                generation = catalog.generation()
                if self._entries is None or self._entries[0] != generation:
                    entries = catalog.entries()
                    self._entries = (generation, entries, knowledge_map_of(entries))
            return self._entries[1], self._entries[2]

    def titles(self) -> dict[str, tuple[str, str]]:
        return {e.doc_key: (e.title, e.domain) for e in self.entries()[0]}

    async def knowledge_map(self) -> KnowledgeMap:
        return (await asyncio.to_thread(self.entries))[1]

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            if self.embedder is None:
                self.embedder = self._load_embedder()
            embedder = self.embedder
        return embedder.embed_queries(list(texts))

    def _load_embedder(self) -> Embedder:
        cfg = self.spec.embedder
        embedder = create_embedder(
            cfg.name, model_path=cfg.model_path, device=cfg.device, batch_size=cfg.batch_size
        )
        if (embedder.name, embedder.dim) != (self.spec.embedder_name, self.spec.embedder_dim):
            raise RuntimeError(
                f"the page process's embedder {embedder.name!r} ({embedder.dim}) is not the server's "
                f"{self.spec.embedder_name!r} ({self.spec.embedder_dim})"
            )
        return embedder

    async def search(self, centroids: Sequence[np.ndarray]) -> list[Hits]:
        return await self._broker.search(centroids)


# -- the process's state ----------------------------------------------------------------
_loop: asyncio.AbstractEventLoop | None = None
_logs: dict[Path, LogPages] = {}
_reports: dict[tuple[Path, Path], tuple[ReportPages, WorkerSources]] = {}
_broker = SearchBroker()
built: Counter[str] = Counter()  # pages built here, by name


def start(idle: bool) -> None:
    """The pool's initializer: the idle priority, then the loop's thread (which inherits it)."""
    global _loop
    _die_with_parent()
    if idle:
        _lower_priority()
    _loop = asyncio.new_event_loop()
    threading.Thread(target=_loop.run_forever, name="console-pages", daemon=True).start()
    threading.Thread(target=_exit_with, args=(os.getppid(),), name="console-parent", daemon=True).start()


def _exit_with(parent: int) -> None:
    """Exit once the serving process is gone (killed: it could not stop this one).

    The pool's queue never reports the end of a killed parent (this process holds both ends of
    its pipe), so without this an orphan would keep its embedder's memory for good.
    """
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(0)


def _die_with_parent() -> None:
    """Be killed by the kernel when the serving process dies (Linux).

    The serving process holds this one stopped while it runs lookups (``PageProcess.hold``): killed
    then, it can never resume it, and a stopped process runs no check of its own (``_exit_with``).
    The signal is sent when the thread that spawned this process ends: the serving process's event
    loop thread, which lives as long as the server does.
    """
    if not sys.platform.startswith("linux"):
        return
    # Without prctl in this libc, the parent check below still runs.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _lower_priority() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or refused: the lowest nice value instead
        os.nice(FALLBACK_NICENESS)


def _run(coro: Coroutine[Any, Any, T]) -> T:
    if _loop is None:  # pragma: no cover - the pool's initializer always runs first
        coro.close()
        raise RuntimeError("the console's page process was not started")
    return asyncio.run_coroutine_threadsafe(coro, _loop).result()


def log_page(log_path: Path, name: str, args: tuple[Any, ...]) -> str:
    """The overview or sessions page (``LogPages.page``)."""
    body = _run(_logs.setdefault(log_path, LogPages(log_path)).page(name, *args))
    built[name] += 1
    return body


def report_page(spec: ReportSpec, name: str, args: tuple[Any, ...]) -> tuple[str | None, list[Asked]]:
    """A report page (None while its report is pending) and the store searches now wanted."""
    return _run(_report_page(spec, name, args))


async def _report_page(spec: ReportSpec, name: str, args: tuple[Any, ...]) -> tuple[str | None, list[Asked]]:
    key = (spec.log_path, spec.catalog_path)
    if key not in _reports:
        sources = WorkerSources(spec, _broker)
        reporter = GapReporter(sources, spec.log_path, embed_batch=WORKER_EMBED_BATCH)
        _reports[key] = (ReportPages(reporter, sources.knowledge_map), sources)
    try:
        body: str | None = await _reports[key][0].page(name, *args)
        built[name] += 1
    except ReportPending:
        body = None
    return body, _broker.take()


def answer(answers: list[Answer]) -> None:
    """The serving process's hits for searches taken with a page."""
    if _loop is not None:
        _loop.call_soon_threadsafe(_broker.answer, answers)


def stats() -> dict[str, Any]:
    """This process's id, memory, CPU time and pages built (the tests and the bench read them)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    status = Path("/proc/self/status")
    memory = {}
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                memory[line.split(":")[0]] = int(line.split()[1])
    return {
        "pid": os.getpid(),
        "rss_kb": memory.get("VmRSS", 0),
        "peak_rss_kb": memory.get("VmHWM", usage.ru_maxrss),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
        "built": dict(built),
        "embedder_loaded": any(s.embedder is not None for _, s in _reports.values()),
    }
