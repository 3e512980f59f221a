"""Read-only aggregate queries over the invocation log, for ``stats`` and knowledge://stats.

They open their own read-only aiosqlite connection (WAL lets them run beside a live server
without blocking its writes, and aiosqlite keeps them off the event loop of the server that
serves knowledge://stats) and aggregate in SQL, so a long log is summarised without loading it.
The ``stats`` command, which has no event loop, calls ``read_log_stats``.
"""

from __future__ import annotations

import asyncio
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite

from storage.log_reads import fetch, refuse_newer

LOOKUP = "lookup_knowledge"
# Refusals that skip retrieval altogether (a closed session).
# Top similarities are counted in buckets this wide; the summary merges them for display.
SIMILARITY_BUCKET = 0.005


@dataclass(frozen=True)
class LogStats:
    """Raw aggregates of the rows in one window (all counts are row counts)."""

    path: str
    schema_version: int
    calls_by_tool: dict[str, int] = field(default_factory=dict)
    relevance_levels: dict[str | None, int] = field(default_factory=dict)
    dedup_reasons: dict[str | None, int] = field(default_factory=dict)
    # bucket index i covers [i * SIMILARITY_BUCKET, (i + 1) * SIMILARITY_BUCKET)
    similarity_buckets: dict[int, int] = field(default_factory=dict)
    calls_per_session: list[int] = field(default_factory=list)
    lookups_per_session: list[int] = field(default_factory=list)
    redundant_lookups: int = 0
    errors: int = 0
    # tool name (and "all") -> (p50, p95)
    latency_ms: dict[str, tuple[float, float]] = field(default_factory=dict)
    first_ts: float | None = None
    last_ts: float | None = None
    embedder: str | None = None
    thresholds: dict[str, float] | None = None
    missed_rows: int = 0


class _Window:
    """The WHERE clause of one summary: built from fixed fragments, values always bound."""

    def __init__(self, since: float | None, session_key: str | None) -> None:
        clauses: list[str] = []
        params: list[Any] = []
        if since is not None:
            clauses.append("ts >= ?")
            params.append(since)
        if session_key is not None:
            clauses.append("session_key = ?")
            params.append(session_key)
        self._clauses = clauses
        self.params = params

    def where(self, *extra: str) -> str:
        clauses = [*self._clauses, *extra]
        return (" WHERE " + " AND ".join(clauses)) if clauses else ""


async def _one(conn: aiosqlite.Connection, sql: str, params: list[Any]) -> Any:
    """The first row of one statement, or None."""
    rows = await fetch(conn, sql, tuple(params))
    return rows[0] if rows else None


async def _percentile(
    conn: aiosqlite.Connection, window: _Window, tool: str | None, p: float
) -> float | None:
    """Nearest-rank percentile of latency_ms, computed in SQL."""
    extra = ("tool_name = ?",) if tool else ()
    params = [*window.params, *([tool] if tool else [])]
    (count,) = await _one(conn, f"SELECT COUNT(*) FROM tool_invocation{window.where(*extra)}", params)
    if not count:
        return None
    offset = max(0, math.ceil(p * count) - 1)
    row = await _one(
        conn,
        f"SELECT latency_ms FROM tool_invocation{window.where(*extra)} ORDER BY latency_ms LIMIT 1 OFFSET ?",
        [*params, offset],
    )
    return float(row[0])


async def _latencies(
    conn: aiosqlite.Connection, window: _Window, tools: list[str]
) -> dict[str, tuple[float, float]]:
    result = {}
    for tool in [*tools, None]:
        p50, p95 = await _percentile(conn, window, tool, 0.50), await _percentile(conn, window, tool, 0.95)
        if p50 is not None and p95 is not None:
            result[tool or "all"] = (p50, p95)
    return result


