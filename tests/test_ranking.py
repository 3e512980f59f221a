"""The fused ranking of documents: a document's score and figures come from its best chunk."""

from __future__ import annotations

import pytest

from retrieval.engine import DenseHit, Evidence
from retrieval.ranking import L0_BONUS, features, rank
from storage.keyword_index import L0Hit
from storage.lexical_index import LexicalHit

QUERY = "redis failover timeout"
WEIGHTS = (("failover", 2.0), ("redis", 1.0), ("timeout", 1.0))


def _evidence() -> Evidence:
    return Evidence(
        query=QUERY,
        l0=(L0Hit("one.md", "keyword", "redis"),),
        specific_keyword_docs=(),
        dense=(
            DenseHit("one#0", "one.md", 0.80, cross_language=False),
            DenseHit("two#0", "two.md", 0.70, cross_language=True),
            DenseHit("two#1", "two.md", 0.86, cross_language=False),
            DenseHit("two#2", "two.md", 0.60, cross_language=False),
        ),
        lexical=(
            LexicalHit("two#2", "two.md", 9.0, frozenset({"failover", "redis"})),
            LexicalHit("three#0", "three.md", 3.0, frozenset({"timeout"})),
        ),
        term_weights=WEIGHTS,
    )


def test_a_document_is_scored_by_its_best_chunk_plus_the_exact_match_bonus() -> None:
    by_doc = {d.doc_key: d for d in rank(_evidence(), cross_language_offset=0.05, lexical_weight=0.5)}
    one, two, three = by_doc["one.md"], by_doc["two.md"], by_doc["three.md"]
    # A document with one candidate chunk: that chunk's figures, and the L0 bonus when named.
    assert (one.score, one.similarity, one.coverage, one.l0) == (0.80 + L0_BONUS, 0.80, 0.0, True)
    assert [c.chunk_id for c in one.chunks] == ["one#0"]
    # Found by the lexical search alone: scored as the weakest dense hit, plus its coverage.
    assert three.similarity is None
    assert three.score == pytest.approx(0.60 + 0.5 * 0.25)
    # Several chunks: best first; the document keeps the best similarity and coverage of any.
    assert [c.chunk_id for c in two.chunks] == ["two#2", "two#1", "two#0"]
    assert two.score == pytest.approx(0.60 + 0.5 * 0.75)
    assert two.similarity == pytest.approx(0.86)
    assert two.coverage == pytest.approx(0.75)
    assert not two.l0


def test_documents_come_best_first() -> None:
    ranked = rank(_evidence(), cross_language_offset=0.05, lexical_weight=0.5)
    assert [d.doc_key for d in ranked] == ["two.md", "one.md", "three.md"]
    assert [d.score for d in ranked] == sorted((d.score for d in ranked), reverse=True)


def _two_languages() -> Evidence:
    """An English question: an English chunk, and a slightly less similar Chinese one."""
    return Evidence(
        query="how long is a welding permit valid",
        l0=(),
        specific_keyword_docs=(),
        dense=(
            DenseHit("en#0", "en.md", 0.80, cross_language=False),
            DenseHit("zh#0", "zh.md", 0.78, cross_language=True),
        ),
        lexical=(),
        term_weights=(),
    )


def test_the_cross_language_offset_reorders_documents_but_the_tier_features_read_the_cosine() -> None:
    ranked = rank(_two_languages(), cross_language_offset=0.05, lexical_weight=0.5)
    # The offset ranks the other-language chunk first (0.78 + 0.05 > 0.80) ...
    assert [d.doc_key for d in ranked] == ["zh.md", "en.md"]
    assert ranked[0].score == pytest.approx(0.83)
    # ... while what the tier models read is the cosine as measured, whatever the offset.
    assert [d.similarity for d in ranked] == [0.78, 0.80]
    assert [c.similarity for c in ranked[0].chunks] == [0.78]
    feats = features(_two_languages(), ranked)
    assert feats["similarity"] == pytest.approx(0.80)
    assert feats["margin"] == pytest.approx(0.02)
    # Only the gap between the fused scores of the first two documents sees the offset.
    without = features(_two_languages(), rank(_two_languages(), 0.0, 0.5))
    assert {k: v for k, v in without.items() if k != "gap"} == {k: v for k, v in feats.items() if k != "gap"}


def test_terms_the_knowledge_base_never_names_are_features() -> None:
    # "paypal" occurs in no chunk; "timeout" is matched, but not by the top document (two.md).
    base = _evidence()
    evidence = Evidence(
        query="redis failover timeout paypal",
        l0=base.l0,
        specific_keyword_docs=(),
        dense=base.dense,
        lexical=base.lexical,
        term_weights=(*WEIGHTS, ("paypal", 3.0)),
        unseen=("paypal",),
        background=0.42,
    )
    ranked = rank(evidence, 0.0, 0.1)
    assert ranked[0].doc_key == "two.md"
    feats = features(evidence, ranked)
    assert feats["unseen"] == pytest.approx(1 / 4)
    assert feats["unseen_name"] == 1.0
    assert feats["top_unseen"] == pytest.approx(1.0 / 4.0)  # timeout's weight of the matched 4
    assert feats["background"] == 0.42
    plain = features(base, rank(base, 0.0, 0.1))
    assert (plain["unseen"], plain["unseen_name"], plain["background"]) == (0.0, 0.0, 0.0)
