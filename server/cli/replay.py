"""Replay an agent's lookups through the real MCP server and count what the agent received.

Each trace line is one ``lookup_knowledge`` call: ``{"session": ..., "query": ...,
"missing_dimension"?: ...}`` (``domain`` and ``top_k`` are accepted too). The calls go through
``create_server`` and the in-process MCP client, so tool validation, session resolution,
governance and dedup are the ones a client sees.

- governed: every trace session is its own MCP session (an explicit ``_meta.session_id``).
- baseline: governance off and no session at all (session_scope "none", so action memory is
  off): a stateless retriever, like other knowledge MCP servers.

What is counted, per trace session (totals are sums over sessions):
- calls: lookup_knowledge calls made;
- retrievals: calls that ran a retrieval, i.e. were not refused by governance. A refused call
  (dedup_reason circuit_open or missing_dimension_required) never reaches the retrieval
  engine; every other call ran L0 and L1 (or reused the evidence of an identical earlier query)
  before grading and dedup, even when it ends DEDUPED;
- blocked: calls refused by governance;
- documents returned, unique documents, and duplicate returns (a document handed again to a
  session that already received it);
- content tokens: ``estimate_tokens`` over the primary and supplement contents returned;
- store searches: how often the vector store was actually searched (a cross-check).
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from mcp import Client
from mcp_types import RequestParamsMeta
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from retrieval.account import estimate_tokens
from retrieval.embedders import Embedder
from retrieval.models import BLOCKING_REASONS
from server.config.sections import LogSettings
from server.config.settings import Settings
from server.inputs import Domain, MissingDimension, Query, TopK
from server.protocol.app import app_resources, create_server
from storage.vector_store import MilvusVectorStore


class TraceError(ValueError):
    """The trace file cannot be read; the message names the file and line."""


class ReplayError(RuntimeError):
    """The replay cannot run (for example, the knowledge base is empty)."""


class TraceStep(BaseModel):
    """One recorded lookup_knowledge call."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session: str = Field(min_length=1, max_length=200)
    query: Query
    missing_dimension: MissingDimension = None
    domain: Domain = None
    top_k: TopK | None = None
    topic: str | None = Field(default=None, max_length=200, description="The topic the call is about.")
    expect: list[str] | None = Field(
        default=None, description="The documents an ideal session receives for this call's topic."
    )


