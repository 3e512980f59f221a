"""The invocation log's per-call commit on its own, for each SQLite ``synchronous`` mode.

The in-process lookup measurements time the commit as the server runs it; this shows what the
durability mode costs on this disk, with identical rows, in the same run.
"""

from __future__ import annotations

import asyncio
import inspect
import shutil
import time
from pathlib import Path
from typing import Any

from bench.stats import summarize
from storage.invocation_log import InvocationLog, InvocationRecord

MODES = ("FULL", "NORMAL")


def _record(i: int) -> InvocationRecord:
    """A row shaped like a real lookup's (24 L1 scores, thresholds, three documents)."""
    return InvocationRecord(
        ts=time.time(),
        session_key=f"explicit:bench-{i}",
        session_scope="explicit",
        tool_name="lookup_knowledge",
        query=f"how do I fix the settlement worker that times out after failover? ({i})",
        domain_filter=None,
        missing_dimension=None,
        relevance_level="HIGHLY_RELEVANT",
        dedup_reason=None,
        completeness_hint="good enough; further lookups rarely help",
        water_level="LOW",
        next_call="ALLOW",
        call_index=1,
        result_doc_keys=["payments/pay_000042.md", "payments/pay_000050.md", "database/db_000001.md"],
        retrieval_details={
            "l1_scores": [0.8312] * 24,
            "relevance_level": "HIGHLY_RELEVANT",
            "thresholds": {"highly_relevant": 0.896, "reference": 0.886},
            "content_tokens": 120,
        },
        latency_ms=12.3,
        error=None,
    )


async def _measure(work: Path, rounds: int, per_round: int) -> dict[str, Any]:
    logs = {}
    for mode in MODES:
        path = work / f"log-{mode.lower()}" / "log.sqlite"
        shutil.rmtree(path.parent, ignore_errors=True)
        path.parent.mkdir(parents=True)
        logs[mode] = await InvocationLog.open(path, log_queries=True, synchronous=mode)  # type: ignore[arg-type]
    samples: dict[str, list[list[float]]] = {mode: [] for mode in MODES}
    n = 0
    try:
        for _ in range(rounds):
            for mode in MODES:  # alternate the modes round by round: same machine state for both
                round_samples = []
                for _ in range(per_round):
                    n += 1
                    record = _record(n)
                    started = time.perf_counter()
                    await logs[mode].record(record)
                    round_samples.append((time.perf_counter() - started) * 1000)
                samples[mode].append(round_samples)
    finally:
        for log in logs.values():
            await log.close()
    for mode in MODES:
        shutil.rmtree(work / f"log-{mode.lower()}", ignore_errors=True)
    return {mode.lower(): summarize(samples[mode]) for mode in MODES}


def measure(work: Path, *, rounds: int = 5, per_round: int = 40) -> dict[str, Any]:
    """Commit latency in ms per mode; skipped when the log has no ``synchronous`` option."""
    if "synchronous" not in inspect.signature(InvocationLog.open).parameters:
        return {"note": "the invocation log has no synchronous option"}
    return asyncio.run(_measure(work, rounds, per_round))
