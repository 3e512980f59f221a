"""The retrieval core: L0 exact match plus L1 semantic search over the visible documents.

Synchronous on purpose; the server calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np

from retrieval.models import DomainInfo, KnowledgeMap
from retrieval.relevance import cosine_to_similarity, detect_language
from storage.catalog import Catalog, CatalogEntry
from storage.keyword_index import KeywordEntry, KeywordIndex
from storage.vector_store import ChunkHit


class VectorSearch(Protocol):
    def search(
        self,
        vector: np.ndarray,
        *,
        limit: int,
        domain: str | None,
        language: str | None = None,
        exclude_language: str | None = None,
    ) -> list[ChunkHit]: ...


class QueryEmbedder(Protocol):
    name: str

    def embed_query(self, text: str) -> np.ndarray: ...


@dataclass(frozen=True)
class Evidence:
    """Raw retrieval evidence for one query, before grading and dedup."""

    l0_doc_keys: tuple[str, ...]
    # Best chunk similarity per visible document (language offset applied), highest first.
    similarities: tuple[tuple[str, float], ...]
    # Raw COSINE scores of the chunks, exactly as the store returned them (log only).
    l1_scores: tuple[float, ...]
    # Best raw cosine per (document, written in the other language): calibration re-scores it offline.
    raw: tuple[tuple[str, bool, float], ...] = ()

    def similarity(self, doc_key: str) -> float | None:
        return dict(self.similarities).get(doc_key)

    def rescored(self, cross_language_offset: float) -> Evidence:
        """The same evidence graded with another cross-language offset."""
        sims = rank_similarities(self.raw, cross_language_offset)
        return Evidence(self.l0_doc_keys, sims, self.l1_scores, self.raw)


def rank_similarities(
    raw: Sequence[tuple[str, bool, float]], cross_language_offset: float
) -> tuple[tuple[str, float], ...]:
    """Best similarity per document, highest first, from (doc_key, cross_language, cosine).

    Multilingual embedders score a same-language pair higher than an equally relevant pair in
    two languages (e5-small: by ~0.04-0.06 on our sample), so a Chinese question would never
    surface an English document. Adding a calibrated offset to chunks written purely in the
    other language puts both on one scale; bilingual chunks get none, they match both already.
    """
    best: dict[str, float] = {}
    for doc_key, cross_language, cosine in raw:
        similarity = cosine_to_similarity(cosine)
        if cross_language:
            similarity = min(similarity + cross_language_offset, 1.0)
        best[doc_key] = max(best.get(doc_key, 0.0), similarity)
    return tuple(sorted(best.items(), key=lambda item: (-item[1], item[0])))


@dataclass(frozen=True)
class KnowledgeView:
    """An immutable snapshot of the catalog, swapped whole when the catalog changes."""

    generation: int
    entries: dict[str, CatalogEntry]
    keywords: KeywordIndex

    @classmethod
    def load(cls, catalog: Catalog) -> KnowledgeView:
        generation = catalog.generation()
        entries = {e.doc_key: e for e in catalog.entries()}
        index = KeywordIndex(KeywordEntry(e.doc_key, e.domain, e.title, e.keywords) for e in entries.values())
        return cls(generation, entries, index)

    # Both are computed once per snapshot: scanning every entry on each lookup cost ~2 ms per
    # call at 50k documents and grew linearly with the corpus.
    @cached_property
    def _domain_names(self) -> tuple[str, ...]:
        return tuple(sorted({e.domain for e in self.entries.values()}))

    @property
    def domains(self) -> list[str]:
        return list(self._domain_names)

    @cached_property
    def languages(self) -> tuple[str, ...]:
        """The chunk languages present (zh, en, mixed)."""
        return tuple(sorted({lang for e in self.entries.values() for lang in e.languages}))


class KnowledgeEngine:
    """Answers ``retrieve`` over the catalog's visible documents."""

    def __init__(
        self,
        catalog: Catalog,
        store: VectorSearch,
        embedder: QueryEmbedder,
        *,
        candidate_factor: int = 4,
        evidence_cache_size: int = 1024,
    ) -> None:
        self._catalog = catalog
        self._store = store
        self._embedder = embedder
        self._candidate_factor = candidate_factor
        self._view = KnowledgeView.load(catalog)
        self._lock = threading.Lock()
        self._evidence: OrderedDict[tuple[int, str, str | None, int, float], Evidence] = OrderedDict()
        self._evidence_size = evidence_cache_size
        self.searches = 0  # how many times the store was searched (tests assert on it)

    @property
    def embedder_name(self) -> str:
        return self._embedder.name

    def view(self) -> KnowledgeView:
        """The current snapshot, reloaded when another process committed an ingest."""
        generation = self._catalog.generation()
        if generation != self._view.generation:
            with self._lock:
                if generation != self._view.generation:
                    self._view = KnowledgeView.load(self._catalog)
        return self._view

    def cached_evidence(
        self, query: str, domain: str | None, top_k: int, cross_language_offset: float = 0.0
    ) -> Evidence | None:
        """Evidence of an identical earlier query against the same catalog generation, if any."""
        key = (self._view.generation, query, domain, top_k, cross_language_offset)
        with self._lock:
            found = self._evidence.get(key)
            if found is not None:
                self._evidence.move_to_end(key)
            return found

    def retrieve(
        self, query: str, domain: str | None, top_k: int, cross_language_offset: float = 0.0
    ) -> Evidence:
        """Run L0 and L1 for the query; identical repeats are served from a small cache."""
        view = self.view()
        cached = self.cached_evidence(query, domain, top_k, cross_language_offset)
        if cached is not None:
            return cached
        l0 = tuple(view.keywords.match(query, domain))
        other = "en" if detect_language(query) == "zh" else "zh"
        # With chunks written purely in the other language, search them apart from the rest:
        # they score lower across languages and would otherwise never reach the candidates.
        plans = ((None, other), (other, None)) if other in view.languages else ((None, None),)
        vector = self._embedder.embed_query(query)
        raw: dict[tuple[str, bool], float] = {}
        scores: list[float] = []
        for (language, _), hits in zip(plans, self._search_each(vector, top_k, domain, plans), strict=True):
            self.searches += 1
            for hit in hits:
                scores.append(hit.score)
                entry = view.entries.get(hit.doc_key)
                # A chunk is visible only while its hash is the catalog's: that hides half-ingested
                # or stale versions, so old and new chunks of a document never mix.
                if entry is None or entry.content_hash != hit.doc_hash:
                    continue
                key = (hit.doc_key, language is not None)
                raw[key] = max(raw.get(key, -1.0), hit.score)
        raw_items = tuple((doc_key, cross, cosine) for (doc_key, cross), cosine in raw.items())
        evidence = Evidence(
            l0_doc_keys=l0,
            similarities=rank_similarities(raw_items, cross_language_offset),
            l1_scores=tuple(scores),
            raw=raw_items,
        )
        with self._lock:
            self._evidence[(view.generation, query, domain, top_k, cross_language_offset)] = evidence
            while len(self._evidence) > self._evidence_size:
                self._evidence.popitem(last=False)
        return evidence

    def _search_each(
        self,
        vector: np.ndarray,
        top_k: int,
        domain: str | None,
        plans: Sequence[tuple[str | None, str | None]],
    ) -> list[list[ChunkHit]]:
        """The planned store searches side by side: the lookup waits for about one search, not the sum.

        The first runs in this thread and the others on a small shared pool; the store's client is
        thread-safe, and most of a search's latency is the round trip to Milvus, which overlaps.
        """
        limit = top_k * self._candidate_factor

        def search(plan: tuple[str | None, str | None]) -> list[ChunkHit]:
            language, exclude = plan
            return self._store.search(
                vector, limit=limit, domain=domain, language=language, exclude_language=exclude
            )

        others = [_search_pool().submit(search, plan) for plan in plans[1:]]
        first = search(plans[0])
        return [first, *(future.result() for future in others)]

    def knowledge_map(self) -> KnowledgeMap:
        """Every domain with what it covers and when to retrieve from it."""
        view = self.view()
        by_domain: dict[str, list[CatalogEntry]] = defaultdict(list)
        for entry in view.entries.values():
            by_domain[entry.domain].append(entry)
        domains = [_domain_info(name, entries) for name, entries in sorted(by_domain.items())]
        return KnowledgeMap(domains=domains, document_count=len(view.entries))


_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _search_pool() -> ThreadPoolExecutor:
    """One process-wide pool for the extra per-language searches (engines come and go in tests)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="store-search")
        return _pool


def _domain_info(name: str, entries: Sequence[CatalogEntry]) -> DomainInfo:
    titles = [e.title for e in entries]
    keywords = [k for e in entries for k in e.keywords]
    covers = list(dict.fromkeys([*titles, *keywords]))
    description = next((e.domain_description for e in entries if e.domain_description), "")
    if not description:
        # No front matter says what the domain is: aggregate from the titles.
        description = f"{len(entries)} documents about: " + "; ".join(titles[:8])
    when = next((e.when_to_retrieve for e in entries if e.when_to_retrieve), "")
    if not when:
        when = f"When the question concerns {name}: " + ", ".join(titles[:5])
    return DomainInfo(
        domain_id=name,
        description=description,
        covers=covers[:40],
        document_count=len(entries),
        when_to_retrieve=when,
    )
