"""One tool call as the invocation log stores it: the record, and the row it becomes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

# The columns of a row, in the order of ``row_of``'s values.
COLUMNS = (
    "ts",
    "session_key",
    "session_scope",
    "tool_name",
    "query",
    "domain_filter",
    "missing_dimension",
    "relevance_level",
    "dedup_reason",
    "completeness_hint",
    "water_level",
    "next_call",
    "call_index",
    "result_doc_keys",
    "retrieval_details",
    "latency_ms",
    "error",
)
INSERT = f"INSERT INTO tool_invocation ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


@dataclass(frozen=True)
class InvocationRecord:
    """One tool call, as the server saw it."""

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


def hash_text(text: str) -> str:
    """What the log stores instead of free text when ``log_queries`` is off."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def row_of(record: InvocationRecord, *, log_queries: bool) -> tuple[Any, ...]:
    """The values of ``INSERT`` for ``record``; free text hashed unless ``log_queries``."""
    query, missing = record.query, record.missing_dimension
    if not log_queries:
        query = hash_text(query) if query is not None else None
        missing = hash_text(missing) if missing is not None else None
    details = (
        json.dumps(record.retrieval_details, ensure_ascii=False, default=str)
        if record.retrieval_details is not None
        else None
    )
    return (
        record.ts,
        record.session_key,
        record.session_scope,
        record.tool_name,
        query,
        record.domain_filter,
        missing,
        record.relevance_level,
        record.dedup_reason,
        record.completeness_hint,
        record.water_level,
        record.next_call,
        record.call_index,
        json.dumps(list(record.result_doc_keys), ensure_ascii=False),
        details,
        round(record.latency_ms, 3),
        record.error,
    )
