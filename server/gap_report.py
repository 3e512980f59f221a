"""The knowledge-gap report: what the knowledge base could not answer, and how its documents are used.

``gaps`` prints it and the console's gaps and documents pages show it. The log is read through
read-only aiosqlite connections; the questions are embedded (in small batches on a thread) and
grouped by retrieval.gaps; each group's centre is searched in the store for the nearest document.
What the report reads besides the log comes through ``ReportSources``: the retrieval stack
(``RuntimeSources``: the ``gaps`` command, a console without its page process), or the console's
page process, which loads an embedder of its own and asks the serving process for the searches.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
from pydantic import BaseModel, Field

from retrieval.gaps import (
    DEFAULT_SIMILARITY,
    GapGroup,
    counts_by_domain,
    group_gaps,
    select_gaps,
    texts_to_embed,
)
from retrieval.models import Tier
from storage.log_reads import LookupRow, ReadRow, answered_lookups, document_reads, log_position, read_only
from storage.usage_queries import DocumentUsage, document_usage

if TYPE_CHECKING:
    from server.container import Runtime

# Questions embedded per hop to the embedder's thread: a lookup served by the same embedder waits
# behind at most one batch.
EMBED_BATCH = 8
# Hits searched per group centre: the first that is a document of the catalog is the nearest.
NEAREST_HITS = 10
TOP_DOCUMENTS = 10
# A report over a growing log is rebuilt at most this often (seconds).
REFRESH_S = 60.0
# A document counts as "often" REFERENCE, or read further, from this many times in the window.
OFTEN = 2
_TIER_ORDER = [Tier.NO_MATCH, Tier.DEDUPED, Tier.REFERENCE, Tier.HIGHLY_RELEVANT, Tier.PRECISE]


class GapQuestionOut(BaseModel):
    question: str
    session: str | None
    asked_at: str
    tier: str
    reason: str = Field(description="no_match, reference_followed or read_further.")


class GapGroupOut(BaseModel):
    rank: int
    size: int = Field(description="Questions in the group.")
    sessions: int = Field(description="Distinct sessions that asked them.")
    examples: list[str]
    first_seen: str
    last_seen: str
    reasons: dict[str, int]
    best_tier: str = Field(description="The best tier any of these questions was answered with.")
    nearest_document: str | None = Field(description="The document nearest the group's centre.")
    nearest_title: str | None = None
    nearest_domain: str | None = None
    nearest_similarity: float | None = None
    questions: list[GapQuestionOut]


class DocumentOut(BaseModel):
    doc_key: str
    title: str | None = None
    domain: str | None = None
    delivered: int = 0
    sessions: int = 0
    precise: int = 0
    highly_relevant: int = 0
    reference: int = 0
    read_further: int = 0


class DocumentReport(BaseModel):
    never_delivered: list[str]
    most_delivered: list[DocumentOut]
    split_candidates: list[DocumentOut] = Field(description="Often delivered partial, then read further.")
    reference_only: list[DocumentOut] = Field(
        description="Often REFERENCE, never HIGHLY_RELEVANT or PRECISE."
    )
    all: list[DocumentOut]


class GapReport(BaseModel):
    since: str | None
    generated_at: str
    log_queries: bool
    message: str | None = None
    questions: int = Field(description="Questions the knowledge base could not answer.")
    groups: list[GapGroupOut]
    hidden_by_domain: dict[str, int] = Field(
        description="Questions logged as hashes (log.log_queries: false), per domain filter."
    )
    documents: DocumentReport


def iso(ts: float | None) -> str | None:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds") if ts is not None else None


def _best_tier(group: GapGroup) -> str:
    levels = [q.row.relevance_level for q in group.questions if q.row.relevance_level in _TIER_ORDER]
    return max(levels, key=lambda level: _TIER_ORDER.index(Tier(level))) if levels else Tier.NO_MATCH.value


Hits = list[tuple[str, float]]  # (doc_key, score), best first


class ReportSources(Protocol):
    """What a report reads besides the log: titles, question vectors, store searches."""

    def titles(self) -> dict[str, tuple[str, str]]:
        """Every catalog document's (title, domain), by doc_key (blocking)."""
        ...

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        """The texts' query vectors (blocking)."""
        ...

    async def search(self, centroids: Sequence[np.ndarray]) -> list[Hits]:
        """Each centroid's nearest chunks in the store, NEAREST_HITS of them."""
        ...


