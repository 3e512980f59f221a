"""The invocation log: one SQLite row per tool call, in WAL mode, written on one worker thread.

A call's row is committed before its response is sent. Writing it must never cost the caller
its answer: when the log is locked, the disk is full or the file is gone, ``record`` returns
False, logs to stderr, counts the failure and the next call tries again (reopening the file if
it was removed). The number of calls missed is written to ``log_gap`` once the log recovers.

The same file keeps the action memory of each session (``session_memory``). The tracker
queues every change synchronously; the latest state per session rides in the next row's
transaction, so persistence adds no commit of its own.

The write is on every call's latency path. A plain ``sqlite3`` connection does the reopen check,
the row, the side tables and the commit (or the rollback) in one synchronous function. Through
aiosqlite the same write took three or four thread hops (execute, executemany, commit): a call's
log write, as the server awaits it, took a median 0.71 ms at 10k chunks on 2 cores, against
0.52 ms as one hop to a dedicated thread. When a commit does not sync (WAL with synchronous
NORMAL, the server's setting, writes to the page cache) the function now runs on the event loop
itself, and only if the write lock is free at once: one hop less, 0.36 → 0.23 ms median per
call's write on a repeated lookup. A write that would wait for the lock (another process
writing, a checkpoint) goes to the log's thread, which waits there with the busy timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from storage import log_retention
from storage.log_retention import Pruned, Retention
from storage.schema import SchemaVersionError, migrate

logger = logging.getLogger(__name__)

T = TypeVar("T")

Synchronous = Literal["OFF", "NORMAL", "FULL"]
# Errors that mean "this row could not be written"; anything else is a bug and propagates.
_WRITE_ERRORS = (sqlite3.Error, OSError, ValueError, SchemaVersionError)

_INSERT = """
INSERT INTO tool_invocation (
    ts, session_key, session_scope, tool_name, query, domain_filter, missing_dimension,
    relevance_level, dedup_reason, completeness_hint, water_level, next_call, call_index,
    result_doc_keys, retrieval_details, latency_ms, error
) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
"""
_UPSERT_MEMORY = """
INSERT INTO session_memory (session_key, state, last_seen) VALUES (?, ?, ?)
ON CONFLICT (session_key) DO UPDATE SET state = excluded.state, last_seen = excluded.last_seen
"""


@dataclass(frozen=True)
class InvocationRecord:
    """One tool call, as the server saw it."""

    ts: float
    session_key: str | None
    session_scope: str
    tool_name: str
    query: str | None
    domain_filter: str | None
    missing_dimension: str | None
    relevance_level: str | None
    dedup_reason: str | None
    completeness_hint: str | None
    water_level: str | None
    next_call: str | None
    call_index: int | None
    result_doc_keys: list[str]
    retrieval_details: dict[str, Any] | None
    latency_ms: float
    error: str | None


@dataclass
class _Gap:
    first_ts: float
    last_ts: float
    missed: int
    last_error: str


def hash_text(text: str) -> str:
    """What the log stores instead of free text when ``log_queries`` is off."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


# Queued action memory: session key -> (state, or None to forget it; when it was queued).
_Memory = dict[str, tuple[str | None, float]]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _write_side_tables(conn: sqlite3.Connection, memory: _Memory, gap: _Gap | None) -> None:
    if gap is not None:
        conn.execute(
            "INSERT INTO log_gap (first_ts, last_ts, missed, last_error) VALUES (?, ?, ?, ?)",
            (gap.first_ts, gap.last_ts, gap.missed, gap.last_error),
        )
    upserts = [(key, state, seen) for key, (state, seen) in memory.items() if state is not None]
    deletes = [(key,) for key, (state, _) in memory.items() if state is None]
    if upserts:
        conn.executemany(_UPSERT_MEMORY, upserts)
    if deletes:
        conn.executemany("DELETE FROM session_memory WHERE session_key = ?", deletes)


