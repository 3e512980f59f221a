"""The issue's targets, checked against one run's results."""

from __future__ import annotations

from typing import Any


def _get(data: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _row(
    key: str, measure: str, value: Any, bound: float, op: str, unit: str = "", note: str = ""
) -> dict[str, Any]:
    """One target's row: the measured value against ``op bound`` (met is None when not measured)."""
    met = None if value is None else (value <= bound if op == "<=" else value >= bound)
    return {
        "key": key,
        "measure": measure,
        "value": value,
        "target": f"{op} {bound:g}{unit}",
        "unit": unit,
        "met": met,
        "note": note,
    }


def _incremental_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    inc = results.get("incremental") or {}
    steps = inc.get("steps", {})
    note = (
        f"{steps['one part edited']['embedded']} of {steps['first ingest']['embedded']} chunks embedded; "
        f"embedding seconds {inc.get('embed_seconds_share')}"
        if steps
        else ""
    )
    return [
        _row(
            "incremental",
            "edit 1 of 12 parts of a long document: model tokens embedded / its first ingest",
            inc.get("token_share"),
            0.25,
            "<=",
            note=note,
        )
    ]


def _ingest_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    sample = _get(results, "ingest", "sample") or {}
    floor = _get(sample, "embed_only_s", "median")
    ingest_s = _get(sample, "ingest_s", "median")
    conversion = results.get("conversion") or {}
    return [
        _row(
            "sample_ingest",
            f"fresh ingest of the sample knowledge base ({_get(results, 'sample_kb', 'chunks')} chunks), median of {sample.get('runs')}",
            ingest_s,
            15,
            "<=",
            " s",
            f"embed-only on the same chunks: {floor} s" if floor is not None else "",
        ),
        _row(
            "sample_floor",
            "sample knowledge base: ingest / embed-only time (when embed-only alone exceeds 15 s)",
            round(ingest_s / floor, 3) if ingest_s and floor else None,
            1.1,
            "<=",
        ),
        _row(
            "ingest_ratio",
            "ingest / embed-only throughput at realistic lengths (sample knowledge base)",
            _get(sample, "ingest_over_embed", "ratio"),
            0.9,
            ">=",
            note=", ".join(
                f"{lang}: {_get(results, 'ingest', lang, 'ingest_over_embed', 'ratio')}"
                for lang in ("zh", "en")
                if _get(results, "ingest", lang)
            ),
        ),
        _row(
            "conversion_share",
            "mixed knowledge base: conversion seconds / ingest seconds (HTML, PDF, Word, PowerPoint), median",
            conversion.get("conversion_share"),
            0.15,
            "<=",
            note=", ".join(
                f"{suffix}: {row['convert_over_embed']} of its embedding"
                for suffix, row in (conversion.get("per_format") or {}).items()
            ),
        ),
    ]


def _lookup_rows(at_ref: dict[str, Any]) -> list[dict[str, Any]]:
    work = _get(at_ref, "repeat_and_blocked", "work_done") or {}
    no_work = "no embedding and no search" if work and not any(work.values()) else f"work done: {work}"
    return [
        _row("lookup", "warm lookup, median", _get(at_ref, "lookup_ms", "median"), 25, "<=", " ms"),
        _row(
            "floor_ratio",
            "lookup / (embed + one search), median ratio",
            _get(at_ref, "lookup_over_floor", "ratio"),
            1.3,
            "<=",
        ),
        _row(
            "repeated",
            "repeated-identical call, median",
            _get(at_ref, "repeat_and_blocked", "repeated_ms", "median"),
            2,
            "<=",
            " ms",
            no_work,
        ),
        _row(
            "blocked",
            "blocked call (session closed at HIGH water), median",
            _get(at_ref, "repeat_and_blocked", "blocked_ms", "median"),
            2,
            "<=",
            " ms",
            no_work,
        ),
    ]


def _serving_rows(results: dict[str, Any], ref: str) -> list[dict[str, Any]]:
    rss = _get(results, "cold_start", "peak_rss_mb")
    rss_total = round(rss["process"] + rss["children"], 1) if rss else None
    pages = _get(results, "console", "pages_ms") or {}
    slowest = max((p["p95"] for p in pages.values() if isinstance(p, dict) and "p95" in p), default=None)
    return [
        _row(
            "initialize",
            "initialize answered after process start, median",
            _get(results, "cold_start", "initialize_ms", "median"),
            1500,
            "<=",
            " ms",
        ),
        _row("rss", f"peak RSS serving {ref} chunks", rss_total, 600, "<=", " MB"),
        _row(
            "governance",
            "ISS-003 trace: content tokens governed / baseline",
            _get(results, "governance", "iss003_token_ratio"),
            0.3,
            "<=",
        ),
        _row("console", "slowest console page on a 100k-row log, p95", slowest, 300, "<=", " ms"),
    ]


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: measured value, the bound, and whether it was met (None: not measured)."""
    ref = str(results["reference_size"])
    at_ref = results.get("lookup_realistic", {}).get(ref, {})
    return [
        *_incremental_rows(results),
        *_ingest_rows(results),
        *_lookup_rows(at_ref),
        *_serving_rows(results, ref),
    ]
