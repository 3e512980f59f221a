"""Summaries of repeated measurements: median, p95 and the spread of the per-round medians."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks."""
    if not values:
        raise ValueError("percentile of an empty sample")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(rounds: Sequence[Sequence[float]], *, digits: int = 3) -> dict[str, Any]:
    """Median and p95 over every sample, and the spread of the rounds' medians.

    ``spread`` is (max - min) of the per-round medians; ``spread_pct`` relates it to the overall
    median. A large spread means the machine was busy during some rounds.
    """
    samples = [v for r in rounds for v in r]
    if not samples:
        raise ValueError("no samples to summarize")
    medians = [statistics.median(r) for r in rounds if r]
    median = statistics.median(samples)
    spread = max(medians) - min(medians)
    return {
        "n": len(samples),
        "rounds": len(medians),
        "median": round(median, digits),
        "p95": round(percentile(samples, 95), digits),
        "min": round(min(samples), digits),
        "round_medians": [round(m, digits) for m in medians],
        "spread": round(spread, digits),
        "spread_pct": round(100 * spread / median, 1) if median else None,
    }


def ratio_summary(
    numerators: Sequence[Sequence[float]], denominators: Sequence[Sequence[float]]
) -> dict[str, Any]:
    """median(numerator) / median(denominator), overall and per round (both measured in the same rounds)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"{len(numerators)} numerator rounds but {len(denominators)} denominator rounds")
    per_round = [
        statistics.median(n) / statistics.median(d)
        for n, d in zip(numerators, denominators, strict=True)
        if n and d
    ]
    overall = statistics.median([v for r in numerators for v in r]) / statistics.median(
        [v for r in denominators for v in r]
    )
    return {
        "ratio": round(overall, 3),
        "round_ratios": [round(r, 3) for r in per_round],
        "spread": round(max(per_round) - min(per_round), 3) if per_round else None,
    }
