"""Aggregates of the invocation log for the web console and the report's document usage.

Every figure is computed in SQL on a read-only aiosqlite connection (storage.log_reads), so a
page over a long log fetches tens of rows, not the log.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import aiosqlite

from storage.log_reads import LOOKUP, READ_TOOLS, fetch

BLOCKED = "circuit_open"
WATER_ORDER = ("LOW", "MEDIUM", "HIGH")
_WATER_RANK = "CASE water_level WHEN 'LOW' THEN 1 WHEN 'MEDIUM' THEN 2 WHEN 'HIGH' THEN 3 ELSE 0 END"


@dataclass(frozen=True)
class DocumentUsage:
    """How one document was delivered in the window."""

    doc_key: str
    delivered: int = 0
    sessions: int = 0
    precise: int = 0
    highly_relevant: int = 0
    reference: int = 0
    read_further: int = 0


@dataclass(frozen=True)
class Overview:
    """The overview page's figures: per time bucket, and for the whole window."""

    bucket_seconds: int
    calls: dict[int, int] = field(default_factory=dict)
    tiers: dict[int, dict[str, int]] = field(default_factory=dict)
    latency: dict[int, tuple[float, float]] = field(default_factory=dict)
    total_calls: int = 0
    lookups: int = 0
    p50_ms: float | None = None
    p95_ms: float | None = None
    blocked: int = 0
    refused: int = 0
    errors_by_tool: dict[str, int] = field(default_factory=dict)
    water_levels: dict[str, int] = field(default_factory=dict)
    sessions: int = 0


@dataclass(frozen=True)
class SessionRow:
    """One session: its calls, what it was given, and where governance stopped it."""

    session_key: str
    first_ts: float
    last_ts: float
    calls: int
    lookups: int
    documents: int
    content_tokens: int
    water_level: str | None
    blocked: int
    stopped_at: int | None  # the call_index of the first lookup answered with next_call STOP


def _window(since: float | None, table: str = "") -> tuple[str, tuple[Any, ...]]:
    """The window's condition on ``ts`` (of ``table``, when given) and its bound values."""
    column = f"{table}.ts" if table else "ts"
    return (f"{column} >= ?", (since,)) if since is not None else ("1", ())


async def document_usage(conn: aiosqlite.Connection, since: float | None) -> dict[str, DocumentUsage]:
    """Deliveries per document by tier, and reads of more of it after a lookup delivered it."""
    where, params = _window(since, "t")
    delivered = await fetch(
        conn,
        "SELECT j.value, COUNT(*), COUNT(DISTINCT t.session_key),"
        " SUM(t.relevance_level = 'PRECISE'), SUM(t.relevance_level = 'HIGHLY_RELEVANT'),"
        " SUM(t.relevance_level = 'REFERENCE')"
        f" FROM tool_invocation t, json_each(t.result_doc_keys) j WHERE {where} AND t.tool_name = ?"
        " GROUP BY j.value",
        (*params, LOOKUP),
    )
    marks = ", ".join("?" for _ in READ_TOOLS)
    where, params = _window(since, "r")
    further = await fetch(
        conn,
        "SELECT j.value, COUNT(*) FROM tool_invocation r, json_each(r.result_doc_keys) j"
        f" WHERE {where} AND r.tool_name IN ({marks}) AND r.session_key IS NOT NULL AND EXISTS ("
        " SELECT 1 FROM tool_invocation l, json_each(l.result_doc_keys) k"
        " WHERE l.session_key = r.session_key AND l.id < r.id AND l.tool_name = ? AND k.value = j.value)"
        " GROUP BY j.value",
        (*params, *READ_TOOLS, LOOKUP),
    )
    reads = {key: int(count) for key, count in further}
    usage = {
        key: DocumentUsage(key, int(n), int(s), int(p or 0), int(h or 0), int(r or 0), reads.pop(key, 0))
        for key, n, s, p, h, r in delivered
    }
    return usage


def _bucket_seconds(first: float | None, last: float | None) -> int:
    """Hours for a window of up to three days, else days."""
    if first is None or last is None or last - first <= 3 * 86400:
        return 3600
    return 86400


async def _latency_by_bucket(
    conn: aiosqlite.Connection, where: str, params: tuple[Any, ...], bucket: int
) -> dict[int, tuple[float, float]]:
    """Nearest-rank p50 and p95 of lookup latency per bucket, with window functions."""
    rows = await fetch(
        conn,
        "SELECT b, MIN(CASE WHEN rn >= CEIL(0.5 * n) THEN latency_ms END),"
        " MIN(CASE WHEN rn >= CEIL(0.95 * n) THEN latency_ms END) FROM ("
        f" SELECT CAST(ts / {bucket} AS INTEGER) AS b, latency_ms,"
        " ROW_NUMBER() OVER (PARTITION BY CAST(ts / "
        f"{bucket} AS INTEGER) ORDER BY latency_ms) AS rn,"
        f" COUNT(*) OVER (PARTITION BY CAST(ts / {bucket} AS INTEGER)) AS n"
        f" FROM tool_invocation WHERE {where} AND tool_name = ?) GROUP BY b",
        (*params, LOOKUP),
    )
    return {int(b): (float(p50), float(p95)) for b, p50, p95 in rows}