async def _schema_version(conn: aiosqlite.Connection) -> int:
    """The highest applied version, 0 for an empty database."""
    exists = await fetch(conn, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'")
    if not exists:
        return 0
    (version,) = await _one(conn, "SELECT MAX(version) FROM schema_version", [])
    return int(version or 0)


async def log_stats(path: Path, *, since: float | None = None, session_key: str | None = None) -> LogStats:
    """Aggregate the log at ``path`` (an absent file is an empty log; it is never created here)."""
    if not path.exists():
        return LogStats(path=str(path), schema_version=0)
    async with aiosqlite.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0) as conn:
        version = await _schema_version(conn)
        refuse_newer(path, version)
        if version == 0:
            return LogStats(path=str(path), schema_version=0)
        return await _aggregate(conn, path, version, _Window(since, session_key), since)


def read_log_stats(path: Path, *, since: float | None = None, session_key: str | None = None) -> LogStats:
    """``log_stats`` for a synchronous caller (the ``stats`` command), on an event loop of its own."""

    def run() -> LogStats:
        return asyncio.run(log_stats(path, since=since, session_key=session_key))

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return run()
    # Called from a thread that runs a loop (a command invoked in-process): asyncio.run cannot
    # nest, so the read gets a thread and a loop of its own, and this caller waits, as it would
    # for a synchronous read.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


async def _aggregate(
    conn: aiosqlite.Connection, path: Path, version: int, w: _Window, since: float | None
) -> LogStats:
    lookup = f"tool_name = '{LOOKUP}'"

    async def grouped(column: str, *extra: str) -> dict[Any, int]:
        sql = f"SELECT {column}, COUNT(*) FROM tool_invocation{w.where(*extra)} GROUP BY 1"
        return {key: count for key, count in await fetch(conn, sql, tuple(w.params))}

    async def scalar(sql: str, params: list[Any] | None = None) -> Any:
        return (await _one(conn, sql, w.params if params is None else params))[0]

    calls_by_tool = await grouped("tool_name")
    per_session = await fetch(
        conn,
        f"SELECT COUNT(*), SUM(tool_name = '{LOOKUP}') FROM tool_invocation"
        f"{w.where('session_key IS NOT NULL')} GROUP BY session_key",
        tuple(w.params),
    )
    sim = "json_extract(retrieval_details, '$.l1_top_similarity')"
    latest = await _one(
        conn,
        "SELECT json_extract(retrieval_details, '$.embedder'), json_extract(retrieval_details, '$.thresholds')"
        f" FROM tool_invocation{w.where(lookup, 'retrieval_details IS NOT NULL')} ORDER BY id DESC LIMIT 1",
        w.params,
    )
    gap_where = " WHERE last_ts >= ?" if since is not None else ""
    return LogStats(
        path=str(path),
        schema_version=version,
        calls_by_tool=calls_by_tool,
        relevance_levels=await grouped("relevance_level", lookup),
        dedup_reasons=await grouped("dedup_reason", lookup),
        # The epsilon keeps 0.89 * 200 = 177.99999... in bucket 178.
        similarity_buckets=await grouped(
            f"CAST({sim} / {SIMILARITY_BUCKET} + 1e-9 AS INTEGER)", lookup, f"{sim} IS NOT NULL"
        ),
        calls_per_session=sorted(int(calls) for calls, _ in per_session),
        lookups_per_session=sorted(int(lookups) for _, lookups in per_session if lookups),
        redundant_lookups=await scalar(
            f"SELECT COUNT(*) FROM tool_invocation"
            f"{w.where(lookup, 'error IS NULL', 'json_array_length(result_doc_keys) = 0')}"
        ),
        errors=await scalar(f"SELECT COUNT(*) FROM tool_invocation{w.where('error IS NOT NULL')}"),
        latency_ms=await _latencies(conn, w, sorted(calls_by_tool)),
        first_ts=await scalar(f"SELECT MIN(ts) FROM tool_invocation{w.where()}"),
        last_ts=await scalar(f"SELECT MAX(ts) FROM tool_invocation{w.where()}"),
        embedder=latest[0] if latest else None,
        thresholds=json.loads(latest[1]) if latest and latest[1] else None,
        missed_rows=int(
            await scalar(f"SELECT COALESCE(SUM(missed), 0) FROM log_gap{gap_where}", [since] if since else [])
            if version >= 3
            else 0
        ),
    )
