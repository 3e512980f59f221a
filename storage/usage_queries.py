"""Document usage and one session's calls, in SQL on a read-only aiosqlite connection (storage.log_reads).

The overview and session totals are kept by storage.log_digest instead: in SQL they scanned the
whole log on every page.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiosqlite

from storage.log_reads import LOOKUP, READ_TOOLS, fetch


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


_CALL_KEYS = (
    "ts",
    "tool",
    "query",
    "tier",
    "dedup",
    "water_level",
    "next_call",
    "call_index",
    "docs",
    "error",
)


async def session_calls(
    conn: aiosqlite.Connection, session_keys: Sequence[str], *, limit: int = 200
) -> dict[str, list[dict[str, Any]]]:
    """Each session's first ``limit`` calls in order: tool, tier, documents, water level and next call.

    One statement for all the sessions: a page of 50 sessions was 50 statements (and 50 hops to
    aiosqlite's thread) before.
    """
    if not session_keys:
        return {}
    marks = ", ".join("?" for _ in session_keys)
    rows = await fetch(
        conn,
        "SELECT session_key, ts, tool_name, query, relevance_level, dedup_reason, water_level, next_call,"
        " call_index, result_doc_keys, error IS NOT NULL FROM ("
        "SELECT *, ROW_NUMBER() OVER (PARTITION BY session_key ORDER BY id) AS n"
        f" FROM tool_invocation WHERE session_key IN ({marks})) WHERE n <= ? ORDER BY id",
        (*session_keys, limit),
    )
    calls: dict[str, list[dict[str, Any]]] = {key: [] for key in session_keys}
    for key, *values in rows:
        call = dict(zip(_CALL_KEYS, values, strict=True))
        call["docs"] = json.loads(call["docs"] or "[]")
        calls[key].append(call)
    return calls
