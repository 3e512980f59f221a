"""Read-only aggregate queries over the invocation log, for ``stats`` and knowledge://stats.

They open their own read-only connection (WAL lets them run beside a live server without
blocking its writes) and aggregate in SQL, so a long log is summarised without loading it.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storage.schema import SchemaVersionError, current_version, latest_version

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


def _percentile(conn: sqlite3.Connection, window: _Window, tool: str | None, p: float) -> float | None:
    """Nearest-rank percentile of latency_ms, computed in SQL."""
    extra = ("tool_name = ?",) if tool else ()
    params = [*window.params, *([tool] if tool else [])]
    (count,) = conn.execute(f"SELECT COUNT(*) FROM tool_invocation{window.where(*extra)}", params).fetchone()
    if not count:
        return None
    offset = max(0, math.ceil(p * count) - 1)
    row = conn.execute(
        f"SELECT latency_ms FROM tool_invocation{window.where(*extra)} ORDER BY latency_ms LIMIT 1 OFFSET ?",
        [*params, offset],
    ).fetchone()
    return float(row[0])


def _latencies(conn: sqlite3.Connection, window: _Window, tools: list[str]) -> dict[str, tuple[float, float]]:
    result = {}
    for tool in [*tools, None]:
        p50, p95 = _percentile(conn, window, tool, 0.50), _percentile(conn, window, tool, 0.95)
        if p50 is not None and p95 is not None:
            result[tool or "all"] = (p50, p95)
    return result


def _open_read_only(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
    version = current_version(conn)
    if version > latest_version():
        conn.close()
        raise SchemaVersionError(
            f"log database {str(path)!r} is at schema version {version}, newer than this code knows "
            f"(latest {latest_version()}); upgrade lookup-knowledge-mcp"
        )
    return conn


def read_log_stats(path: Path, *, since: float | None = None, session_key: str | None = None) -> LogStats:
    """Aggregate the log at ``path`` (an absent file is an empty log; it is never created here)."""
    if not path.exists():
        return LogStats(path=str(path), schema_version=0)
    conn = _open_read_only(path)
    try:
        version = current_version(conn)
        if version == 0:
            return LogStats(path=str(path), schema_version=0)
        return _aggregate(conn, path, version, since, session_key)
    finally:
        conn.close()


def _aggregate(
    conn: sqlite3.Connection, path: Path, version: int, since: float | None, session_key: str | None
) -> LogStats:
    w = _Window(since, session_key)
    lookup = f"tool_name = '{LOOKUP}'"

    def grouped(column: str, *extra: str) -> dict[Any, int]:
        sql = f"SELECT {column}, COUNT(*) FROM tool_invocation{w.where(*extra)} GROUP BY 1"
        return {key: count for key, count in conn.execute(sql, w.params)}

    def scalar(sql: str, params: list[Any] | None = None) -> Any:
        return conn.execute(sql, w.params if params is None else params).fetchone()[0]

    calls_by_tool = grouped("tool_name")
    per_session = conn.execute(
        f"SELECT COUNT(*), SUM(tool_name = '{LOOKUP}') FROM tool_invocation"
        f"{w.where('session_key IS NOT NULL')} GROUP BY session_key",
        w.params,
    ).fetchall()
    sim = "json_extract(retrieval_details, '$.l1_top_similarity')"
    latest = conn.execute(
        "SELECT json_extract(retrieval_details, '$.embedder'), json_extract(retrieval_details, '$.thresholds')"
        f" FROM tool_invocation{w.where(lookup, 'retrieval_details IS NOT NULL')} ORDER BY id DESC LIMIT 1",
        w.params,
    ).fetchone()
    gap_where = " WHERE last_ts >= ?" if since is not None else ""
    return LogStats(
        path=str(path),
        schema_version=version,
        calls_by_tool=calls_by_tool,
        relevance_levels=grouped("relevance_level", lookup),
        dedup_reasons=grouped("dedup_reason", lookup),
        # The epsilon keeps 0.89 * 200 = 177.99999... in bucket 178.
        similarity_buckets=grouped(
            f"CAST({sim} / {SIMILARITY_BUCKET} + 1e-9 AS INTEGER)", lookup, f"{sim} IS NOT NULL"
        ),
        calls_per_session=sorted(int(calls) for calls, _ in per_session),
        lookups_per_session=sorted(int(lookups) for _, lookups in per_session if lookups),
        redundant_lookups=scalar(
            f"SELECT COUNT(*) FROM tool_invocation"
            f"{w.where(lookup, 'error IS NULL', 'json_array_length(result_doc_keys) = 0')}"
        ),
        errors=scalar(f"SELECT COUNT(*) FROM tool_invocation{w.where('error IS NOT NULL')}"),
        latency_ms=_latencies(conn, w, sorted(calls_by_tool)),
        first_ts=scalar(f"SELECT MIN(ts) FROM tool_invocation{w.where()}"),
        last_ts=scalar(f"SELECT MAX(ts) FROM tool_invocation{w.where()}"),
        embedder=latest[0] if latest else None,
        thresholds=json.loads(latest[1]) if latest and latest[1] else None,
        missed_rows=int(
            scalar(f"SELECT COALESCE(SUM(missed), 0) FROM log_gap{gap_where}", [since] if since else [])
            if version >= 3
            else 0
        ),
    )
