"""The invocation log's per-call write on its own: aiosqlite against the previous plain-sqlite3 write.

The in-process lookup measurements time the write as the server runs it; this shows, with
identical rows in the same run, what the durability mode costs on this disk and what the
aiosqlite driver costs against the write it replaced (``bench.log_baseline``). Each call is a
lookup's: one row and the session's memory state (``memory.persist``, on by default), in one
transaction. The variants alternate round by round, so each sees the same machine state.

- ``full``, ``normal``: the log (aiosqlite) under ``synchronous=FULL`` and ``NORMAL`` (the server's);
- ``sqlite3_inline``, ``sqlite3_thread``: the previous write under NORMAL, on the event loop (its
  path when the write lock was free) and as one hop to its own thread (when it was not).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.log_baseline import PlainLog
from bench.stats import summarize
from storage.invocation_log import InvocationLog
from storage.invocation_record import InvocationRecord, row_of

VARIANTS = ("full", "normal", "sqlite3_inline", "sqlite3_thread")
# What the spec accepts as the price of the driver, per call (ms).
ACCEPTABLE_COST_MS = 0.3
_STATE = json.dumps({"calls": 1, "documents": {"payments/pay_000042.md": ["c1", "c2"]}})

Call = Callable[[InvocationRecord], Awaitable[None]]
Close = Callable[[], Awaitable[None]]


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


def _fresh(work: Path, variant: str) -> Path:
    path = work / f"log-{variant}" / "log.sqlite"
    shutil.rmtree(path.parent, ignore_errors=True)
    path.parent.mkdir(parents=True)
    return path


async def _log_variant(path: Path, mode: str) -> tuple[Call, Close]:
    log = await InvocationLog.open(path, log_queries=True, synchronous=mode)  # type: ignore[arg-type]

    async def call(record: InvocationRecord) -> None:
        log.queue_memory(str(record.session_key), _STATE)
        await log.record(record)

    return call, log.close


def _plain_variant(path: Path, *, on_thread: bool) -> tuple[Call, Close]:
    plain = PlainLog(path)

    async def call(record: InvocationRecord) -> None:
        row, memory = row_of(record, log_queries=True), (str(record.session_key), _STATE, record.ts)
        if on_thread:
            await plain.on_thread(row, memory)
        else:
            plain.write(row, memory)

    async def close() -> None:
        plain.close()

    return call, close


async def _open(work: Path) -> dict[str, tuple[Call, Close]]:
    return {
        "full": await _log_variant(_fresh(work, "full"), "FULL"),
        "normal": await _log_variant(_fresh(work, "normal"), "NORMAL"),
        "sqlite3_inline": _plain_variant(_fresh(work, "sqlite3_inline"), on_thread=False),
        "sqlite3_thread": _plain_variant(_fresh(work, "sqlite3_thread"), on_thread=True),
    }


async def _measure(work: Path, rounds: int, per_round: int) -> dict[str, Any]:
    variants = await _open(work)
    samples: dict[str, list[list[float]]] = {name: [] for name in VARIANTS}
    n = 0
    try:
        for _ in range(rounds):
            for name in VARIANTS:  # round by round: the same machine state for each
                call, _ = variants[name]
                round_samples = []
                for _ in range(per_round):
                    n += 1
                    record = _record(n)
                    started = time.perf_counter()
                    await call(record)
                    round_samples.append((time.perf_counter() - started) * 1000)
                samples[name].append(round_samples)
    finally:
        for _, close in variants.values():
            await close()
        for name in VARIANTS:
            shutil.rmtree(work / f"log-{name}", ignore_errors=True)
    return _summary(samples)


def _summary(samples: dict[str, list[list[float]]]) -> dict[str, Any]:
    """Each variant's summary, and the driver's cost: the log's NORMAL median minus the baselines'."""
    out: dict[str, Any] = {name: summarize(samples[name]) for name in VARIANTS}
    new = out["normal"]["median"]
    out["aiosqlite_cost_ms"] = {
        "vs_sqlite3_inline": round(new - out["sqlite3_inline"]["median"], 3),
        "vs_sqlite3_thread": round(new - out["sqlite3_thread"]["median"], 3),
        "acceptable": ACCEPTABLE_COST_MS,
    }
    return out


def measure(work: Path, *, rounds: int = 5, per_round: int = 40) -> dict[str, Any]:
    """Write latency per call in ms per variant; skipped when the log has no ``synchronous`` option."""
    if "synchronous" not in inspect.signature(InvocationLog.open).parameters:
        return {"note": "the invocation log has no synchronous option"}
    return asyncio.run(_measure(work, rounds, per_round))


def main() -> int:
    """``python -m bench.log_bench``: this measurement alone, as JSON on stdout."""
    with tempfile.TemporaryDirectory() as work:
        json.dump(measure(Path(work)), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
