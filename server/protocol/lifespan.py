"""Process-wide resources of the server, owned by the MCP lifespan.

The lifespan acquires them and releases them in ``finally``. They are reference-counted
because the SSE transport enters the lifespan once per connection while the model, Milvus and
the action memory must be shared by all connections of the process. Opening the embedder and
Milvus takes seconds, so it runs in a background thread: ``initialize`` answers at once and
the first lookup waits for the warm-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from pathlib import Path

from retrieval.action_memory import Clock, SessionMemory
from retrieval.embedders import Embedder
from retrieval.requests import Policy
from retrieval.service import LookupService
from server.config.data_dir import empty_knowledge_base_message, prepare_data_dir
from server.config.reload import SettingsHolder
from server.config.settings import Settings
from server.container import Runtime, action_memory, lookup_service, open_runtime, policy_from
from server.heap import ServingHeap
from server.protocol.admission import InFlight
from server.protocol.session import TransportSession
from storage.invocation_log import InvocationLog
from storage.log_retention import Retention
from storage.schema import SchemaVersionError
from storage.vector_store import MilvusVectorStore

logger = logging.getLogger(__name__)


class WarmupError(RuntimeError):
    """The embedder or Milvus could not be opened; every lookup reports this."""


class AppResources:
    """Shared state of one server process: settings, action memory, retrieval stack and log."""

    def __init__(
        self,
        holder: SettingsHolder,
        *,
        embedder: Embedder | None = None,
        store: MilvusVectorStore | None = None,
        stdio_key: str | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        settings = holder.current()
        self.holder = holder
        self.stdio_key = stdio_key
        # The session id the HTTP transport issues and checks (server.protocol.session); set by
        # build_http_app. "none" under stateless streamable HTTP, which issues none.
        self.transport_session: TransportSession = "mcp-session-id"
        self.memory = action_memory(settings, on_change=self._persist_memory, clock=clock)
        self._embedder = embedder
        self._store = store
        self._refs = 0
        self._lock = asyncio.Lock()
        self._warmup: asyncio.Task[Runtime] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._follow: asyncio.Task[None] | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self.runtime: Runtime | None = None
        self.service: LookupService | None = None
        self.log: InvocationLog | None = None
        self.heap = ServingHeap()
        # The lookups and reads this process runs now: bounded by the handlers, watched by the console.
        self.in_flight = InFlight()
        self.started_at = time.time()

    @property
    def settings(self) -> Settings:
        return self.holder.current()

    # -- lifecycle -------------------------------------------------------------------
    async def acquire(self) -> None:
        async with self._lock:
            self._refs += 1
            if self._refs > 1:
                return
            settings = self.settings
            prepare_data_dir(settings.data_dir)
            self.heap.enter()
            self._warmup = asyncio.create_task(asyncio.to_thread(self._open_runtime, settings))
            if settings.watch.directory is not None:
                self._watch = asyncio.create_task(self._keep_in_sync(settings.watch.directory))
            self._follow = asyncio.create_task(self._follow_shared())
            if settings.log.enabled:
                # NORMAL under WAL: a committed row survives a crash of this process, but a power
                # loss or OS crash can lose the last rows. FULL's fsync per call cost ~0.5 ms on the
                # repeated and refused paths, whose target is 2 ms (docs/benchmarks.md).
                self.log = await InvocationLog.open(
                    settings.log_path,
                    log_queries=settings.log.log_queries,
                    synchronous="NORMAL",
                )
                if settings.memory.persist:
                    await self._restore_memory()
                self._maintenance = asyncio.create_task(self._maintain_log(self.log))

    def _open_runtime(self, settings: Settings) -> Runtime:
        try:
            runtime = open_runtime(settings, embedder=self._embedder, store=self._store)
        except Exception:
            # Callers see only the message (WarmupError); the traceback is logged here, once.
            logger.exception("warm-up failed: the knowledge base is unavailable")
            raise
        if not runtime.engine.view().entries:
            # Said once at start-up; every lookup then says it too (server.protocol.handlers).
            logger.warning("%s", empty_knowledge_base_message(settings.data_dir))
        return runtime

    async def release(self) -> None:
        async with self._lock:
            self._refs -= 1
            if self._refs > 0:
                return
            for task in (self._watch, self._follow, self._maintenance):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            self._watch = self._follow = self._maintenance = None
            if self._warmup is not None:
                try:
                    runtime = await self._warmup
                except Exception:  # the failure was already reported to callers
                    logger.debug("warm-up had failed; nothing to close")
                else:
                    runtime.close()
            self._warmup, self.runtime, self.service = None, None, None
            if self.log is not None:
                await self.log.close()
                self.log = None
            self.heap.exit()

    async def lookup_service(self) -> LookupService:
        """The lookup service, waiting for the background warm-up if it is still running."""
        if self.service is not None:
            return self.service
        if self._warmup is None:
            raise WarmupError("the server is not started (lifespan not entered)")
        try:
            runtime = await asyncio.shield(self._warmup)
        except Exception as exc:
            raise WarmupError(f"the knowledge base is unavailable: {exc}") from exc
        if self.service is None:
            self.runtime = runtime
            self.service = lookup_service(runtime, self.memory, self._policy, on_view=self.heap.settle)
        return self.service

    async def _keep_in_sync(self, root: Path) -> None:
        """serve --watch: once the stack is warm, ingest root at start and after each change."""
        from server.watch import FolderWatcher, watch_ingest

        if self._warmup is None:
            return
        try:
            runtime = await asyncio.shield(self._warmup)
        except Exception:  # every lookup reports the warm-up failure; nothing to watch with
            logger.error("not watching %s: the knowledge base is unavailable", root)
            return
        watch = self.settings.watch
        watcher = FolderWatcher(
            root, watch_ingest(runtime, root), poll_s=watch.poll_interval_s, debounce_s=watch.debounce_s
        )
        logger.info("watching %s", root)
        await watcher.run()

    async def _follow_shared(self) -> None:
        """On a Milvus server, once the stack is warm: take what other machines ingest (server.watch)."""
        from server.watch import keep_following

        if self._warmup is None:
            return
        try:
            runtime = await asyncio.shield(self._warmup)
        except Exception:  # every lookup reports the warm-up failure
            return
        if runtime.shared is not None:
            await keep_following(runtime, self.settings.milvus.sync_interval_s)

    async def _maintain_log(self, log: InvocationLog) -> None:
        """In the background: apply the log's retention, and checkpoint a WAL that had commits."""
        while True:
            await asyncio.sleep(self.settings.log.maintenance_interval_s)
            settings = self.settings
            retention = Retention(
                settings.log.retention_days,
                settings.log.max_rows,
                settings.memory.ttl_seconds if settings.memory.persist else None,
            )
            try:
                pruned = await log.prune(retention)
            except (sqlite3.Error, OSError, ValueError, SchemaVersionError) as exc:
                # The rows' own writes report and count the failure; the next pass tries again.
                logger.warning("invocation log retention skipped: %s", exc)
            else:
                if pruned.rows or pruned.gaps:
                    logger.info("invocation log: %d old rows and %d gaps deleted", pruned.rows, pruned.gaps)
            log.checkpoint_soon(due_only=True)

    def _policy(self) -> Policy:
        settings = self.settings
        # The TTL and the session cap are hot-reloadable too: apply them to the live memory
        # (a lower cap evicts the least recently used sessions on the next new session).
        self.memory.ttl_seconds = settings.memory.ttl_seconds
        self.memory.max_sessions = settings.memory.max_sessions
        return policy_from(settings)

    # -- action memory persistence -----------------------------------------------------
    def _persist_memory(self, session_key: str, memory: SessionMemory | None) -> None:
        # memory.persist is restart-only: the holder keeps the value the memory was restored under.
        if self.log is not None and self.settings.memory.persist:
            self.log.queue_memory(session_key, memory.to_state() if memory is not None else None)

    async def _restore_memory(self) -> None:
        if self.log is None:
            return
        for session_key, state, age in await self.log.load_memories(self.settings.memory.ttl_seconds):
            try:
                memory = SessionMemory.from_state(state)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                logger.warning("skipping damaged action memory of session %r: %s", session_key, exc)
                continue
            self.memory.restore(session_key, memory, age_seconds=age)
