"""The invocation log (SQLite through aiosqlite). Interface stub: see the observability issue."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class InvocationRecord:
    ts: float
    session_key: str | None
    session_scope: str
    tool_name: str
    query: str | None
    domain_filter: str | None
    missing_dimension: str | None
    relevance_level: str | None
    dedup_reason: str | None
    completeness_hint: str | None
    water_level: str | None
    next_call: str | None
    call_index: int | None
    result_doc_keys: list[str]
    retrieval_details: dict[str, Any] | None
    latency_ms: float
    error: str | None


class InvocationLog:
    failures = 0

    @classmethod
    async def open(cls, path: Path, *, log_queries: bool) -> InvocationLog:
        return cls()

    async def record(self, record: InvocationRecord) -> bool:
        return True

    def queue_memory(self, session_key: str, memory: Any) -> None:
        return None

    async def load_memories(self, ttl_seconds: float) -> list[tuple[str, Any, float]]:
        return []

    async def close(self) -> None:
        return None
