"""Fuse the dense and lexical evidence into one ranking of documents and their best chunks.

Pure functions over ``Evidence``: the lookup service and the offline calibration rank the same
way. A chunk's score is its dense similarity plus ``lexical_weight`` times its coverage (the
share of the query's term weight it contains). A linear fusion, rather than reciprocal rank
fusion, because rank fusion lets any same-language chunk that shares a common word outrank the
document that answers a question asked in the other language: held out per knowledge base,
rank fusion found 7 of 76 cross-language answers first, the linear fusion 30, with the same
gain on same-language questions (see docs/relevance.md).

Two more terms enter the same sum when the evidence has them: ``sparse_weight`` times the
chunk's BGE-M3 lexical match (bge-m3 only) and ``rerank_weight`` times its reranker score
(only with the reranker enabled). Without them the fusion is exactly the two-term one.

The cross-language offset (added to the similarity of a chunk written in the other language than
the query) enters the fused score only. The figures the tier models read (``similarity``,
``margin``, ``support``) are the cosines as measured: held out, an offset of 0.05-0.06 ranked
far more answers to questions asked in the other language into the top three, but applied to
the features as well it lifted off-topic questions' best other-language chunk above the on-topic
threshold (11 rather than 18 of 54 off-topic questions NO_MATCH).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from retrieval.engine import Evidence
from storage.text import terms

# An exact (L0) match of a title or keyword adds this much: evidence, not proof.
L0_BONUS = 0.05
# A Latin word or identifier of three characters or more: a brand, carrier, product or place
# shows up in either script as one. CJK bigrams are too often split words to count as names.
_NAME = re.compile(r"[a-z][a-z0-9_]{2,}")


class ChunkScore(NamedTuple):  # one per candidate chunk (a named tuple: see storage.vector_store.ChunkHit)
    chunk_id: str
    doc_key: str
    fused: float
    similarity: float | None  # dense cosine (no offset), when the dense search found it
    coverage: float  # share of the query's term weight that the chunk contains (0..1)
    sparse: float = 0.0  # BGE-M3 lexical match, 1.0 = as strong as the query against itself
    rerank: float | None = None  # reranker score (0..1), when the reranker scored this chunk


class RankedDoc(NamedTuple):  # one per candidate document (a named tuple: see storage.vector_store.ChunkHit)
    doc_key: str
    score: float  # the best chunk's fused score, plus the L0 bonus
    similarity: float | None  # the best cosine of the document's chunks (no offset)
    coverage: float  # the document's best chunk coverage
    chunks: tuple[ChunkScore, ...]  # this document's scored chunks, best first
    l0: bool  # named exactly by the query (code, title or keyword)
    sparse: float = 0.0  # the document's best chunk lexical match (BGE-M3)


# Builds a named tuple from all its fields in order, in C: its generated __new__ is a Python
# call with keyword handling, once per candidate chunk and again per document (~80 and ~75 a
# lookup at 10k chunks).
_new = tuple.__new__


def similarity(cosine: float, cross_language: bool, offset: float) -> float:
    """The cosine as it ranks: plus the calibrated offset for a chunk in the other language than the query."""
    return cosine + offset if cross_language else cosine


def rank(
    evidence: Evidence,
    cross_language_offset: float,
    lexical_weight: float,
    sparse_weight: float = 0.0,
    rerank_weight: float = 0.0,
) -> list[RankedDoc]:
    """Documents best first, by the fused score of their best chunk."""
    weights = dict(evidence.term_weights)
    total = sum(weights.get(t, 0.0) for t in set(terms(evidence.query))) or 1.0
    sims: dict[str, float] = {}  # what ranks: the cosine with the cross-language offset
    cosines: dict[str, float] = {}  # what the tier features read: the cosine as measured
    doc_of: dict[str, str] = {}
    for hit in evidence.dense:
        sims[hit.chunk_id] = similarity(hit.cosine, hit.cross_language, cross_language_offset)
        cosines[hit.chunk_id] = hit.cosine
        doc_of[hit.chunk_id] = hit.doc_key
    coverage = {h.chunk_id: sum(weights.get(t, 0.0) for t in h.terms) / total for h in evidence.lexical}
    doc_of.update({hit.chunk_id: hit.doc_key for hit in evidence.lexical})
    # A chunk only the lexical search found is scored as if it were the weakest dense hit.
    floor = min(sims.values(), default=0.0)
    sparse = dict(evidence.sparse)
    reranked = dict(evidence.rerank)
    # Likewise a candidate the reranker did not read counts as its weakest pick, so that
    # reranking a few never buries the rest below documents it did not look at either.
    rerank_floor = min(reranked.values(), default=0.0)
    by_doc: dict[str, list[ChunkScore]] = {}
    # Without BGE-M3 weights or reranker scores (e5-small, the reranker off) their terms add
    # exactly 0.0, which leaves a float unchanged: the plain sum is the same number, cheaper.
    two_terms = not sparse and not reranked
    for chunk in sims.keys() | coverage.keys():
        doc = doc_of[chunk]
        sim = sims.get(chunk)
        covered = coverage.get(chunk, 0.0)
        matched = sparse.get(chunk, 0.0)
        fused = (floor if sim is None else sim) + lexical_weight * covered
        if not two_terms:  # added term by term, left to right, as one sum would be
            fused = fused + sparse_weight * matched + rerank_weight * reranked.get(chunk, rerank_floor)
        fields = (chunk, doc, fused, cosines.get(chunk), covered, matched, reranked.get(chunk))
        by_doc.setdefault(doc, []).append(_new(ChunkScore, fields))
    l0_docs = {h.doc_key for h in evidence.l0}
    for doc in l0_docs - by_doc.keys():
        by_doc[doc] = []
    ranked = [_ranked_doc(doc, chunks, doc in l0_docs, floor) for doc, chunks in by_doc.items()]
    return sorted(ranked, key=lambda d: (-d.score, d.doc_key))


def _ranked_doc(doc_key: str, chunks: list[ChunkScore], l0: bool, floor: float) -> RankedDoc:
    if len(chunks) == 1:
        # Most candidate documents have one candidate chunk: its own figures, without the scans
        # (grading took 1.2 ms of a lookup at 10k chunks, most of it here, for ~76 documents).
        (only,) = chunks
        bonus = L0_BONUS if l0 else 0.0
        fields = (doc_key, only.fused + bonus, only.similarity, only.coverage, (only,), l0, only.sparse)
        return _new(RankedDoc, fields)
    chunks.sort(key=lambda c: (-c.fused, c.chunk_id))
    sims = [c.similarity for c in chunks if c.similarity is not None]
    return RankedDoc(
        doc_key=doc_key,
        score=(chunks[0].fused if chunks else floor) + (L0_BONUS if l0 else 0.0),
        similarity=max(sims) if sims else None,
        coverage=max((c.coverage for c in chunks), default=0.0),
        chunks=tuple(chunks),
        l0=l0,
        sparse=max((c.sparse for c in chunks), default=0.0),
    )


def features(evidence: Evidence, ranked: list[RankedDoc]) -> dict[str, float]:
    """What the tier models read: how strong, how clear and how much the channels agree."""
    by_similarity = sorted(
        (d for d in ranked if d.similarity is not None), key=lambda d: -(d.similarity or 0.0)
    )
    best = by_similarity[0].similarity or 0.0 if by_similarity else 0.0
    second = by_similarity[1].similarity or 0.0 if len(by_similarity) > 1 else 0.0
    lexical_top = evidence.lexical[0].doc_key if evidence.lexical else None
    dense_top = by_similarity[0].doc_key if by_similarity else None
    return {
        "similarity": best,
        "margin": best - second,
        "gap": ranked[0].score - ranked[1].score if len(ranked) > 1 else (ranked[0].score if ranked else 0.0),
        "coverage": max((d.coverage for d in ranked), default=0.0),
        # Both channels on one chunk: a query word that happens to occur in an unrelated chunk
        # gives coverage without similarity, and an off-topic question shares no more than that.
        "support": max(
            (c.coverage * max(c.similarity or 0.0, 0.0) for d in ranked for c in d.chunks), default=0.0
        ),
        "top_coverage": ranked[0].coverage if ranked else 0.0,
        "agree": float(dense_top is not None and dense_top == lexical_top),
        "l0": float(bool(evidence.l0)),
        "sparse": max((d.sparse for d in ranked), default=0.0),
        "rerank": _top_rerank(ranked),
        # Terms of the query the knowledge base never names: evidence that it does not answer.
        "unseen": len(evidence.unseen) / len(evidence.term_weights) if evidence.term_weights else 0.0,
        "unseen_name": float(any(_NAME.fullmatch(t) for t in evidence.unseen)),
        "top_unseen": _top_unseen(evidence, ranked),
        "background": evidence.background,
    }


def _top_unseen(evidence: Evidence, ranked: list[RankedDoc]) -> float:
    """The share of the matched query terms' weight that the top document does not hold.

    Counted over the terms some chunk matched (the lexical search leaves out the commonest): a
    top document that lacks the rare words the knowledge base does have is a weak answer.
    """
    if not ranked or not evidence.lexical:
        return 0.0
    top = ranked[0].doc_key
    matched: set[str] = set()
    held: set[str] = set()
    for hit in evidence.lexical:
        matched |= hit.terms
        if hit.doc_key == top:
            held |= hit.terms
    weights = dict(evidence.term_weights)
    total = sum(weights.get(t, 0.0) for t in matched)
    return sum(weights.get(t, 0.0) for t in matched - held) / total if total else 0.0


def _top_rerank(ranked: list[RankedDoc]) -> float:
    """The reranker's score of the top document's best chunk (0 when it was not reranked)."""
    if not ranked:
        return 0.0
    return max((c.rerank for c in ranked[0].chunks if c.rerank is not None), default=0.0)