class RuntimeSources:
    """The report's sources in a process that holds the retrieval stack."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def titles(self) -> dict[str, tuple[str, str]]:
        view = self.runtime.engine.view()
        return {key: (entry.title, entry.domain) for key, entry in view.entries.items()}

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.runtime.embedder.embed_queries(list(texts))

    async def search(self, centroids: Sequence[np.ndarray]) -> list[Hits]:
        return [await asyncio.to_thread(self.search_one, centroid) for centroid in centroids]

    def search_one(self, centroid: np.ndarray) -> Hits:
        hits = self.runtime.store.search(centroid, limit=NEAREST_HITS, domain=None)
        return [(hit.doc_key, round(float(hit.score), 4)) for hit in hits]


@dataclass(frozen=True)
class _Built:
    position: int  # the log's last row id when the report was built
    built: float  # time.monotonic() then
    report: GapReport


class GapReporter:
    """Builds reports over one set of sources, keeping question vectors and the last report per window."""

    def __init__(
        self,
        sources: ReportSources,
        log_path: Path,
        *,
        similarity: float = DEFAULT_SIMILARITY,
        refresh_s: float = REFRESH_S,
        embed_batch: int = EMBED_BATCH,
    ) -> None:
        self.sources = sources
        self.log_path = log_path
        self.similarity = similarity
        self.refresh_s = refresh_s
        self.embed_batch = embed_batch
        self._vectors: dict[str, np.ndarray] = {}
        self._cache: dict[tuple[str, bool], _Built] = {}
        self._building: dict[tuple[str, bool], asyncio.Task[_Built]] = {}

    async def report(self, since: float | None, *, log_queries: bool, window: str = "") -> GapReport:
        """The report of ``window`` (see ``latest``), waiting for its first build."""
        report = await self.latest(since, log_queries=log_queries, window=window, wait=True)
        if report is None:  # pragma: no cover - wait=True always returns a report
            raise RuntimeError("the gap report was not built")
        return report

    async def latest(
        self, since: float | None, *, log_queries: bool, window: str = "", wait: bool = False
    ) -> GapReport | None:
        """The report of ``window`` (a label: "7d", "all"), starting at ``since``.

        A report is rebuilt when the log has grown, but at most every ``refresh_s`` seconds: in
        between, and while a rebuild runs, the last report is served (it says when it was made),
        so a page over a long, busy log answers at once. The first report of a window is None
        until built, unless ``wait``.
        """
        key = (window, log_queries)
        cached = self._cache.get(key)
        # Within refresh_s of a build the answer is that report whatever the log holds: the log's
        # position is read (a connection opened, a query run) only once a rebuild may be due.
        if cached is not None and time.monotonic() - cached.built < self.refresh_s:
            return cached.report
        position = await self._position()
        if cached is not None and cached.position == position:
            return cached.report
        task = self._building.get(key)
        if task is None:
            # One build per window at a time: concurrent pages share it.
            task = asyncio.create_task(self._store(key, position, since, log_queries))
            self._building[key] = task
        if cached is not None:
            return cached.report
        return (await asyncio.shield(task)).report if wait else None

    async def _position(self) -> int:
        if not self.log_path.exists():  # nothing logged yet: an empty report, not an error
            return 0
        async with read_only(self.log_path) as conn:
            return await log_position(conn)

    async def _store(
        self, key: tuple[str, bool], position: int, since: float | None, log_queries: bool
    ) -> _Built:
        try:
            built = _Built(position, time.monotonic(), await self._build(since, log_queries=log_queries))
            self._cache[key] = built
            return built
        finally:
            self._building.pop(key, None)

    async def _build(self, since: float | None, *, log_queries: bool) -> GapReport:
        lookups: list[LookupRow] = []
        reads: list[ReadRow] = []
        usage: dict[str, DocumentUsage] = {}
        if self.log_path.exists():
            async with read_only(self.log_path) as conn:
                lookups = await answered_lookups(conn, since)
                reads = await document_reads(conn, since)
                usage = await document_usage(conn, since)
        titles = await asyncio.to_thread(self.sources.titles)
        if log_queries:
            await self._embed(texts_to_embed(lookups, reads))
        # Pure Python over every lookup of the window: on a thread, so the event loop keeps serving.
        questions = await asyncio.to_thread(
            select_gaps, lookups, reads, self._vectors, similarity=self.similarity
        )
        groups = (
            await asyncio.to_thread(group_gaps, questions, self._vectors, similarity=self.similarity)
            if log_queries
            else []
        )
        hidden = [q for q in questions if q.row.hashed or not log_queries]
        searched = await self.sources.search([group.centroid for group in groups]) if groups else []
        outs = [
            _group_out(rank, group, _nearest(hits, titles), titles)
            for rank, (group, hits) in enumerate(zip(groups, searched, strict=True), start=1)
        ]
        return GapReport(
            since=iso(since),
            generated_at=iso(time.time()) or "",
            log_queries=log_queries,
            message=None
            if log_queries
            else "queries are not logged (log.log_queries: false): counts by domain only, no question text",
            questions=len(questions),
            groups=outs,
            hidden_by_domain=counts_by_domain(hidden),
            documents=documents_report(usage, titles),
        )

    async def _embed(self, texts: Sequence[str]) -> None:
        missing = [text for text in texts if text not in self._vectors]
        for start in range(0, len(missing), self.embed_batch):
            batch = missing[start : start + self.embed_batch]
            vectors = await asyncio.to_thread(self.sources.embed_queries, batch)
            for text, row in zip(batch, vectors, strict=True):
                vector = np.asarray(row, dtype=np.float32)
                self._vectors[text] = vector / max(float(np.linalg.norm(vector)), 1e-12)


def _nearest(hits: Hits, titles: Mapping[str, tuple[str, str]]) -> tuple[str, float] | None:
    for doc_key, score in hits:
        if doc_key in titles:  # a chunk of a document deleted since is not "existing"
            return doc_key, score
    return None


def _group_out(
    rank: int, group: GapGroup, nearest: tuple[str, float] | None, titles: Mapping[str, tuple[str, str]]
) -> GapGroupOut:
    title, domain = titles[nearest[0]] if nearest else (None, None)
    return GapGroupOut(
        rank=rank,
        size=len(group.questions),
        sessions=group.sessions,
        examples=group.examples(),
        first_seen=iso(group.first_seen) or "",
        last_seen=iso(group.last_seen) or "",
        reasons=group.reasons(),
        best_tier=_best_tier(group),
        nearest_document=nearest[0] if nearest else None,
        nearest_title=title,
        nearest_domain=domain,
        nearest_similarity=nearest[1] if nearest else None,
        questions=[
            GapQuestionOut(
                question=q.row.query or "",
                session=q.row.session_key,
                asked_at=iso(q.row.ts) or "",
                tier=q.row.relevance_level or "",
                reason=q.reason,
            )
            for q in group.questions
        ],
    )


def documents_report(
    usage: Mapping[str, DocumentUsage], titles: Mapping[str, tuple[str, str]]
) -> DocumentReport:
    """Never delivered, most delivered, split candidates and reference-only documents."""

    def out(key: str) -> DocumentOut:
        used = usage.get(key, DocumentUsage(key))
        title, domain = titles.get(key, (None, None))
        return DocumentOut(
            doc_key=key,
            title=title,
            domain=domain,
            delivered=used.delivered,
            sessions=used.sessions,
            precise=used.precise,
            highly_relevant=used.highly_relevant,
            reference=used.reference,
            read_further=used.read_further,
        )

    existing = [out(key) for key in sorted(titles)]
    by_use = sorted(existing, key=lambda d: (-d.delivered, d.doc_key))
    return DocumentReport(
        never_delivered=[d.doc_key for d in existing if not d.delivered],
        most_delivered=[d for d in by_use if d.delivered][:TOP_DOCUMENTS],
        split_candidates=sorted(
            (d for d in existing if d.read_further >= OFTEN), key=lambda d: (-d.read_further, d.doc_key)
        ),
        reference_only=sorted(
            (d for d in existing if d.reference >= OFTEN and not d.highly_relevant and not d.precise),
            key=lambda d: (-d.reference, d.doc_key),
        ),
        all=by_use,
    )