class InvocationLog:
    """Append-only log of tool calls plus the persisted action memory, in ``<data_dir>/log.sqlite``.

    One SQLite connection, opened on the log's own worker thread (one ``ThreadPoolExecutor``
    worker) and used by one caller at a time: every use holds ``_lock``. Everything a call needs
    (reopen check, row, side tables, commit or rollback) is one synchronous function, run on the
    event loop when it cannot wait (``_wrote_inline``) and otherwise on the worker, awaited once
    (module docstring).
    """

    def __init__(
        self,
        path: Path,
        *,
        log_queries: bool,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 0.1,
        synchronous: Synchronous = "FULL",
    ) -> None:
        if synchronous not in ("OFF", "NORMAL", "FULL"):
            raise ValueError(f"synchronous must be OFF, NORMAL or FULL, got {synchronous!r}")
        self.path = path
        self.log_queries = log_queries
        self.failures = 0  # record() calls whose row could not be written
        self.reopens = 0  # times the file had disappeared or been replaced and was recreated
        self.last_error: str | None = None
        self._clock = clock
        self._busy_timeout_s = busy_timeout_s
        self._synchronous = synchronous
        # Connection state: touched only under _lock, by _write and the functions run on the worker.
        self._conn: sqlite3.Connection | None = None
        self._identity: tuple[int, int] | None = None
        self._executor: ThreadPoolExecutor | None = None
        # Orders the rows, and memory states are swapped under it.
        self._lock = asyncio.Lock()
        self._pending_memory: _Memory = {}
        self._gap: _Gap | None = None
        # Commits since the last checkpoint, and when it ran (time.monotonic).
        self._commits = 0
        self._checkpointed_at = time.monotonic()
        self._checkpointing: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        log_queries: bool,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = 0.1,
        synchronous: Synchronous = "FULL",
    ) -> InvocationLog:
        """Apply pending migrations and open the log (raises SchemaVersionError for a newer file)."""
        log = cls(
            path, log_queries=log_queries, clock=clock, busy_timeout_s=busy_timeout_s, synchronous=synchronous
        )
        try:
            await log._on_worker(log._connect)
        except BaseException:
            log._stop_worker()
            raise
        return log

    # -- the worker thread ---------------------------------------------------------------
    async def _on_worker(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the log's thread, where it may wait for the write lock: one hop."""
        if self._executor is None:
            # Created on first use, and again if a call comes in after close().
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="invocation-log")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._waiting, fn, *args)

    def _waiting(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` with the busy timeout; the connection is left not waiting, as the event loop uses it.

        The connection's own state is "never wait" because the event loop writes almost every row
        (``_wrote_inline``); setting it there and back cost two statements per row. Only the
        thread's rarer work sets the timeout, and a connection opened by ``fn`` gets it at connect.
        Under FULL the event loop never writes, and the connection keeps its timeout.
        """
        if self._synchronous == "FULL":
            return fn(*args)
        self._set_busy_timeout(self._busy_timeout_s)
        try:
            return fn(*args)
        finally:
            self._set_busy_timeout(0.0)

    def _set_busy_timeout(self, seconds: float) -> None:
        if self._conn is None:
            return  # none open, or dropped after a failure: a new one is set up when it opens
        try:
            self._conn.execute(f"PRAGMA busy_timeout={round(seconds * 1000)}")
        except _WRITE_ERRORS as exc:
            logger.warning("invocation log connection dropped after: %s", _describe(exc))
            self._drop()

    def _stop_worker(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            # The thread ends as soon as it is idle; the event loop does not wait for it.
            executor.shutdown(wait=False)

    # -- connection (one user at a time: callers hold _lock) ------------------------------
    def _connect(self, migrate_timeout_s: float = 5.0) -> sqlite3.Connection:
        migrate(self.path, busy_timeout_s=migrate_timeout_s)
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA synchronous={self._synchronous}")
            conn.execute("PRAGMA wal_autocheckpoint=0")
            conn.execute(f"PRAGMA journal_size_limit={log_retention.JOURNAL_SIZE_LIMIT_BYTES}")
        except BaseException:
            conn.close()
            raise
        self._conn, self._identity = conn, _file_identity(self.path)
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.close()
        except _WRITE_ERRORS as exc:
            logger.warning("closing the invocation log failed: %s", exc)

    def _connection(self) -> sqlite3.Connection:
        """The open connection, reopened if a failure dropped it or the file was removed."""
        if self._conn is not None and not self._same_file():
            # Writes would go on into an unlinked inode and be lost. Closing first also removes
            # the old -wal file, which must not be replayed into the new database.
            logger.warning("invocation log %s was removed or replaced; recreating it", self.path)
            self.reopens += 1
            self._drop()
        if self._conn is None:
            # On the lookup path: wait no longer for a lock than a row write would.
            return self._connect(migrate_timeout_s=self._busy_timeout_s)
        return self._conn

    def _same_file(self) -> bool:
        """Whether the path still names the file the connection has open."""
        return _file_identity(self.path) == self._identity

    def _transaction(
        self, work: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection | None = None
    ) -> T:
        """``work`` and its commit on ``conn`` (default: ``_connection()``); on failure roll back
        (or drop a broken connection) and re-raise."""
        conn = self._connection() if conn is None else conn
        try:
            result = work(conn)
            conn.commit()
        except _WRITE_ERRORS as exc:
            try:
                conn.rollback()
            except _WRITE_ERRORS:
                # The connection itself is broken (I/O error, closed): start afresh on the next call.
                logger.warning("invocation log connection dropped after: %s", _describe(exc))
                self._drop()
            raise
        return result

    def _write(
        self, row: tuple[Any, ...], memory: _Memory, gap: _Gap | None, conn: sqlite3.Connection | None = None
    ) -> None:
        """The whole of one record(): row, gap and memory states in one transaction, one commit."""

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(_INSERT, row)
            _write_side_tables(conn, memory, gap)

        self._transaction(work, conn)

    # -- writing -------------------------------------------------------------------------
    def _row(self, record: InvocationRecord) -> tuple[Any, ...]:
        query, missing = record.query, record.missing_dimension
        if not self.log_queries:
            query = hash_text(query) if query is not None else None
            missing = hash_text(missing) if missing is not None else None
        details = (
            json.dumps(record.retrieval_details, ensure_ascii=False, default=str)
            if record.retrieval_details is not None
            else None
        )
        return (
            record.ts,
            record.session_key,
            record.session_scope,
            record.tool_name,
            query,
            record.domain_filter,
            missing,
            record.relevance_level,
            record.dedup_reason,
            record.completeness_hint,
            record.water_level,
            record.next_call,
            record.call_index,
            json.dumps(list(record.result_doc_keys), ensure_ascii=False),
            details,
            round(record.latency_ms, 3),
            record.error,
        )

    async def record(self, record: InvocationRecord) -> bool:
        """Commit one row (and any queued memory); False if it could not be written. Never raises.

        ``_write`` does the reopen check, the row, a pending gap, the queued memory states and the
        commit, or the rollback: on the event loop if that cannot wait for a lock, else on the
        log's thread.
        """
        row = self._row(record)
        async with self._lock:
            memory, self._pending_memory = self._pending_memory, {}
            gap = self._gap
            try:
                if not self._wrote_inline(row, memory, gap):
                    await self._on_worker(self._write, row, memory, gap)
            except _WRITE_ERRORS as exc:
                # Keep the memory states for the next transaction, unless newer ones were queued.
                self._pending_memory = {**memory, **self._pending_memory}
                self._failed(record.ts, exc)
                return False
            self._gap = None
            self._after_commit()
        return True

    def _wrote_inline(self, row: tuple[Any, ...], memory: _Memory, gap: _Gap | None) -> bool:
        """``_write`` on the calling thread if it needs no waiting; False: nothing was committed.

        Only when a commit does not sync (WAL with synchronous NORMAL or OFF writes to the page
        cache) and the file is the one opened. The lock is not waited for: another process
        writing, or a checkpoint, makes this fail at once, and the worker retries with the
        busy timeout, off the event loop.
        """
        conn = self._conn
        if self._synchronous == "FULL" or conn is None or not self._same_file():
            return False
        try:
            self._write(row, memory, gap, conn)  # the connection does not wait for a lock (_waiting)
        except _WRITE_ERRORS:
            return False
        return True

    def _failed(self, ts: float, exc: BaseException) -> None:
        self.failures += 1
        self.last_error = _describe(exc)
        if self._gap is None:
            self._gap = _Gap(ts, ts, 1, self.last_error)
            logger.exception(
                "invocation log %s: a row could not be written; the call was answered, later calls retry",
                self.path,
            )
        else:
            self._gap.last_ts, self._gap.missed, self._gap.last_error = (
                ts,
                self._gap.missed + 1,
                self.last_error,
            )
            logger.error("invocation log still not writable (%d failures so far): %s", self.failures, exc)

    def _after_commit(self) -> None:
        # SQLite's own autocheckpoint (1000 pages) would run inside whichever commit crosses it,
        # on the lookup path; and counting commits per process let a WAL shared by several
        # processes reach 21.5 MB. The WAL's own size is what every process sees.
        self._commits += 1
        if log_retention.wal_bytes(self.path) >= log_retention.CHECKPOINT_WAL_BYTES:
            self.checkpoint_soon()

    def checkpoint_soon(self, *, due_only: bool = False) -> None:
        """Start a background checkpoint unless one is running; ``due_only``: only if the interval passed."""
        if self._checkpointing is not None and not self._checkpointing.done():
            return
        if due_only and not (
            self._commits and time.monotonic() - self._checkpointed_at >= log_retention.CHECKPOINT_INTERVAL_S
        ):
            return
        self._commits, self._checkpointed_at = 0, time.monotonic()
        self._checkpointing = asyncio.create_task(self._checkpoint())

    async def _checkpoint(self) -> None:
        # On its own connection and a thread of the default executor, not the log's thread:
        # the next row must not queue behind a checkpoint.
        try:
            await asyncio.to_thread(log_retention.checkpoint, self.path)
        except sqlite3.Error as exc:
            logger.warning("invocation log checkpoint skipped: %s", exc)

    async def prune(self, retention: Retention) -> Pruned:
        """Apply ``retention`` as of the log's clock, on the log's thread, one batch at a time.

        The lock is taken per batch, so the rows of calls made meanwhile are written between them.
        """
        now = self._clock()

        def step() -> Pruned:
            conn = self._connection()
            try:
                return log_retention.prune_step(conn, retention, now)
            except _WRITE_ERRORS:
                conn.rollback()
                raise

        total = Pruned(0, 0, 0)
        while True:
            async with self._lock:
                done = await self._on_worker(step)
            total = Pruned(total.rows + done.rows, total.gaps + done.gaps, total.memories + done.memories)
            if done.rows < log_retention.BATCH:
                return total

    # -- action memory ---------------------------------------------------------------------
    def queue_memory(self, session_key: str, state: str | None) -> None:
        """Remember a session's latest state, opaque JSON (None: forget it); written with the next row."""
        self._pending_memory[session_key] = (state, self._clock())

    async def load_memories(self, ttl_seconds: float) -> list[tuple[str, str, float]]:
        """Sessions seen within the TTL, as (session_key, memory, age_seconds); expired rows are deleted."""
        now = self._clock()
        cutoff = now - ttl_seconds

        def work(conn: sqlite3.Connection) -> list[tuple[str, str, float]]:
            rows: list[tuple[str, str, float]] = conn.execute(
                "SELECT session_key, state, last_seen FROM session_memory WHERE last_seen >= ?", (cutoff,)
            ).fetchall()
            conn.execute("DELETE FROM session_memory WHERE last_seen < ?", (cutoff,))
            return rows

        async with self._lock:
            try:
                rows = await self._on_worker(self._transaction, work)
            except _WRITE_ERRORS:
                logger.exception("could not restore action memory from %s; starting empty", self.path)
                return []
        return [(key, state, max(0.0, now - last_seen)) for key, state, last_seen in rows]

    # -- tests and diagnostics -------------------------------------------------------------
    async def execute_on_connection(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """For tests and diagnostics, not the call path: one statement on the log's own connection.

        Runs on the log's thread, in order with the rows, and is committed; returns the rows it
        produced. Per-connection settings (``PRAGMA max_page_count``, ...) stay in effect for the
        rows that follow. Unlike ``record``, errors propagate.
        """

        def work(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
            rows: list[tuple[Any, ...]] = conn.execute(sql, parameters).fetchall()
            return rows

        async with self._lock:
            return await self._on_worker(self._transaction, work)

    # -- shutdown --------------------------------------------------------------------------
    async def close(self) -> None:
        """Write queued memory states, close the connection and end the log's thread (never raises)."""
        async with self._lock:
            if self._checkpointing is not None:
                await self._checkpointing
            memory, self._pending_memory = self._pending_memory, {}
            if self._executor is None and not memory and self._gap is None:
                return  # closed already, nothing queued since
            try:
                if await self._on_worker(self._close, memory, self._gap):
                    self._gap = None
            finally:
                self._stop_worker()

    def _close(self, memory: _Memory, gap: _Gap | None) -> bool:
        """On the log's thread: the last memory states and gap, then close; False if they were lost."""
        try:
            if memory or gap is not None:
                self._transaction(lambda conn: _write_side_tables(conn, memory, gap))
        except _WRITE_ERRORS:
            logger.exception("could not write the last action-memory states to %s", self.path)
            return False
        finally:
            self._drop()
        return True
