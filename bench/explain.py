"""Why a target was missed, from the same run's figures: what the profile shows and what would meet it."""

from __future__ import annotations

from typing import Any


def _g(data: Any, *path: str, default: Any = None) -> Any:
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return default
        data = data[key]
    return data


def _n(value: Any, digits: int = 1) -> str:
    return "?" if value is None else f"{value:.{digits}f}"


def explain(key: str, results: dict[str, Any]) -> str:
    """A sentence or three for the target ``key``; empty when there is nothing to add."""
    ref = _g(results, "lookup", str(results.get("reference_size")), default={})
    load = _g(results, "load", "start", default=[])
    cores = _g(results, "machine", "cores")
    busy = (
        f" The machine was shared during the run (load average {load[0]} on {cores} cores), which slows the"
        " model's two OpenMP threads most."
        if load and cores and load[0] > cores
        else ""
    )
    shares = _g(results, "profile", "shares", default={})
    commit_full = _g(results, "log_commit", "full", "median")
    commit_normal = _g(results, "log_commit", "normal", "median")
    rb = _g(ref, "repeat_and_blocked", default={})
    off = _g(ref, "repeat_and_blocked_log_off", default={})
    if key == "lookup":
        return (
            f"Its floor alone (query embedding {_n(_g(ref, 'embed_ms', 'median'))} ms + one search "
            f"{_n(_g(ref, 'search_ms', 'median'))} ms) is {_n(_g(ref, 'floor_ms', 'median'))} ms; the profile puts "
            f"{shares.get('query embedding', '?')}% of a lookup in the query embedding and "
            f"{shares.get('Milvus search', '?')}% in Milvus.{busy} The e5-small query encoding of a ~17-token "
            "question takes ~10.5 ms on this CPU even when idle, and Milvus Lite's search is pure Python "
            "(next rows), so 25 ms needs a faster store (a Milvus server through milvus.uri) and one search "
            "per lookup rather than one per language."
        )
    if key == "floor_ratio":
        return (
            f"Above the floor: the engine searches twice ({_g(ref, 'store_searches_per_lookup', default='?')} "
            "searches per lookup: the query's language and the other one apart, run side by side but "
            "sharing the interpreter lock, since Milvus Lite runs in-process in Python; "
            f"{_n(_g(ref, 'search_per_language_sequential_ms', 'median'))} ms raw one after the other), the "
            f"invocation-log commit ({_n(_g(ref, 'log_commit_ms', 'median'), 2)} ms median in the server, "
            "fsync on every commit), and the MCP client and server "
            f"({_n(_g(ref, 'lookup_main_thread_cpu_ms', 'median'), 2)} ms of event-loop CPU).{busy} "
            "One search per lookup would meet it; the log commit with synchronous=NORMAL would add margin."
        )
    if key in ("repeated", "blocked"):
        name = "repeated_ms" if key == "repeated" else "blocked_ms"
        return (
            f"No embedding and no search ran (work done: {rb.get('work_done')}). With the invocation log off "
            f"the same call takes {_n(_g(off, name, 'median'), 2)} ms; the log's commit costs "
            f"{_n(commit_full, 2)} ms with synchronous=FULL (fsync per call) against {_n(commit_normal, 2)} ms "
            "with NORMAL on this disk. Committing with synchronous=NORMAL under WAL (a row survives a process "
            "crash; only an OS crash can lose the last rows) would meet it."
        )
    if key == "ingest_ratio":
        return (
            "Ingestion adds discovery, front matter, Milvus upserts, catalog commits and the final flush to the "
            f"embedding.{busy}"
        )
    if key == "initialize":
        imports = _g(results, "cold_start", "interpreter_and_imports_ms", "median")
        return (
            f"Interpreter start and the serve path's imports alone take {_n(imports, 0)} ms (the mcp package "
            f"is most of it); the handshake and lifespan add the rest.{busy} Meeting it needs a lighter import "
            "path before the first read (deferring what initialize does not use)."
        )
    if key == "scaling":
        searches = {
            size: _g(r, "search_ms", "median")
            for size, r in sorted(_g(results, "lookup", default={}).items())
        }
        shown = ", ".join(f"{int(size):,}: {_n(ms)} ms" for size, ms in searches.items())
        return (
            f"The raw search alone grows about linearly ({shown}), and the engine makes two per lookup. "
            "Milvus Lite 3 is a pure-Python engine: besides the HNSW probe, every search builds a "
            "newest-version map and a visibility mask over every row of every segment in Python "
            "(milvus_lite/search/executor_indexed.py), which is O(N) per search whatever the index. "
            "Meeting it needs a store whose search cost is the index probe: a Milvus server "
            "(milvus.uri: http://host:19530; the same code)."
        )
    if key == "rss":
        return "Most of the resident memory is Milvus Lite's in-process engine with the collection loaded."
    if key == "governance":
        return "See the governance table for the per-trace figures."
    return ""
