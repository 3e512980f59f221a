"""Async read-only reads of the invocation log, for the gap report, the web console and stats.

Each read opens its own ``mode=ro`` aiosqlite connection, apart from the writer's
(storage.invocation_log): in WAL mode a reader never blocks the server's writes, and aiosqlite
keeps the query off the event loop, so a console page does not stall the lookups of the process
that serves it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from storage.schema import SchemaVersionError, latest_version

LOOKUP = "lookup_knowledge"
# The tools that read more of a document on purpose (the tool and the resource).
READ_TOOLS = ("read_knowledge_doc", "knowledge://doc")
HASH_PREFIX = "sha256:"


@dataclass(frozen=True)
class LookupRow:
    """One answered lookup, as the gap report reads it."""

    id: int
    ts: float
    session_key: str | None
    query: str | None
    domain: str | None
    missing_dimension: str | None
    relevance_level: str | None
    dedup_reason: str | None
    doc_keys: tuple[str, ...]

    @property
    def hashed(self) -> bool:
        """The query is a hash (``log.log_queries: false``): it has no text to show or embed."""
        return self.query is None or self.query.startswith(HASH_PREFIX)


@dataclass(frozen=True)
class ReadRow:
    """One read of more of a document (read_knowledge_doc or knowledge://doc)."""

    ts: float
    session_key: str | None
    doc_keys: tuple[str, ...]


def refuse_newer(path: Path, version: int) -> None:
    """SchemaVersionError if the log at ``path`` is at a version newer than this code knows."""
    if version > latest_version():
        raise SchemaVersionError(
            f"log database {str(path)!r} is at schema version {version}, newer than this code knows "
            f"(latest {latest_version()}); upgrade lookup-knowledge-mcp"
        )


@asynccontextmanager
async def read_only(path: Path) -> AsyncIterator[aiosqlite.Connection]:
    """A read-only connection to the log at ``path``; SchemaVersionError for a newer file."""
    conn = await aiosqlite.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    try:
        async with conn.execute("SELECT MAX(version) FROM schema_version") as cursor:
            row = await cursor.fetchone()
        refuse_newer(path, int(row[0] or 0) if row else 0)
        yield conn
    finally:
        await conn.close()


async def fetch(conn: aiosqlite.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """All rows of one statement (values always bound)."""
    async with conn.execute(sql, params) as cursor:
        return list(await cursor.fetchall())


def _since(since: float | None) -> tuple[str, tuple[Any, ...]]:
    return ("ts >= ?", (since,)) if since is not None else ("1", ())


async def answered_lookups(conn: aiosqlite.Connection, since: float | None) -> list[LookupRow]:
    """The lookups that ran retrieval and answered (no error, not refused by governance), in order."""
    where, params = _since(since)
    rows = await fetch(
        conn,
        "SELECT id, ts, session_key, query, domain_filter, missing_dimension, relevance_level,"
        " dedup_reason, result_doc_keys"
        f" FROM tool_invocation WHERE {where} AND tool_name = ? AND error IS NULL"
        " AND COALESCE(json_extract(retrieval_details, '$.blocked'), 0) = 0 ORDER BY id",
        (*params, LOOKUP),
    )
    # Building 100k rows of objects takes a while: off the event loop, beside the lookups.
    return await asyncio.to_thread(_lookup_rows, rows)


def _lookup_rows(rows: list[Any]) -> list[LookupRow]:
    return [
        LookupRow(
            id=row[0],
            ts=row[1],
            session_key=row[2],
            query=row[3],
            domain=row[4],
            missing_dimension=row[5],
            relevance_level=row[6],
            dedup_reason=row[7],
            doc_keys=tuple(json.loads(row[8] or "[]")),
        )
        for row in rows
    ]


async def document_reads(conn: aiosqlite.Connection, since: float | None) -> list[ReadRow]:
    """The reads of more of a document, in order."""
    where, params = _since(since)
    marks = ", ".join("?" for _ in READ_TOOLS)
    rows = await fetch(
        conn,
        f"SELECT ts, session_key, result_doc_keys FROM tool_invocation WHERE {where}"
        f" AND tool_name IN ({marks}) AND error IS NULL ORDER BY id",
        (*params, *READ_TOOLS),
    )
    return [ReadRow(row[0], row[1], tuple(json.loads(row[2] or "[]"))) for row in rows]


async def log_position(conn: aiosqlite.Connection) -> int:
    """The last row id: a cached report is stale once it moves."""
    rows = await fetch(conn, "SELECT COALESCE(MAX(id), 0) FROM tool_invocation")
    return int(rows[0][0])
