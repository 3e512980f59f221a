"""The invocation-log summary: raw aggregates in, one JSON-ready dict out (plain Python, no I/O).

The same dict is printed by ``stats --json``, drawn by ``stats --png`` and served as
knowledge://stats.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from retrieval.models import BLOCKING_REASONS, Tier
from storage.stats_queries import LOOKUP, SIMILARITY_BUCKET, LogStats

# Display widths for the top-similarity histogram, finest first; the first that fits wins.
_BIN_WIDTHS = (0.005, 0.01, 0.02, 0.05, 0.1)
MAX_BINS = 24
NONE_KEY = "none"


@dataclass(frozen=True)
class Bin:
    start: float
    end: float
    count: int


def iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts is not None else None


def similarity_bins(buckets: dict[int, int], *, max_bins: int = MAX_BINS) -> tuple[float, list[Bin]]:
    """Merge fine buckets into at most max_bins contiguous bins over the observed range."""
    if not buckets:
        return _BIN_WIDTHS[0], []
    low, high = min(buckets) * SIMILARITY_BUCKET, (max(buckets) + 1) * SIMILARITY_BUCKET
    width = next((w for w in _BIN_WIDTHS if (high - low) / w <= max_bins), _BIN_WIDTHS[-1])
    per_bin = round(width / SIMILARITY_BUCKET)
    merged: dict[int, int] = {}
    for bucket, count in buckets.items():
        merged[bucket // per_bin] = merged.get(bucket // per_bin, 0) + count
    first, last = min(merged), max(merged)
    # Empty bins inside the range are kept, so the bars read as a histogram.
    return width, [
        Bin(round(i * width, 4), round((i + 1) * width, 4), merged.get(i, 0)) for i in range(first, last + 1)
    ]


def _spread(values: list[int]) -> dict[str, float | int | None]:
    return {
        "median": statistics.median(values) if values else None,
        "max": max(values) if values else None,
    }


def _keyed(counts: Mapping[Any, int], order: tuple[str, ...] = ()) -> dict[str, int]:
    """None becomes "none"; known keys first in their natural order, then by count."""
    named = {(key if key is not None else NONE_KEY): count for key, count in counts.items()}
    rank = {key: i for i, key in enumerate(order)}
    return dict(sorted(named.items(), key=lambda kv: (rank.get(kv[0], len(rank)), -kv[1], kv[0])))


def summarize(raw: LogStats, *, since: float | None = None, session_key: str | None = None) -> dict[str, Any]:
    """The summary of one window of the log."""
    lookups = raw.calls_by_tool.get(LOOKUP, 0)
    width, bins = similarity_bins(raw.similarity_buckets)
    blocked = {reason: raw.dedup_reasons.get(reason, 0) for reason in BLOCKING_REASONS}
    return {
        "log": {"path": raw.path, "schema_version": raw.schema_version},
        "window": {
            "since": iso(since),
            "session": session_key,
            "first_call": iso(raw.first_ts),
            "last_call": iso(raw.last_ts),
        },
        "calls": {"total": sum(raw.calls_by_tool.values()), "by_tool": _keyed(raw.calls_by_tool)},
        "lookups": lookups,
        "relevance_levels": _keyed(raw.relevance_levels, tuple(Tier)),
        "dedup_reasons": _keyed(raw.dedup_reasons, (NONE_KEY,)),
        "top_similarity": {
            "count": sum(raw.similarity_buckets.values()),
            "bin_width": width,
            "bins": [{"from": b.start, "to": b.end, "count": b.count} for b in bins],
            "embedder": raw.embedder,
        },
        # Probability cut-offs of the logistic tier models, not similarities: kept apart from the
        # similarity histogram, whose bins they do not divide.
        "tier_thresholds": raw.thresholds,
        "sessions": {
            "count": len(raw.calls_per_session),
            "calls_per_session": _spread(raw.calls_per_session),
            "lookups_per_session": _spread(raw.lookups_per_session),
        },
        "redundant_calls": {
            "count": raw.redundant_lookups,
            "lookups": lookups,
            "rate": round(raw.redundant_lookups / lookups, 4) if lookups else None,
        },
        "blocked_calls": {"count": sum(blocked.values()), "by_reason": blocked},
        "errors": raw.errors,
        "latency_ms": {
            tool: {"p50": round(p50, 3), "p95": round(p95, 3)} for tool, (p50, p95) in raw.latency_ms.items()
        },
        "missed_rows": raw.missed_rows,
    }


def tier_thresholds_line(thresholds: dict[str, Any] | None) -> str | None:
    """The tier models' cut-offs, said to be probabilities so nobody reads them as similarities."""
    marks = {name: value for name, value in (thresholds or {}).items() if isinstance(value, int | float)}
    if not marks:
        return None
    described = ", ".join(f"{name} {value}" for name, value in marks.items())
    return f"Tier models' probability cut-offs (latest lookup): {described}"
