"""Keeping the invocation log bounded: retention of old rows and a WAL that is checkpointed.

A lookup row is about 2.1 KB (most of it ``retrieval_details``) plus its index entries, so a log
that keeps everything grows without end. ``prune_step`` deletes, in batches so that no
transaction holds the write lock for long, the rows older than the retention period and those beyond the
newest ``max_rows``, and the gaps older than the period. The session memory has its own TTL
and is pruned with it. Each step is one transaction; the log writes new rows between steps.

The WAL grows by about 18 KB per commit (the row's pages and its two indexes) until a
checkpoint copies it into the database and empties it; ``journal_size_limit`` bounds what a
checkpoint that could not empty it (a reader in another process) leaves behind. Every
process checks the WAL's size after its commits (``wal_bytes``), so a data directory shared by
several processes is checkpointed as often as one used by a single process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import aiosqlite

# A checkpoint runs once the WAL is this large, or this long after the last one with commits since.
CHECKPOINT_WAL_BYTES = 1024 * 1024
CHECKPOINT_INTERVAL_S = 30.0
# What the WAL file is truncated to once a checkpoint has reset it (SQLite's journal_size_limit).
JOURNAL_SIZE_LIMIT_BYTES = 4 * 1024 * 1024
# How long a row's write waits for the lock before the row is given up (storage.invocation_log).
WRITE_BUSY_TIMEOUT_S = 0.1
# How long a checkpoint waits for the lock and for readers: well under the writers' wait, as a
# checkpoint holds the lock while it waits.
CHECKPOINT_BUSY_TIMEOUT_S = WRITE_BUSY_TIMEOUT_S / 5
# After a checkpoint that a reader kept from emptying the WAL, the WAL stays over
# CHECKPOINT_WAL_BYTES: the next one waits this long instead of starting after every commit.
CHECKPOINT_RETRY_S = 1.0
# Rows deleted per transaction: a few milliseconds of write lock each.
BATCH = 2000


@dataclass(frozen=True)
class Retention:
    """What the log keeps: rows younger than ``days`` (None: any age), at most ``max_rows`` (None: any number)."""

    days: float | None
    max_rows: int | None
    memory_ttl_s: float | None = None


@dataclass(frozen=True)
class Pruned:
    rows: int
    gaps: int
    memories: int


def wal_bytes(path: Path) -> int:
    """The size of the database's write-ahead log (0 when there is none)."""
    try:
        return os.stat(f"{path}-wal").st_size
    except FileNotFoundError:
        return 0


async def _delete_batch(db: aiosqlite.Connection, where: str, parameters: tuple[float | int, ...]) -> int:
    cursor = await db.execute(
        f"DELETE FROM tool_invocation WHERE id IN (SELECT id FROM tool_invocation WHERE {where} LIMIT ?)",
        (*parameters, BATCH),
    )
    return cursor.rowcount


async def _deleted(db: aiosqlite.Connection, sql: str, cutoff: float) -> int:
    return (await db.execute(sql, (cutoff,))).rowcount


async def prune_step(db: aiosqlite.Connection, retention: Retention, now: float) -> Pruned:
    """One batch of pruning as of ``now`` (unix seconds): at most BATCH rows; call until it deletes none.

    The caller commits: one batch per transaction, so the rows of new calls get in between.
    """
    rows = gaps = memories = 0
    if retention.days is not None:
        cutoff = now - retention.days * 86400
        rows = await _delete_batch(db, "ts < ?", (cutoff,))
        gaps = await _deleted(db, "DELETE FROM log_gap WHERE last_ts < ?", cutoff)
    if retention.max_rows is not None and rows < BATCH:
        newest_dropped = await (
            await db.execute(
                "SELECT id FROM tool_invocation ORDER BY id DESC LIMIT 1 OFFSET ?", (retention.max_rows,)
            )
        ).fetchone()
        if newest_dropped is not None:
            rows += await _delete_batch(db, "id <= ?", (newest_dropped[0],))
    if retention.memory_ttl_s is not None:
        cutoff = now - retention.memory_ttl_s
        memories = await _deleted(db, "DELETE FROM session_memory WHERE last_seen < ?", cutoff)
    return Pruned(rows, gaps, memories)


async def checkpoint(path: Path) -> bool:
    """Copy the WAL into the database and empty it, on a connection of its own; False if a reader
    (or a writer, past the busy timeout) kept it from being emptied: the next checkpoint tries again.

    PASSIVE alone never blocked the writer, but under a steady stream of rows it never caught up
    with the end of the WAL, so the WAL was never started again: 2,000 rows left it at 36.5 MB.
    TRUNCATE alone held the write lock for the whole copy and the database's fsync: on this
    machine's virtual disk two such checkpoints took 180 and 206 ms, past the writers'
    WRITE_BUSY_TIMEOUT_S, and the row written during each was given up. So the copy and its fsync run first as PASSIVE, beside the
    writers; then TRUNCATE, holding the lock, copies only the rows written during that copy and
    empties the WAL. TRUNCATE also holds the lock while it waits for readers of older snapshots
    (a console page reading a large log at idle priority) to end, for as long as its busy
    timeout: so it runs only when PASSIVE found no such reader, and that timeout is
    CHECKPOINT_BUSY_TIMEOUT_S, well under the writers' own.
    """
    async with aiosqlite.connect(path, timeout=CHECKPOINT_BUSY_TIMEOUT_S) as db:
        await db.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}")
        _, frames, copied = await _checkpoint(db, "PASSIVE")
        if copied < frames:  # a reader's older snapshot still needs the frames past it
            return False
        busy, _, _ = await _checkpoint(db, "TRUNCATE")
        return not busy


async def _checkpoint(db: aiosqlite.Connection, mode: str) -> tuple[int, int, int]:
    """``PRAGMA wal_checkpoint(mode)``: (busy, frames in the WAL, frames copied)."""
    async with db.execute(f"PRAGMA wal_checkpoint({mode})") as cursor:
        row = await cursor.fetchone()
    assert row is not None  # the pragma always answers one row
    return int(row[0]), int(row[1]), int(row[2])
