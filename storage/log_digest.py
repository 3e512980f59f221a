"""Running aggregates of the invocation log, per hour and per session, kept up to date by new rows only.

The console's overview and sessions pages summarise the whole log. Aggregating 100,000 rows in
SQL took 0.5-2 s a page (each row holds ~1 KB of retrieval details, and a percentile sorts the
window): too slow to answer a page, and long scans beside a live writer. The digest reads each
row once, by id, through a read-only aiosqlite connection (storage.log_reads), and folds it into
hourly totals and per-session totals; every later page reads only the rows written since.

Latency percentiles come from a histogram per hour with 40 logarithmic bins per decade, so a
p50 or p95 is exact to within ~3% (the bin's geometric centre is reported).
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import aiosqlite
import numpy as np

from storage.log_reads import LOOKUP

BLOCKED = "circuit_open"
WATER_ORDER = ("LOW", "MEDIUM", "HIGH")
HOUR = 3600
DAY = 86400
# Latency bins: 10 µs to 1000 s, 40 per decade.
_EDGES = np.logspace(-2, 6, 8 * 40 + 1)
_CHUNK = 5000
_COLUMNS = (
    "SELECT id, ts, session_key, tool_name, relevance_level, dedup_reason, water_level, next_call,"
    " call_index, json_array_length(result_doc_keys), json_extract(retrieval_details, '$.content_tokens'),"
    " latency_ms, error IS NOT NULL FROM tool_invocation WHERE id > ? ORDER BY id"
)


@dataclass
class HourTotals:
    """The calls of one hour."""

    calls: int = 0
    lookups: int = 0
    blocked: int = 0
    tiers: Counter[str] = field(default_factory=Counter)
    errors_by_tool: Counter[str] = field(default_factory=Counter)
    latency: np.ndarray = field(default_factory=lambda: np.zeros(len(_EDGES) - 1, dtype=np.int64))


@dataclass
class SessionRow:
    """One session: its calls, what it was given, and where governance stopped it."""

    session_key: str
    first_ts: float
    last_ts: float
    calls: int = 0
    lookups: int = 0
    documents: int = 0
    content_tokens: int = 0
    water_rank: int = 0
    blocked: int = 0
    stopped_at: int | None = None  # the call_index of the first lookup answered with next_call STOP

    @property
    def water_level(self) -> str | None:
        return WATER_ORDER[self.water_rank - 1] if self.water_rank else None


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


def _percentile(histogram: np.ndarray, p: float) -> float | None:
    """Nearest-rank percentile of a latency histogram: the geometric centre of its bin."""
    total = int(histogram.sum())
    if not total:
        return None
    index = int(np.searchsorted(np.cumsum(histogram), max(1, math.ceil(p * total))))
    return round(float(math.sqrt(_EDGES[index] * _EDGES[index + 1])), 3)


class LogDigest:
    """Hourly and per-session totals of one log file, brought up to date by ``refresh``."""

    def __init__(self) -> None:
        self.last_id = 0
        self.hours: dict[int, HourTotals] = {}
        self.sessions: dict[str, SessionRow] = {}
        self._lock = asyncio.Lock()

    async def refresh(self, conn: aiosqlite.Connection) -> None:
        """Fold in the rows written since the last refresh (all of them the first time)."""
        async with self._lock:
            while True:
                async with conn.execute(_COLUMNS + " LIMIT ?", (self.last_id, _CHUNK)) as cursor:
                    rows = list(await cursor.fetchall())
                if not rows:
                    return
                # Python over thousands of rows: on a thread, so the event loop keeps serving.
                await asyncio.to_thread(self._fold, rows)

    def _fold(self, rows: Iterable[Any]) -> None:
        for row in rows:
            (
                row_id,
                ts,
                session_key,
                tool,
                tier,
                dedup,
                water,
                next_call,
                index,
                docs,
                tokens,
                latency,
                error,
            ) = row
            self.last_id = max(self.last_id, int(row_id))
            hour = self.hours.setdefault(int(ts // HOUR), HourTotals())
            hour.calls += 1
            if error:
                hour.errors_by_tool[str(tool)] += 1
            if tool == LOOKUP:
                hour.lookups += 1
                hour.latency[min(max(int(np.searchsorted(_EDGES, latency)) - 1, 0), len(_EDGES) - 2)] += 1
                if tier:
                    hour.tiers[str(tier)] += 1
                hour.blocked += dedup == BLOCKED
            if session_key is not None:
                self._fold_session(
                    str(session_key), float(ts), tool == LOOKUP, dedup, water, next_call, index, docs, tokens
                )

    def _fold_session(
        self,
        key: str,
        ts: float,
        lookup: bool,
        dedup: Any,
        water: Any,
        next_call: Any,
        index: Any,
        docs: Any,
        tokens: Any,
    ) -> None:
        session = self.sessions.get(key)
        if session is None:
            session = self.sessions[key] = SessionRow(key, ts, ts)
        session.last_ts = max(session.last_ts, ts)
        session.calls += 1
        session.lookups += lookup
        session.documents += int(docs or 0)
        session.content_tokens += int(tokens or 0)
        if water in WATER_ORDER:
            session.water_rank = max(session.water_rank, WATER_ORDER.index(water) + 1)
        session.blocked += dedup == BLOCKED
        if next_call == "STOP" and session.stopped_at is None and index is not None:
            session.stopped_at = int(index)

    def overview(self, since: float | None) -> Overview:
        """The window's figures (from the hour ``since`` falls in), per hour up to 3 days, else per day."""
        first_hour = int(since // HOUR) if since is not None else None
        hours = {h: t for h, t in self.hours.items() if first_hour is None or h >= first_hour}
        span = (max(hours) - min(hours) + 1) * HOUR if hours else 0
        bucket = HOUR if span <= 3 * DAY else DAY
        calls: Counter[int] = Counter()
        tiers: dict[int, Counter[str]] = {}
        latency: dict[int, np.ndarray] = {}
        errors: Counter[str] = Counter()
        for hour, totals in hours.items():
            b = hour * HOUR // bucket
            calls[b] += totals.calls
            tiers.setdefault(b, Counter()).update(totals.tiers)
            latency[b] = latency.get(b, 0) + totals.latency
            errors.update(totals.errors_by_tool)
        everything = sum(latency.values(), np.zeros(len(_EDGES) - 1, dtype=np.int64))
        active = self.active_sessions(since)
        water = Counter(s.water_level or "none" for s in active)
        return Overview(
            bucket_seconds=bucket,
            calls=dict(calls),
            tiers={b: dict(c) for b, c in tiers.items()},
            latency={
                b: (_percentile(h, 0.5) or 0.0, _percentile(h, 0.95) or 0.0) for b, h in latency.items()
            },
            total_calls=sum(t.calls for t in hours.values()),
            lookups=sum(t.lookups for t in hours.values()),
            p50_ms=_percentile(everything, 0.5),
            p95_ms=_percentile(everything, 0.95),
            blocked=sum(t.blocked for t in hours.values()),
            refused=sum(errors.values()),
            errors_by_tool=dict(errors),
            water_levels=dict(water),
            sessions=len(active),
        )

    def active_sessions(self, since: float | None, limit: int | None = None) -> list[SessionRow]:
        """Sessions with a call in the window, most recently active first (their totals are whole)."""
        active = [s for s in self.sessions.values() if since is None or s.last_ts >= since]
        active.sort(key=lambda s: s.last_ts, reverse=True)
        return active[:limit] if limit is not None else active
