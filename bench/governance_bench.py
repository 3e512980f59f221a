"""Governance payoff: the ``eval`` replay of the shipped traces, governed against ``--baseline``.

It runs the same code as ``lookup-knowledge-mcp eval TRACE --baseline`` (``server.cli.replay``), in
process so the model is loaded once, over the sample knowledge base ingested into a scratch
directory.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from server.cli.replay import read_trace, replay
from server.config.loading import load_settings
from server.container import open_runtime

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_KB = ROOT / "examples" / "knowledge"
TRACES = ROOT / "examples" / "traces"
ISS003 = "iss003-bouncing"


def measure(work: Path, embedder: Any) -> dict[str, Any]:
    """Per trace: calls, calls that ran a retrieval and content tokens, governed and baseline."""
    data = work / "sample-data"
    shutil.rmtree(data, ignore_errors=True)
    settings = load_settings(None, data_dir=data)
    runtime = open_runtime(settings, embedder=embedder)
    try:
        report = runtime.ingestor().run(SAMPLE_KB)
    finally:
        runtime.close()
    if report.failed:
        raise RuntimeError(f"the sample knowledge base failed to ingest: {report.failed[:3]}")
    rows: list[dict[str, Any]] = []
    for trace in sorted(TRACES.glob("*.jsonl")):
        steps = read_trace(trace)
        governed = asyncio.run(replay(settings, steps, embedder=embedder)).total
        baseline = asyncio.run(replay(settings, steps, baseline=True, embedder=embedder)).total
        rows.append(
            {
                "trace": trace.stem,
                "calls": governed.calls,
                "governed_retrievals": governed.retrievals,
                "baseline_retrievals": baseline.retrievals,
                "governed_tokens": governed.content_tokens,
                "baseline_tokens": baseline.content_tokens,
                "governed_store_searches": governed.store_searches,
                "baseline_store_searches": baseline.store_searches,
                "governed_duplicate_returns": governed.duplicate_returns,
                "baseline_duplicate_returns": baseline.duplicate_returns,
            }
        )
    shutil.rmtree(data, ignore_errors=True)
    iss003 = next((r for r in rows if r["trace"] == ISS003), None)
    ratio = (
        round(iss003["governed_tokens"] / iss003["baseline_tokens"], 3)
        if iss003 and iss003["baseline_tokens"]
        else None
    )
    return {"traces": rows, "iss003_token_ratio": ratio}