def read_trace(path: Path) -> list[TraceStep]:
    """Parse a JSONL trace; blank lines are skipped, anything else invalid is an error."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {str(path)!r}: {exc.strerror}") from exc
    steps: list[TraceStep] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            steps.append(TraceStep.model_validate_json(line))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(line)'}: {err['msg']}" for err in exc.errors()
            )
            raise TraceError(f"{path}:{number}: {problems}") from exc
    if not steps:
        raise TraceError(f"trace {str(path)!r} holds no calls")
    return steps


@dataclass(frozen=True)
class CallRecord:
    """What one replayed call returned."""

    session: str
    query: str
    relevance_level: str | None
    dedup_reason: str | None
    water_level: str | None
    next_call: str | None
    doc_keys: tuple[str, ...]
    duplicate_doc_keys: tuple[str, ...]
    content_tokens: int
    store_searches: int
    error: str | None = None
    text_chars: int = 0  # the text content the agent's context receives
    topic: str | None = None
    expect: tuple[str, ...] = ()
    session_scope: str | None = None  # as the server resolved it: "explicit" governed, "none" baseline

    @property
    def blocked(self) -> bool:
        return self.dedup_reason in BLOCKING_REASONS

    @property
    def ran_retrieval(self) -> bool:
        return self.error is None and not self.blocked


@dataclass(frozen=True)
class Counts:
    """The replay figures for one session, or for the whole trace."""

    calls: int = 0
    retrievals: int = 0
    blocked: int = 0
    documents_returned: int = 0
    unique_documents: int = 0
    duplicate_returns: int = 0
    content_tokens: int = 0
    store_searches: int = 0
    errors: int = 0
    content_calls: int = 0  # calls that returned content
    text_chars: int = 0
    topics: int = 0
    needed: int = 0  # documents the trace expects
    needed_delivered: int = 0  # of those, delivered at least once
    needed_delivered_once: int = 0  # of those, delivered in exactly one call

    def __add__(self, other: Counts) -> Counts:
        return Counts(**{k: v + getattr(other, k) for k, v in asdict(self).items()})


@dataclass(frozen=True)
class ReplayReport:
    """The calls of one replay, and the figures per session and in total."""

    mode: str  # "governed" or "baseline"
    calls: tuple[CallRecord, ...]
    sessions: dict[str, Counts] = field(default_factory=dict)

    @property
    def total(self) -> Counts:
        total = Counts()
        for counts in self.sessions.values():
            total = total + counts
        return total

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "sessions": {name: asdict(c) for name, c in self.sessions.items()},
            "total": asdict(self.total),
            "calls": [
                {**asdict(c), "blocked": c.blocked, "ran_retrieval": c.ran_retrieval} for c in self.calls
            ],
        }


def _session_counts(calls: Iterable[CallRecord]) -> Counts:
    calls = list(calls)
    returned = [key for c in calls for key in c.doc_keys]
    needed = {key for c in calls for key in c.expect}
    deliveries = {key: sum(key in c.doc_keys for c in calls) for key in needed}
    return Counts(
        calls=len(calls),
        retrievals=sum(c.ran_retrieval for c in calls),
        blocked=sum(c.blocked for c in calls),
        documents_returned=len(returned),
        unique_documents=len(set(returned)),
        duplicate_returns=len(returned) - len(set(returned)),
        content_tokens=sum(c.content_tokens for c in calls),
        store_searches=sum(c.store_searches for c in calls),
        errors=sum(c.error is not None for c in calls),
        content_calls=sum(bool(c.doc_keys) for c in calls),
        text_chars=sum(c.text_chars for c in calls),
        topics=len({c.topic for c in calls if c.topic}),
        needed=len(needed),
        needed_delivered=sum(n > 0 for n in deliveries.values()),
        needed_delivered_once=sum(n == 1 for n in deliveries.values()),
    )


def replay_settings(settings: Settings, *, baseline: bool) -> Settings:
    """The settings a replay runs with: no invocation log, no persisted memory; baseline: no governance.

    A replay must not write into the server's invocation log, and it must start from empty
    action memory, so memory is neither restored nor saved.
    """
    update: dict[str, Any] = {
        "log": LogSettings(enabled=False, log_queries=settings.log.log_queries),
        "memory": settings.memory.model_copy(update={"persist": False}),
    }
    if baseline:
        # A stateless retriever, as other knowledge servers are: no governance, no session, and
        # the top_k documents of every call.
        update["governance"] = settings.governance.model_copy(update={"enabled": False})
        update["retrieval"] = settings.retrieval.model_copy(update={"supplements": "top_k"})
    return settings.model_copy(update=update)


async def replay(
    settings: Settings,
    steps: list[TraceStep],
    *,
    baseline: bool = False,
    embedder: Embedder | None = None,
    store: MilvusVectorStore | None = None,
) -> ReplayReport:
    """Run the trace through a fresh server and count what every session received."""
    resources = app_resources(replay_settings(settings, baseline=baseline), embedder=embedder, store=store)
    server = create_server(resources)
    seen: dict[str, set[str]] = {}
    records: list[CallRecord] = []
    problem: str | None = None
    async with Client(server) as client:
        # Raised only after the client closed: inside it, errors surface wrapped in task groups.
        domains = await client.call_tool("list_knowledge_domains", {})
        if domains.is_error or not (domains.structured_content or {}).get("document_count"):
            problem = _text_of(domains) if domains.is_error else "it holds no documents"
        else:
            engine = (await resources.lookup_service()).engine
            for step in steps:
                arguments: dict[str, Any] = {"query": step.query}
                for name in ("missing_dimension", "domain", "top_k"):
                    if getattr(step, name) is not None:
                        arguments[name] = getattr(step, name)
                # Governed: the trace session is the MCP session. Baseline: no session at all.
                meta = None if baseline else cast(RequestParamsMeta, {"session_id": step.session})
                searches_before = engine.searches
                result = await client.call_tool("lookup_knowledge", arguments, meta=meta)
                searches = engine.searches - searches_before
                records.append(_record(step, result, seen.setdefault(step.session, set()), searches))
    if problem is not None:
        raise ReplayError(
            f"the knowledge base in {settings.data_dir} cannot be replayed against: {problem} "
            "(run `lookup-knowledge-mcp ingest` first)"
        )
    by_session: dict[str, list[CallRecord]] = {}
    for record in records:
        by_session.setdefault(record.session, []).append(record)
    return ReplayReport(
        mode="baseline" if baseline else "governed",
        calls=tuple(records),
        sessions={name: _session_counts(calls) for name, calls in by_session.items()},
    )


def _text_of(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content).strip() or "unknown error"


def _record(step: TraceStep, result: Any, seen: set[str], searches: int) -> CallRecord:
    if result.is_error:
        return CallRecord(
            step.session, step.query, None, None, None, None, (), (), 0, searches, error=_text_of(result)
        )
    data = result.structured_content or {}
    documents = [d for d in [data.get("primary"), *data.get("supplement", [])] if d]
    keys = tuple(d["doc_key"] for d in documents)
    # A duplicate is a passage handed again: the same section of a document the session holds.
    passages = [f"{d['doc_key']}#{section}" for d in documents for section in d.get("sections") or [""]]
    duplicates = tuple(dict.fromkeys(p.split("#")[0] for p in passages if p in seen))
    seen.update(passages)
    budget = data.get("budget") or {}
    return CallRecord(
        session=step.session,
        query=step.query,
        relevance_level=data.get("relevance_level"),
        dedup_reason=data.get("dedup_reason"),
        water_level=budget.get("water_level"),
        next_call=budget.get("next_call"),
        doc_keys=keys,
        duplicate_doc_keys=duplicates,
        content_tokens=sum(estimate_tokens(d["content"]) for d in documents),
        store_searches=searches,
        session_scope=data.get("session_scope"),
        text_chars=len(_text_of(result)),
        topic=step.topic,
        expect=tuple(step.expect or ()),
    )


# -- text output ---------------------------------------------------------------------
_COLUMNS = (
    ("calls", "calls"),
    ("retrievals", "ran retrieval"),
    ("blocked", "blocked"),
    ("documents_returned", "docs returned"),
    ("unique_documents", "unique docs"),
    ("duplicate_returns", "duplicate returns"),
    ("content_tokens", "content tokens"),
    ("store_searches", "store searches"),
    ("content_calls", "calls with content"),
    ("text_chars", "text characters"),
    ("topics", "topics"),
    ("needed", "needed docs"),
    ("needed_delivered", "needed delivered"),
    ("needed_delivered_once", "needed delivered once"),
)


def _width(text: str) -> int:
    """Terminal columns: East Asian wide characters take two."""
    return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)


def _table(rows: list[list[str]], *, left: int = 1) -> list[str]:
    """Align columns; the first ``left`` columns are left-aligned, the rest right-aligned."""
    widths = [max(_width(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = []
        for i, (cell, width) in enumerate(zip(row, widths, strict=True)):
            pad = " " * (width - _width(cell))
            cells.append(cell + pad if i < left else pad + cell)
        lines.append("  ".join(cells).rstrip())
    return lines


def render_counts(report: ReplayReport) -> list[str]:
    """Per-session rows and a total row."""
    rows = [["session", *(label for _, label in _COLUMNS)]]
    for name, counts in report.sessions.items():
        rows.append([name, *(str(getattr(counts, key)) for key, _ in _COLUMNS)])
    if len(report.sessions) > 1:
        rows.append(["TOTAL", *(str(getattr(report.total, key)) for key, _ in _COLUMNS)])
    return _table(rows)


def render_calls(report: ReplayReport) -> list[str]:
    """One row per call: tier, decision and what came back."""
    rows = [["#", "session", "query", "tier", "dedup_reason", "water", "next_call", "docs", "tokens"]]
    for number, call in enumerate(report.calls, start=1):
        query = call.query if len(call.query) <= 36 else call.query[:35] + "…"
        rows.append(
            [
                str(number),
                call.session,
                query,
                call.relevance_level or f"error: {call.error}",
                call.dedup_reason or "-",
                call.water_level or "-",
                call.next_call or "-",
                str(len(call.doc_keys)),
                str(call.content_tokens),
            ]
        )
    return _table(rows, left=7)


def ratio(governed: int, baseline: int) -> float | None:
    """governed / baseline, or None when the baseline is zero."""
    return None if baseline == 0 else governed / baseline


def render_comparison(governed: ReplayReport, baseline: ReplayReport) -> list[str]:
    """Totals side by side with governed / baseline ratios."""
    rows = [["total", "governed", "baseline", "governed/baseline"]]
    g, b = governed.total, baseline.total
    for key, label in _COLUMNS:
        value = ratio(getattr(g, key), getattr(b, key))
        rows.append(
            [label, str(getattr(g, key)), str(getattr(b, key)), "n/a" if value is None else f"{value:.2f}"]
        )
    return _table(rows)


def comparison_dict(governed: ReplayReport, baseline: ReplayReport) -> dict[str, float | None]:
    return {key: ratio(getattr(governed.total, key), getattr(baseline.total, key)) for key, _ in _COLUMNS}


def to_json(trace: Path, governed: ReplayReport, baseline: ReplayReport | None) -> str:
    payload: dict[str, Any] = {"trace": str(trace), "governed": governed.as_dict()}
    if baseline is not None:
        payload["baseline"] = baseline.as_dict()
        payload["governed_over_baseline"] = comparison_dict(governed, baseline)
    return json.dumps(payload, ensure_ascii=False, indent=2)
