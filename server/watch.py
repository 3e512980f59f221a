"""Live updates: one ingest at a time per data directory, and ``serve --watch DIR``.

Serving processes need no signal when the knowledge base changes: the engine reloads its
catalog view when the catalog's generation moves (retrieval.engine.KnowledgeEngine.view), and the
vectors are shared (a Milvus server, or one Lite directory served by its owner, storage.lite_share).
What must not happen is two ingests interleaving their pending/commit steps on one catalog, so
every ingest, from the CLI or a watcher, holds ``<data_dir>/ingest.lock``.

On a Milvus server, replicas on other machines have catalogs of their own: each follows the
shared catalog's generation (``follow_shared``) and pulls what another machine ingested.

The watcher polls modification times instead of using inotify: no extra dependency, works on
network and container mounts, and a knowledge base of a few thousand files stats in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from retrieval.ingest import IngestError, IngestReport
from server.container import Runtime, catalog_path, log_pull
from storage.catalog import Catalog
from storage.shared_sync import pull
from storage.vector_store import StoreError

logger = logging.getLogger(__name__)

Stamp = dict[str, tuple[int, int]]


@contextlib.contextmanager
def ingest_lock(data_dir: Path) -> Iterator[None]:
    """Hold the data directory's ingest lock, waiting for another ingest to finish first."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / "ingest.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("another ingest runs on %s; waiting for it", data_dir)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def snapshot(root: Path) -> Stamp:
    """(mtime, size) of every file under root; hidden files and directories are skipped."""
    stamps: Stamp = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.startswith("."):
                continue
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # removed between walk and stat
                continue
            except OSError:  # a link loop: the ingest reports it; its own stamp still shows a change
                st = os.lstat(path)
            stamps[path] = (st.st_mtime_ns, st.st_size)
    return stamps


def report_ingest(report: IngestReport, root: Path) -> None:
    """Log an ingest the way the ingest command prints it: each bad file, then the summary."""
    for doc_key, reason in report.failed:
        logger.warning("failed: %s: %s", doc_key, reason)
    logger.info("watch %s: %s", root, report.summary())


class FolderWatcher:
    """Keeps the index in sync with a folder: ingest at start, then after each burst of changes.

    A change starts a quiet period of ``debounce_s``; every further change restarts it, so an
    editor's save-rename-chmod or a ``git pull`` of many files becomes one ingest.
    """

    def __init__(
        self,
        root: Path,
        ingest: Callable[[], IngestReport],
        *,
        poll_s: float,
        debounce_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self._ingest = ingest
        self._poll_s = poll_s
        self._debounce_s = debounce_s
        self._clock = clock
        self.ingests = 0

    async def run(self) -> None:
        """Until cancelled."""
        stamp = await asyncio.to_thread(snapshot, self.root)
        await self._run_ingest()
        changed_at: float | None = None
        while True:
            await asyncio.sleep(self._poll_s)
            current = await asyncio.to_thread(snapshot, self.root)
            if current != stamp:
                stamp, changed_at = current, self._clock()
            elif changed_at is not None and self._clock() - changed_at >= self._debounce_s:
                changed_at = None
                await self._run_ingest()

    async def _run_ingest(self) -> None:
        try:
            report = await asyncio.to_thread(self._ingest)
        except IngestError as exc:
            logger.error("watch %s: %s", self.root, exc)
            return
        except Exception:  # a store or model failure: keep watching, the next change retries
            logger.exception("watch %s: ingest failed", self.root)
            return
        self.ingests += 1
        report_ingest(report, self.root)


def watch_ingest(runtime: Runtime, root: Path) -> Callable[[], IngestReport]:
    """One ingest of root through the serving process's store and model, under the ingest lock.

    The ingest gets a catalog connection of its own: the engine reads through the runtime's
    connection from other threads, and must not see a transaction of the ingest half-way.
    """
    settings = runtime.settings

    def ingest() -> IngestReport:
        with ingest_lock(settings.data_dir):
            catalog = Catalog(catalog_path(settings, runtime.store.collection))
            try:
                return runtime.ingestor(catalog).run(root)
            finally:
                catalog.close()

    return ingest


def follow_shared(runtime: Runtime) -> bool:
    """On a Milvus server: pull the shared catalog when its generation moved; whether it did.

    Under the ingest lock, so that a pull never drops a document that an ingest of this data
    directory committed locally and has not yet sent. The engine then reloads its view on the
    next lookup, as after a local ingest.
    """
    shared = runtime.shared
    if shared is None or shared.generation() == runtime.shared_generation:
        return False
    settings = runtime.settings
    with ingest_lock(settings.data_dir):
        catalog = Catalog(catalog_path(settings, runtime.store.collection))
        try:
            done = pull(catalog, shared, before_taking=runtime.store.catch_up)
        finally:
            catalog.close()
    log_pull(done, runtime.embedder.passages_embedded)
    if done.generation is not None:
        runtime.shared_generation = done.generation
    return True


async def keep_following(runtime: Runtime, interval_s: float) -> None:
    """Until cancelled: follow the shared catalog every interval_s; Milvus down is logged, not fatal."""
    unreachable = False
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(follow_shared, runtime)
        except (StoreError, OSError) as exc:
            _log_unreachable(runtime, exc, unreachable)
            unreachable = True
            continue
        except Exception as exc:  # pymilvus raises many types; all mean "the shared catalog cannot be read"
            _log_unreachable(runtime, exc, unreachable)
            unreachable = True
            continue
        if unreachable:
            logger.info("the shared catalog answers again")
        unreachable = False


def _log_unreachable(runtime: Runtime, exc: Exception, already: bool) -> None:
    if not already:
        logger.warning(
            "cannot read the shared catalog (%s); serving generation %s until it answers",
            exc,
            runtime.shared_generation,
        )
