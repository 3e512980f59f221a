"""The invocation log's previous write path, kept as the baseline of ``bench.log_bench``.

Until the log went back to aiosqlite, each call's write was one synchronous function on a plain
``sqlite3`` connection: the row, the session's memory state and the commit, in one transaction.
Under ``synchronous=NORMAL`` (the server's setting) it ran on the event loop itself when the
write lock was free, and otherwise as one hop to the log's own thread. This is that function
and its two ways of running, without the failure handling, on the same schema and rows.
"""

from __future__ import annotations

import asyncio
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from storage.invocation_record import INSERT
from storage.log_retention import JOURNAL_SIZE_LIMIT_BYTES
from storage.schema import migrate
from storage.session_memory_store import UPSERT


class PlainLog:
    """One transaction per call on a plain ``sqlite3`` connection, run inline or on one thread."""

    def __init__(self, path: Path) -> None:
        migrate(path)
        self._conn = sqlite3.connect(path, timeout=0.1, check_same_thread=False)
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("PRAGMA wal_autocheckpoint=0")
        self._conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT_BYTES}")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plain-log")

    def write(self, row: tuple[Any, ...], memory: tuple[str, str, float]) -> None:
        """The row and one memory state, then the commit (or the rollback)."""
        try:
            self._conn.execute(INSERT, row)
            self._conn.executemany(UPSERT, [memory])
            self._conn.commit()
        except sqlite3.Error:
            self._conn.rollback()
            raise

    async def on_thread(self, row: tuple[Any, ...], memory: tuple[str, str, float]) -> None:
        """``write`` as one hop to the log's thread, awaited once."""
        await asyncio.get_running_loop().run_in_executor(self._executor, self.write, row, memory)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._conn.close()
