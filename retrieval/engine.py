"""The retrieval core: L0 exact match plus L1 semantic search over the visible documents.

Synchronous on purpose; the server calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from retrieval.models import DomainInfo, KnowledgeMap
from retrieval.relevance import cosine_to_similarity
from storage.catalog import Catalog, CatalogEntry
from storage.keyword_index import KeywordEntry, KeywordIndex
from storage.vector_store import ChunkHit


class VectorSearch(Protocol):
    def search(self, vector: np.ndarray, *, limit: int, domain: str | None) -> list[ChunkHit]: ...


class QueryEmbedder(Protocol):
    name: str

    def embed_query(self, text: str) -> np.ndarray: ...


@dataclass(frozen=True)
class Evidence:
    """Raw retrieval evidence for one query, before grading and dedup."""

    l0_doc_keys: tuple[str, ...]
    # Best chunk similarity per visible document, highest first.
    similarities: tuple[tuple[str, float], ...]
    # Raw COSINE scores of the chunks, exactly as the store returned them (log only).
    l1_scores: tuple[float, ...]

    def similarity(self, doc_key: str) -> float | None:
        return dict(self.similarities).get(doc_key)


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

    @property
    def domains(self) -> list[str]:
        return sorted({e.domain for e in self.entries.values()})


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
        self._evidence: OrderedDict[tuple[int, str, str | None, int], Evidence] = OrderedDict()
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

    def cached_evidence(self, query: str, domain: str | None, top_k: int) -> Evidence | None:
        """Evidence of an identical earlier query against the same catalog generation, if any."""
        key = (self._view.generation, query, domain, top_k)
        with self._lock:
            found = self._evidence.get(key)
            if found is not None:
                self._evidence.move_to_end(key)
            return found

    def retrieve(self, query: str, domain: str | None, top_k: int) -> Evidence:
        """Run L0 and L1 for the query; identical repeats are served from a small cache."""
        view = self.view()
        cached = self.cached_evidence(query, domain, top_k)
        if cached is not None:
            return cached
        l0 = tuple(view.keywords.match(query, domain))
        vector = self._embedder.embed_query(query)
        hits = self._store.search(vector, limit=top_k * self._candidate_factor, domain=domain)
        self.searches += 1
        best: dict[str, float] = defaultdict(float)
        for hit in hits:
            entry = view.entries.get(hit.doc_key)
            # A chunk is visible only while its hash is the catalog's: that hides half-ingested
            # or stale versions, so old and new chunks of a document never mix.
            if entry is None or entry.content_hash != hit.doc_hash:
                continue
            best[hit.doc_key] = max(best[hit.doc_key], cosine_to_similarity(hit.score))
        ranked = tuple(sorted(best.items(), key=lambda item: (-item[1], item[0])))
        evidence = Evidence(l0, ranked, tuple(hit.score for hit in hits))
        with self._lock:
            self._evidence[(view.generation, query, domain, top_k)] = evidence
            while len(self._evidence) > self._evidence_size:
                self._evidence.popitem(last=False)
        return evidence

    def knowledge_map(self) -> KnowledgeMap:
        """Every domain with what it covers and when to retrieve from it."""
        view = self.view()
        by_domain: dict[str, list[CatalogEntry]] = defaultdict(list)
        for entry in view.entries.values():
            by_domain[entry.domain].append(entry)
        domains = [_domain_info(name, entries) for name, entries in sorted(by_domain.items())]
        return KnowledgeMap(domains=domains, document_count=len(view.entries))


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
