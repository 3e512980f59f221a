"""The invocation log: one SQLite row per tool call, in WAL mode, written through aiosqlite.

A call's row is committed before its response is sent. Writing it must never cost the caller
its answer: when the log is locked, the disk is full or the file is gone, ``record`` returns
False, logs to stderr, counts the failure and the next call tries again (reopening the file if
it was removed). The number of calls missed is written to ``log_gap`` once the log recovers.

The same file keeps the action memory of each session (storage.session_memory_store), which
rides in the transaction of the next row.

One aiosqlite connection, opened by ``open`` (in the server's lifespan) and closed by ``close``,
does every write: each statement runs on aiosqlite's own thread, so a write that waits for the
lock (another process writing, a checkpoint) waits there with the busy timeout and the event
loop goes on serving. A call's row, a pending gap, the queued memory states and the commit (or
the rollback) are one transaction, and the transaction is shielded from the caller's
cancellation: a call cancelled meanwhile still gets its row, and no transaction is left open
on the connection. Through aiosqlite each statement and each commit is a round trip to that
thread; a lookup's write (its row and its session's state) is one statement, committed as it
ends (storage.call_write), so it costs one round trip as the synchronous function on a thread of
its own did before; ``bench/log_bench.py`` measures what the driver costs per call. Other writes
(a gap, several states, a forgotten session) run between an explicit BEGIN and COMMIT.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiosqlite

from storage import call_write, log_retention, session_memory_store
from storage.invocation_record import INSERT, InvocationRecord, row_of
from storage.log_retention import Pruned, Retention
from storage.schema import SchemaVersionError, migrate
from storage.session_memory_store import Pending, SessionMemoryStore

logger = logging.getLogger(__name__)

T = TypeVar("T")
Work = Callable[[aiosqlite.Connection], Awaitable[T]]

Synchronous = Literal["OFF", "NORMAL", "FULL"]
# Errors that mean "this row could not be written"; anything else is a bug and propagates.
# aiosqlite raises ValueError for a connection that is closed.
_WRITE_ERRORS = (sqlite3.Error, OSError, ValueError, SchemaVersionError)


@dataclass
class _Gap:
    first_ts: float
    last_ts: float
    missed: int
    last_error: str


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


async def _write_side_tables(db: aiosqlite.Connection, memory: Pending, gap: _Gap | None) -> None:
    if gap is not None:
        await db.execute(
            "INSERT INTO log_gap (first_ts, last_ts, missed, last_error) VALUES (?, ?, ?, ?)",
            (gap.first_ts, gap.last_ts, gap.missed, gap.last_error),
        )
    await session_memory_store.write(db, memory)


class InvocationLog:
    """Append-only log of tool calls plus the persisted action memory, in ``<data_dir>/log.sqlite``.

    One aiosqlite connection, used by one transaction at a time: every transaction holds
    ``_lock`` and runs in a task of its own (``_locked``), which the caller's cancellation does
    not stop (module docstring).
    """

    def __init__(
        self,
        path: Path,
        *,
        log_queries: bool,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = log_retention.WRITE_BUSY_TIMEOUT_S,
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
        # Connection state: touched only under _lock.
        self._db: aiosqlite.Connection | None = None
        self._identity: tuple[int, int] | None = None
        # Orders the transactions; memory states and the gap are taken under it.
        self._lock = asyncio.Lock()
        self._memory = SessionMemoryStore(clock)
        self._gap: _Gap | None = None
        # Commits since the last checkpoint, and when it ran (time.monotonic).
        self._commits = 0
        self._checkpointed_at = time.monotonic()
        self._checkpointing: asyncio.Task[None] | None = None
        # Set when the last checkpoint could not empty the WAL (a reader of an older snapshot):
        # the WAL's size starts no other before this time (time.monotonic), or each commit would.
        self._retry_at = 0.0

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        log_queries: bool,
        clock: Callable[[], float] = time.time,
        busy_timeout_s: float = log_retention.WRITE_BUSY_TIMEOUT_S,
        synchronous: Synchronous = "FULL",
    ) -> InvocationLog:
        """Apply pending migrations and open the log (raises SchemaVersionError for a newer file)."""
        log = cls(
            path, log_queries=log_queries, clock=clock, busy_timeout_s=busy_timeout_s, synchronous=synchronous
        )
        await log._connect(migrate_timeout_s=5.0)
        return log

    # -- connection (one user at a time: callers hold _lock) ------------------------------
    async def _connect(self, migrate_timeout_s: float) -> aiosqlite.Connection:
        await asyncio.to_thread(migrate, self.path, busy_timeout_s=migrate_timeout_s)
        # The busy timeout is the connection's own: every statement waits on aiosqlite's thread.
        # Autocommit: a lookup's write is one statement and its own transaction (storage.call_write);
        # every other transaction begins explicitly (_transaction).
        db = await aiosqlite.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None)
        try:
            await db.executescript(
                f"PRAGMA synchronous={self._synchronous};"
                " PRAGMA wal_autocheckpoint=0;"
                f" PRAGMA journal_size_limit={log_retention.JOURNAL_SIZE_LIMIT_BYTES};" + call_write.SCRIPT
            )
        except BaseException:
            await db.close()
            raise
        self._db, self._identity = db, _file_identity(self.path)
        return db

    async def _drop(self) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        try:
            await db.close()  # ends aiosqlite's thread, also when closing fails
        except _WRITE_ERRORS as exc:
            logger.warning("closing the invocation log failed: %s", exc)

    async def _connection(self) -> aiosqlite.Connection:
        """The open connection, reopened if a failure dropped it or the file was removed."""
        if self._db is not None and _file_identity(self.path) != self._identity:
            # Writes would go on into an unlinked inode and be lost. Closing first also removes
            # the old -wal file, which must not be replayed into the new database.
            logger.warning("invocation log %s was removed or replaced; recreating it", self.path)
            self.reopens += 1
            await self._drop()
        if self._db is None:
            # On the lookup path: wait no longer for a lock than a row write would.
            return await self._connect(migrate_timeout_s=self._busy_timeout_s)
        return self._db

    async def _transaction(self, work: Work[T], *, one_statement: bool = False) -> T:
        """``work`` in one transaction; on failure roll back (or drop a broken connection) and re-raise.

        ``one_statement``: ``work`` runs a single statement, which is its own transaction on this
        autocommit connection; the BEGIN and COMMIT round trips are left out.
        """
        db = await self._connection()
        try:
            if not one_statement:
                await db.execute("BEGIN")
            result = await work(db)
            if not one_statement:
                await db.commit()
        except _WRITE_ERRORS as exc:
            try:
                # Nothing to undo after a failed single statement (SQLite rolled it back): a no-op then.
                await db.rollback()
            except _WRITE_ERRORS:
                # The connection itself is broken (I/O error, closed): start afresh on the next call.
                logger.warning("invocation log connection dropped after: %s", _describe(exc))
                await self._drop()
            raise
        return result

    async def _locked(self, work: Callable[[], Awaitable[T]]) -> T:
        """``work()`` under the lock, in a task that runs to its end even if the caller is cancelled.

        A cancelled await of an aiosqlite statement would leave the transaction open on the
        connection, holding the write lock, and the next call's row would commit in it.
        """

        async def run() -> T:
            async with self._lock:
                return await work()

        return await asyncio.shield(run())

    # -- writing -------------------------------------------------------------------------
    async def record(self, record: InvocationRecord) -> bool:
        """Commit one row (and any queued memory); False if it could not be written. Never raises."""
        row = row_of(record, log_queries=self.log_queries)
        return await self._locked(lambda: self._record(record.ts, row))

    async def _record(self, ts: float, row: tuple[Any, ...]) -> bool:
        memory, gap = self._memory.take(), self._gap
        single = call_write.parameters(row, memory) if gap is None else None

        async def work(db: aiosqlite.Connection) -> None:
            if single is not None:
                await db.execute(call_write.STATEMENT, single)
                return
            await db.execute(INSERT, row)
            await _write_side_tables(db, memory, gap)

        try:
            await self._transaction(work, one_statement=single is not None)
        except _WRITE_ERRORS as exc:
            self._memory.put_back(memory)
            self._failed(ts, exc)
            return False
        self._gap = None
        self._after_commit()
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
        if (
            time.monotonic() >= self._retry_at
            and log_retention.wal_bytes(self.path) >= log_retention.CHECKPOINT_WAL_BYTES
        ):
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
        # On a connection of its own, not the log's: the next row must not queue behind it.
        try:
            if not await log_retention.checkpoint(self.path):
                self._retry_at = time.monotonic() + log_retention.CHECKPOINT_RETRY_S
        except sqlite3.Error as exc:
            logger.warning("invocation log checkpoint skipped: %s", exc)

    async def prune(self, retention: Retention) -> Pruned:
        """Apply ``retention`` as of the log's clock, one batch per transaction.

        The lock is taken per batch, so the rows of calls made meanwhile are written between them.
        """
        now = self._clock()

        async def step(db: aiosqlite.Connection) -> Pruned:
            return await log_retention.prune_step(db, retention, now)

        total = Pruned(0, 0, 0)
        while True:
            done = await self._locked(lambda: self._transaction(step))
            total = Pruned(total.rows + done.rows, total.gaps + done.gaps, total.memories + done.memories)
            if done.rows < log_retention.BATCH:
                return total

    # -- action memory ---------------------------------------------------------------------
    def queue_memory(self, session_key: str, state: str | None) -> None:
        """Remember a session's latest state, opaque JSON (None: forget it); written with the next row."""
        self._memory.queue(session_key, state)

    async def load_memories(self, ttl_seconds: float) -> list[tuple[str, str, float]]:
        """Sessions seen within the TTL, as (session_key, memory, age_seconds); expired rows are deleted."""
        now = self._clock()
        cutoff = now - ttl_seconds

        async def work(db: aiosqlite.Connection) -> list[tuple[str, str, float]]:
            return await session_memory_store.load(db, cutoff)

        try:
            rows = await self._locked(lambda: self._transaction(work))
        except _WRITE_ERRORS:
            logger.exception("could not restore action memory from %s; starting empty", self.path)
            return []
        return [(key, state, max(0.0, now - last_seen)) for key, state, last_seen in rows]

    # -- tests and diagnostics -------------------------------------------------------------
    async def execute_on_connection(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """For tests and diagnostics, not the call path: one statement on the log's own connection.

        Runs in order with the rows, and is committed; returns the rows it produced.
        Per-connection settings (``PRAGMA max_page_count``, ...) stay in effect for the rows that
        follow. Unlike ``record``, errors propagate.
        """

        async def work(db: aiosqlite.Connection) -> list[tuple[Any, ...]]:
            return [tuple(row) for row in await db.execute_fetchall(sql, parameters)]

        return await self._locked(lambda: self._transaction(work))

    # -- shutdown --------------------------------------------------------------------------
    async def close(self) -> None:
        """Write queued memory states, close the connection and end its thread (never raises)."""
        await self._locked(self._close)

    async def _close(self) -> None:
        # Rows of calls still being written hold or wait for the lock: they are committed first.
        if self._checkpointing is not None:
            await self._checkpointing
        memory, gap = self._memory.take(), self._gap
        try:
            if memory or gap is not None:
                await self._transaction(lambda db: _write_side_tables(db, memory, gap))
                self._gap = None
        except _WRITE_ERRORS:
            logger.exception("could not write the last action-memory states to %s", self.path)
        finally:
            await self._drop()
