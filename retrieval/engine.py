"""The retrieval core: L0 exact matches, one dense search and one lexical search over visible chunks.

On the bge-m3 path the candidate chunks (the union of both searches) are also scored with
BGE-M3's lexical weights; with the reranker enabled, the best few are scored by it too.

Synchronous on purpose; the server calls it through ``asyncio.to_thread``. The engine gathers raw
evidence only; ranking and grading are pure functions in ``retrieval.ranking`` and
``retrieval.relevance``, so calibration can re-score the same evidence offline.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple, Protocol

import numpy as np

from retrieval.background import Background
from retrieval.embedders import QueryEncoding
from retrieval.knowledge_map import knowledge_map_of
from retrieval.models import KnowledgeMap
from retrieval.names import names_beside_terms
from retrieval.places import places_named, written_terms
from retrieval.reranker import PassageReranker
from retrieval.sparse import LexicalWeights, match_scores
from storage.catalog import Catalog
from storage.catalog_records import CatalogEntry, ChunkRecord
from storage.chunking import chunk_context
from storage.keyword_index import KeywordEntry, KeywordIndex, L0Hit
from storage.lexical_index import LexicalHit, LexicalIndex, bm25_idf
from storage.text import detect_language, identifiers, query_labels, terms
from storage.vector_store import ChunkHit

# Chunks fetched from each channel. One dense search serves both languages: a chunk written in
# the other language scores ~0.05 lower with e5, so the limit is wide enough to bring it in
# and the ranking adds the calibrated offset back.
DENSE_LIMIT = 48
LEXICAL_LIMIT = 32
# Documents read per label of the query: the PRECISE rules ask whether one or more hold it.
LABEL_HOLDERS = 3
# Terms in more than this share of chunks say little (and are most of the postings to score).
_COMMON_TERM_SHARE = 0.25
# Threads of an engine's own search pool (``search_pool``): one per concurrent fresh lookup, up to this.
SEARCH_THREADS = 4


class VectorSearch(Protocol):
    def search(self, vector: np.ndarray, *, limit: int, domain: str | None) -> list[ChunkHit]: ...


class QueryEmbedder(Protocol):
    name: str

    def encode_query(self, text: str) -> QueryEncoding: ...


class DenseHit(NamedTuple):  # one per dense hit (a named tuple: see storage.vector_store.ChunkHit)
    chunk_id: str
    doc_key: str
    cosine: float
    cross_language: bool  # the chunk is written purely in the other language than the query


@dataclass(frozen=True)
class Evidence:
    """Raw retrieval evidence for one query, before ranking, grading and dedup."""

    query: str
    l0: tuple[L0Hit, ...]
    # Documents identified by exactly one matched keyword that no other document contains.
    specific_keyword_docs: tuple[str, ...]
    dense: tuple[DenseHit, ...]
    lexical: tuple[LexicalHit, ...]
    # Inverse document frequency of each query term: the weight of a lexical match.
    term_weights: tuple[tuple[str, float], ...]
    # chunk_id -> BGE-M3 lexical match (retrieval.sparse) of every candidate chunk; empty with e5.
    sparse: tuple[tuple[str, float], ...] = ()
    # chunk_id -> reranker score (0..1) of the best few candidates; empty unless it is enabled.
    rerank: tuple[tuple[str, float], ...] = ()
    # The query's terms that no visible chunk holds: a name the knowledge base never mentions.
    unseen: tuple[str, ...] = ()
    # How close the query sits to questions no team's knowledge base answers (retrieval.background).
    background: float = 0.0
    # label -> up to three documents whose text holds it as a word, for each label-shaped word of
    # the query and each code hit running text would not count as a code (retrieval.precise).
    label_holders: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Each place the query names (retrieval.places, lower-cased) and whether the knowledge base
    # writes it, in either script.
    places: tuple[tuple[str, bool], ...] = ()
    # Names it writes that the knowledge base lacks beyond ``unseen`` (retrieval.names).
    names: tuple[str, ...] = ()


@dataclass(frozen=True)
class KnowledgeView:
    """An immutable snapshot of the catalog, swapped whole when the catalog changes."""

    generation: int
    entries: dict[str, CatalogEntry]
    keywords: KeywordIndex
    chunks: dict[str, tuple[str, int, str]]  # chunk_id -> (doc_key, index, language)
    lexical: LexicalIndex

    @classmethod
    def load(cls, catalog: Catalog) -> KnowledgeView:
        """The catalog as one committed state, even while another process commits an ingest."""
        with catalog.snapshot():
            generation = catalog.generation()
            entries = {e.doc_key: e for e in catalog.entries()}
            index = KeywordIndex(
                KeywordEntry(e.doc_key, e.domain, e.title, e.keywords, e.identifiers)
                for e in entries.values()
            )
            return cls(generation, entries, index, catalog.chunk_index(), LexicalIndex(catalog.term_rows()))

    # Computed once per snapshot: scanning every entry on each lookup grew linearly with the corpus.
    @cached_property
    def _domain_names(self) -> tuple[str, ...]:
        return tuple(sorted({e.domain for e in self.entries.values()}))

    @property
    def domains(self) -> list[str]:
        return list(self._domain_names)


class KnowledgeEngine:
    """Answers ``retrieve`` over the catalog's visible chunks."""

    def __init__(
        self,
        catalog: Catalog,
        store: VectorSearch,
        embedder: QueryEmbedder,
        *,
        evidence_cache_size: int = 1024,
        reranker: PassageReranker | None = None,
        rerank_top_n: int = 8,
        background: Background | None = None,
        search_pool: Executor | None = None,
    ) -> None:
        self._catalog = catalog
        # Owned by the engine unless given (``close`` shuts it); threads start as lookups need them.
        self._owns_pool = search_pool is None
        self._search_pool = search_pool or ThreadPoolExecutor(
            SEARCH_THREADS, thread_name_prefix="dense-search"
        )
        self._background = background
        self._common_words = background.words if background is not None else frozenset()
        self._store = store
        self._embedder = embedder
        self.reranker = reranker
        self._rerank_top_n = rerank_top_n
        self._view = KnowledgeView.load(catalog)
        self._lock = threading.Lock()
        self._catalog_lock = threading.Lock()  # one sqlite3 connection, used from several threads
        self._loading = threading.Lock()  # one reload at a time
        self._evidence: OrderedDict[tuple[int, str, str | None], Evidence] = OrderedDict()
        self._evidence_size = evidence_cache_size
        self.searches = 0  # how many times the store was searched (tests assert on it)

    @property
    def embedder_name(self) -> str:
        return self._embedder.name

    def close(self) -> None:
        """Stop the search pool's threads, if the engine made it (a search in flight finishes)."""
        if self._owns_pool:
            self._search_pool.shutdown(wait=False)

    def current_view(self) -> KnowledgeView | None:
        """The snapshot if it is still the catalog's state, else None: then ``view()`` must reload.

        One short read: the event loop may call it, where a reload (0.8 s at 10k chunks, seconds
        at 100k) would stall every request in flight.
        """
        with self._catalog_lock:
            generation = self._catalog.generation()
        view = self._view
        return view if view.generation == generation else None

    def view(self) -> KnowledgeView:
        """The current snapshot, reloaded when an ingest committed since (blocking: not on the event loop).

        The reload reads through a connection of its own and holds neither the shared connection
        nor the evidence cache, so lookups still answering from the previous view go on meanwhile.
        """
        current = self.current_view()
        if current is not None:
            return current
        with self._loading:
            if self.current_view() is None:  # not already reloaded by the call this one waited for
                reader = self._catalog.reader()
                try:
                    self._view = KnowledgeView.load(reader)
                finally:
                    reader.close()
        return self._view

    def cached_evidence(
        self, query: str, domain: str | None, view: KnowledgeView | None = None
    ) -> Evidence | None:
        """Evidence of an identical earlier query against the same view (default: the current one)."""
        key = ((self._view if view is None else view).generation, query, domain)
        with self._lock:
            found = self._evidence.get(key)
            if found is not None:
                self._evidence.move_to_end(key)
            return found

    def retrieve(self, query: str, domain: str | None, view: KnowledgeView | None = None) -> Evidence:
        """Run L0, the dense and the lexical search; identical repeats are served from a cache.

        ``view`` is the snapshot the caller will grade the evidence against (default: the
        current one), so a reload in between cannot mix two generations in one answer.
        """
        view = self.view() if view is None else view
        cached = self.cached_evidence(query, domain, view)
        if cached is not None:
            return cached
        encoding = self._embedder.encode_query(query)
        # The store searches on another thread while this one does the work that needs no hits.
        # Milvus Lite searches in Python here and releases the GIL only for its cosine step, so
        # the two overlap little: the orders tried since (text work on the pool, search first,
        # all serial, text work before the embedding) were all within noise of this one.
        # (Encoding beside this work gained nothing: the model's OpenMP team uses both cores.)
        search = self._search_pool.submit(
            self._store.search, encoding.vector, limit=DENSE_LIMIT, domain=domain
        )
        weights, unseen, lexical_hits = _lexical(view, query, domain)
        l0 = tuple(view.keywords.match(query, domain))
        # Its full-text queries need only the L0 hits: run before the wait, not after it.
        specific = self._specific_keyword_docs(l0)
        holders = self._label_holders(query, l0)
        places = tuple(
            (place, _written(view, place)) for place in places_named(query, view.lexical.frequency)
        )
        visible_lexical = tuple(h for h in lexical_hits if h.chunk_id in view.chunks)
        language = detect_language(query)
        background = self._background.similarity(encoding.vector) if self._background else 0.0
        hits = search.result()
        self.searches += 1
        dense = tuple(_visible_dense(view, hits, language))
        # e5-small has no lexical weights and the reranker is off by default: then neither
        # extra step runs and the evidence is what it always was.
        sparse = self._sparse(encoding.lexical, dense, visible_lexical) if encoding.lexical else {}
        rerank = self._rerank(query, view, dense, visible_lexical, sparse)
        evidence = Evidence(
            query=query,
            l0=l0,
            specific_keyword_docs=specific,
            dense=dense,
            lexical=visible_lexical,
            term_weights=tuple(sorted(weights.items())),
            sparse=tuple(sorted(sparse.items())),
            rerank=tuple(sorted(rerank.items())),
            unseen=unseen,
            background=background,
            label_holders=holders,
            places=places,
            names=names_beside_terms(query, unseen, view.keywords, self._common_words),
        )
        with self._lock:
            self._evidence[(view.generation, query, domain)] = evidence
            while len(self._evidence) > self._evidence_size:
                self._evidence.popitem(last=False)
        return evidence

    def _sparse(
        self, query: LexicalWeights, dense: Sequence[DenseHit], lexical: Sequence[LexicalHit]
    ) -> dict[str, float]:
        """BGE-M3 lexical match of every candidate chunk (dense and FTS hits alike)."""
        candidates = list(dict.fromkeys([*(h.chunk_id for h in dense), *(h.chunk_id for h in lexical)]))
        with self._catalog_lock:
            stored = self._catalog.lexical_weights(candidates)
        return match_scores(query, stored, candidates)

    def _rerank(
        self,
        query: str,
        view: KnowledgeView,
        dense: Sequence[DenseHit],
        lexical: Sequence[LexicalHit],
        sparse: dict[str, float],
    ) -> dict[str, float]:
        """Reranker scores of the best few candidates, read with their title and heading as embedded."""
        if self.reranker is None:
            return {}
        by_sparse = sorted(sparse, key=lambda cid: -sparse[cid])
        chosen = interleave(
            [h.chunk_id for h in dense], [h.chunk_id for h in lexical], by_sparse, limit=self._rerank_top_n
        )
        with self._catalog_lock:
            records = self._catalog.chunks_by_id(chosen)
        ids = [cid for cid in chosen if cid in records and records[cid].doc_key in view.entries]
        passages = [_passage_text(view.entries[records[cid].doc_key], records[cid]) for cid in ids]
        return dict(zip(ids, self.reranker.score(query, passages), strict=True))

    def _specific_keyword_docs(self, l0: Sequence[L0Hit]) -> tuple[str, ...]:
        """Documents named by a keyword that no other document's text contains."""
        docs: set[str] = set()
        for hit in l0:
            if hit.kind != "keyword":
                continue
            with self._catalog_lock:
                containing = self._catalog.documents_containing(terms(hit.term), limit=2)
            if containing <= {hit.doc_key}:
                docs.add(hit.doc_key)
        return tuple(sorted(docs))

    def _label_holders(self, query: str, l0: Sequence[L0Hit]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The documents holding each label of the query (W805, ECR) and each code hit running text
        would not count as one (L1): the code index holds those only where a document defines them.
        One full-text query per label, not a scan of the bodies."""
        shorts = [h.term.upper() for h in l0 if h.kind == "code" and not identifiers(h.term)]
        holders = []
        for label in dict.fromkeys([*query_labels(query), *shorts]):
            with self._catalog_lock:
                docs = self._catalog.documents_containing(terms(label), limit=LABEL_HOLDERS)
            holders.append((label, tuple(sorted(docs))))
        return tuple(holders)

    def chunks_of(self, doc_key: str) -> list[ChunkRecord]:
        """A document's visible chunks in order (for passages and whole-document reads)."""
        with self._catalog_lock:
            return self._catalog.chunks_of(doc_key)

    def knowledge_map(self, view: KnowledgeView | None = None) -> KnowledgeMap:
        """Every domain with what it covers and when to retrieve from it."""
        view = self.view() if view is None else view
        return knowledge_map_of(view.entries.values())


def interleave(*orders: Sequence[str], limit: int) -> list[str]:
    """The first ``limit`` distinct ids taking each ranking's next best in turn.

    The engine picks what to rerank without the tier model's fusion weights: those reload hot,
    and evidence (cached, and re-scored offline by calibration) must not depend on them. Taking
    turns gives each channel's best an equal chance, whatever their scales.
    """
    chosen: dict[str, None] = {}
    for rank in range(max((len(o) for o in orders), default=0)):
        for order in orders:
            if rank < len(order):
                chosen.setdefault(order[rank])
            if len(chosen) >= limit:
                return list(chosen)
    return list(chosen)


def _passage_text(entry: CatalogEntry, chunk: ChunkRecord) -> str:
    return f"{chunk_context(entry.title, chunk.heading)}\n{chunk.text}"


def _lexical(
    view: KnowledgeView, query: str, domain: str | None
) -> tuple[dict[str, float], tuple[str, ...], list[LexicalHit]]:
    """The query terms' weights, those no chunk holds, and the chunks sharing its useful terms by BM25."""
    stats = view.lexical.stats(terms(query))
    weights = stats.weights()
    if not weights:
        return {}, (), []
    unseen = tuple(t for t, frequency in stats.frequency.items() if not frequency)
    useful = _useful_terms(weights, stats.total)  # the same chunk count the weights were taken over
    return weights, unseen, view.lexical.search(useful, limit=LEXICAL_LIMIT, domain=domain)


def _written(view: KnowledgeView, place: str) -> bool:
    """Whether some chunk holds every term of one of the place's spellings."""
    return any(all(view.lexical.frequency(t) for t in spelled) for spelled in written_terms(place))


def _useful_terms(weights: dict[str, float], chunk_count: int) -> list[str]:
    """The query terms worth matching, rarest first: none in over a quarter of the chunks, unless rarest."""
    ceiling = max(weights.values())
    floor = _idf_floor(chunk_count)  # "in a quarter of the chunks"
    return sorted(
        (t for t, w in weights.items() if w >= floor or w == ceiling), key=lambda t: (-weights[t], t)
    )


def _idf_floor(chunk_count: int) -> float:
    return bm25_idf(chunk_count, chunk_count * _COMMON_TERM_SHARE)


def _visible_dense(view: KnowledgeView, hits: Sequence[ChunkHit], query_language: str) -> list[DenseHit]:
    """Hits of visible chunks only: that hides half-ingested or stale versions of a document."""
    out = []
    for hit in hits:
        known = view.chunks.get(hit.chunk_id)
        if known is None:
            continue
        language = known[2]
        cross = language in ("zh", "en") and language != query_language
        out.append(DenseHit(hit.chunk_id, known[0], hit.score, cross))
    return out