async def _percentiles(
    conn: aiosqlite.Connection, where: str, params: tuple[Any, ...], count: int
) -> tuple[float | None, float | None]:
    if not count:
        return None, None
    found = []
    for p in (0.50, 0.95):
        offset = max(0, math.ceil(p * count) - 1)
        rows = await fetch(
            conn,
            f"SELECT latency_ms FROM tool_invocation WHERE {where} AND tool_name = ?"
            " ORDER BY latency_ms LIMIT 1 OFFSET ?",
            (*params, LOOKUP, offset),
        )
        found.append(float(rows[0][0]) if rows else None)
    return found[0], found[1]


async def overview(conn: aiosqlite.Connection, since: float | None) -> Overview:
    """Calls and tiers per hour (or day), latency, refusals and the water levels sessions reached."""
    where, params = _window(since)
    ((first, last, total, lookups, blocked, refused),) = await fetch(
        conn,
        "SELECT MIN(ts), MAX(ts), COUNT(*), COALESCE(SUM(tool_name = ?), 0),"
        " COALESCE(SUM(dedup_reason = ?), 0), COALESCE(SUM(error IS NOT NULL), 0)"
        f" FROM tool_invocation WHERE {where}",
        (LOOKUP, BLOCKED, *params),
    )
    bucket = _bucket_seconds(first, last)
    calls = await fetch(
        conn,
        f"SELECT CAST(ts / {bucket} AS INTEGER), COUNT(*) FROM tool_invocation WHERE {where} GROUP BY 1",
        params,
    )
    tiers: dict[int, dict[str, int]] = {}
    for b, level, count in await fetch(
        conn,
        f"SELECT CAST(ts / {bucket} AS INTEGER), relevance_level, COUNT(*) FROM tool_invocation"
        f" WHERE {where} AND tool_name = ? AND relevance_level IS NOT NULL GROUP BY 1, 2",
        (*params, LOOKUP),
    ):
        tiers.setdefault(int(b), {})[str(level)] = int(count)
    errors = await fetch(
        conn,
        f"SELECT tool_name, COUNT(*) FROM tool_invocation WHERE {where} AND error IS NOT NULL GROUP BY 1",
        params,
    )
    water = await fetch(
        conn,
        f"SELECT top, COUNT(*) FROM (SELECT MAX({_WATER_RANK}) AS top FROM tool_invocation"
        f" WHERE {where} AND session_key IS NOT NULL GROUP BY session_key) GROUP BY top",
        params,
    )
    p50, p95 = await _percentiles(conn, where, params, int(lookups))
    return Overview(
        bucket_seconds=bucket,
        calls={int(b): int(n) for b, n in calls},
        tiers=tiers,
        latency=await _latency_by_bucket(conn, where, params, bucket),
        total_calls=int(total),
        lookups=int(lookups),
        p50_ms=p50,
        p95_ms=p95,
        blocked=int(blocked),
        refused=int(refused),
        errors_by_tool={str(tool): int(n) for tool, n in errors},
        water_levels={(WATER_ORDER[int(top) - 1] if top else "none"): int(n) for top, n in water},
        sessions=sum(int(n) for _, n in water),
    )


async def sessions(conn: aiosqlite.Connection, since: float | None, *, limit: int = 100) -> list[SessionRow]:
    """The most recently active sessions, with what they were given and where they were stopped."""
    where, params = _window(since)
    rows = await fetch(
        conn,
        "SELECT session_key, MIN(ts), MAX(ts), COUNT(*), SUM(tool_name = ?),"
        " SUM(json_array_length(result_doc_keys)),"
        " SUM(COALESCE(json_extract(retrieval_details, '$.content_tokens'), 0)),"
        f" MAX({_WATER_RANK}), SUM(dedup_reason = ?),"
        " MIN(CASE WHEN next_call = 'STOP' THEN call_index END)"
        f" FROM tool_invocation WHERE {where} AND session_key IS NOT NULL"
        " GROUP BY session_key ORDER BY MAX(ts) DESC LIMIT ?",
        (LOOKUP, BLOCKED, *params, limit),
    )
    return [
        SessionRow(
            session_key=str(key),
            first_ts=float(first),
            last_ts=float(last),
            calls=int(calls),
            lookups=int(lookups or 0),
            documents=int(docs or 0),
            content_tokens=int(tokens or 0),
            water_level=WATER_ORDER[int(top) - 1] if top else None,
            blocked=int(blocked or 0),
            stopped_at=int(stop) if stop is not None else None,
        )
        for key, first, last, calls, lookups, docs, tokens, top, blocked, stop in rows
    ]


async def session_calls(
    conn: aiosqlite.Connection, session_key: str, *, limit: int = 200
) -> list[dict[str, Any]]:
    """One session's calls in order: tool, tier, documents, water level and next call."""
    rows = await fetch(
        conn,
        "SELECT ts, tool_name, query, relevance_level, dedup_reason, water_level, next_call, call_index,"
        " result_doc_keys, error IS NOT NULL FROM tool_invocation WHERE session_key = ? ORDER BY id LIMIT ?",
        (session_key, limit),
    )
    keys = ("ts", "tool", "query", "tier", "dedup", "water_level", "next_call", "call_index", "docs", "error")
    calls = [dict(zip(keys, row, strict=True)) for row in rows]
    for call in calls:
        call["docs"] = json.loads(call["docs"] or "[]")
    return calls
