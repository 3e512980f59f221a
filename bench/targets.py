"""The issue's targets, checked against one run's results."""

from __future__ import annotations

from typing import Any


def _get(data: dict[str, Any], *path: str) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: measured value, the bound, and whether it was met (None: not measured)."""
    ref = str(results["reference_size"])
    sizes = results.get("lookup", {})
    at_ref = sizes.get(ref, {})
    small, large = (str(min(map(int, sizes))), str(max(map(int, sizes)))) if sizes else ("", "")
    rows: list[dict[str, Any]] = []

    def add(
        key: str, measure: str, value: Any, bound: float, op: str, unit: str = "", note: str = ""
    ) -> None:
        met = None if value is None else (value <= bound if op == "<=" else value >= bound)
        rows.append(
            {
                "key": key,
                "measure": measure,
                "value": value,
                "target": f"{op} {bound:g}{unit}",
                "unit": unit,
                "met": met,
                "note": note,
            }
        )

    add("lookup", "warm lookup, median", _get(at_ref, "lookup_ms", "median"), 25, "<=", " ms")
    add(
        "floor_ratio",
        "lookup / (embed + search), median ratio",
        _get(at_ref, "lookup_over_floor", "ratio"),
        1.3,
        "<=",
    )
    work = _get(at_ref, "repeat_and_blocked", "work_done") or {}
    no_work = "no embedding and no search" if work and not any(work.values()) else f"work done: {work}"
    add(
        "repeated",
        "repeated-identical call, median",
        _get(at_ref, "repeat_and_blocked", "repeated_ms", "median"),
        2,
        "<=",
        " ms",
        no_work,
    )
    add(
        "blocked",
        "blocked call (after STOP), median",
        _get(at_ref, "repeat_and_blocked", "blocked_ms", "median"),
        2,
        "<=",
        " ms",
        no_work,
    )
    add(
        "ingest_ratio",
        "ingestion / embed-only throughput",
        _get(results, "ingest_ratio", "ingest_over_embed", "ratio"),
        0.8,
        ">=",
    )
    add(
        "initialize",
        "initialize answered after process start, median",
        _get(results, "cold_start", "initialize_ms", "median"),
        1500,
        "<=",
        " ms",
    )
    scaling = None
    if small and large and small != large:
        scaling = round(sizes[large]["lookup_ms"]["median"] / sizes[small]["lookup_ms"]["median"], 3)
    add("scaling", f"median lookup at {large} / at {small}", scaling, 2.0, "<=")
    rss = _get(results, "cold_start", "peak_rss_mb")
    rss_total = round(rss["process"] + rss["children"], 1) if rss else None
    add("rss", f"peak RSS serving {ref} chunks", rss_total, 600, "<=", " MB")
    add(
        "governance",
        "ISS-003 trace: content tokens governed / baseline",
        _get(results, "governance", "iss003_token_ratio"),
        0.3,
        "<=",
    )
    return rows
