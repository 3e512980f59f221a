"""The lexical channel: BM25 over the catalog's FTS5 table, read in one row, within a postings budget."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from retrieval import engine
from storage.catalog import Catalog, TermStats
from storage.text import terms

QUERIES = [
    "ERR_TIMEOUT 是什么",
    "how do I roll back a failed deployment",
    "Redis cluster failover 之后 连接 超时",
    "请假 审批 流程",
    "quarterly billing invoice refund",
]


@pytest.fixture()
def catalog(data_dir: Path) -> Iterator[Catalog]:
    (path,) = (data_dir / "catalog").glob("*.sqlite")
    catalog = Catalog(path)
    try:
        yield catalog
    finally:
        catalog.close()


def row_by_row(path: Path, query_terms: list[str], limit: int) -> list[tuple[str, str, float]]:
    """The plain FTS5 query, one row per hit: what lexical_search must return, bit for bit."""
    match = " OR ".join(f'"{t}"' for t in sorted(set(query_terms)))
    with sqlite3.connect(path) as db:
        return db.execute(
            "SELECT chunk_id, doc_key, -bm25(chunk_terms) FROM chunk_terms WHERE chunk_terms MATCH ? "
            "ORDER BY rank LIMIT ?",
            (match, limit),
        ).fetchall()


@pytest.mark.parametrize("query", QUERIES)
def test_lexical_search_returns_the_fts_ranking_with_exact_scores(catalog: Catalog, query: str) -> None:
    query_terms = terms(query)
    hits = catalog.lexical_search(query_terms, limit=20)
    expected = row_by_row(catalog.path, query_terms, 20)
    assert expected, f"{query!r} matches nothing in the sample: the comparison proves nothing"
    assert [(h.chunk_id, h.doc_key, h.score) for h in hits] == expected
    for hit in hits:
        assert hit.terms and hit.terms <= set(query_terms)


def test_term_stats_count_the_chunks_holding_each_term(catalog: Catalog) -> None:
    query_terms = terms("Redis failover 超时 zzzunknownterm")
    stats = catalog.term_stats(query_terms)
    with sqlite3.connect(catalog.path) as db:
        (total,) = db.execute("SELECT count(*) FROM chunks").fetchone()
        for term in set(query_terms):
            row = db.execute("SELECT doc FROM chunk_vocab WHERE term = ?", (term,)).fetchone()
            assert stats.frequency[term] == (row[0] if row else 0)
    assert stats.total == total > 0
    assert stats.frequency["zzzunknownterm"] == 0
    weights = stats.weights()
    # The rarer the term, the heavier: an unknown term weighs most.
    assert weights["zzzunknownterm"] == max(weights.values())
    by_frequency = sorted(weights, key=lambda t: (stats.frequency[t], t))
    assert [weights[t] for t in by_frequency] == sorted(weights.values(), reverse=True)
    assert len(set(stats.frequency.values())) > 1, "all terms equally common: the order proves nothing"
    assert catalog.term_stats([]) == TermStats(0, {})


def test_the_search_keeps_the_rarest_terms_within_the_postings_budget() -> None:
    budget = engine.LEXICAL_POSTINGS
    frequency = {"rare": 10, "middle": budget // 2, "common": budget, "commonest": budget * 2}
    stats = TermStats(total=budget * 40, frequency=frequency)
    kept = engine._searched_terms(stats, engine._useful_terms(stats.weights(), stats.total))
    assert kept == ["rare", "middle"]


def test_the_rarest_term_is_searched_even_past_the_budget() -> None:
    budget = engine.LEXICAL_POSTINGS
    stats = TermStats(total=budget * 40, frequency={"a": budget * 3, "b": budget * 4})
    assert engine._searched_terms(stats, engine._useful_terms(stats.weights(), stats.total)) == ["a"]


def test_terms_in_over_a_quarter_of_the_chunks_are_left_out_unless_rarest() -> None:
    stats = TermStats(total=100, frequency={"specific": 3, "everywhere": 60})
    assert engine._useful_terms(stats.weights(), stats.total) == ["specific"]
    only_common = TermStats(total=100, frequency={"everywhere": 60})
    assert engine._useful_terms(only_common.weights(), only_common.total) == ["everywhere"]


def test_term_counts_are_read_once_per_catalog_generation(catalog: Catalog) -> None:
    reads: list[list[str]] = []
    real = catalog.term_stats

    def counted(query_terms: list[str]) -> TermStats:
        reads.append(sorted(query_terms))
        return real(query_terms)

    catalog.term_stats = counted  # type: ignore[method-assign]
    counts = engine.TermCounts()
    first = counts.stats(catalog, 1, terms("Redis failover 超时"))
    assert first == real(terms("Redis failover 超时"))
    again = counts.stats(catalog, 1, terms("failover redis"))
    assert again.frequency == {t: first.frequency[t] for t in ("failover", "redis")}
    assert again.total == first.total
    counts.stats(catalog, 1, terms("failover 请假"))
    assert reads[1:] == [sorted(set(terms("请假")))], "only the new terms are read"
    counts.stats(catalog, 2, terms("failover"))
    assert reads[-1] == ["failover"], "a new generation reads afresh"


def test_a_hit_is_credited_with_every_useful_term_it_holds_not_only_the_searched_ones(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The postings budget narrows what finds chunks; coverage still counts the terms cut from the search."""
    query = "数据库 连接池 超时 配置"
    stats = catalog.term_stats(terms(query))
    useful = engine._useful_terms(stats.weights(), stats.total)
    monkeypatch.setattr(engine, "LEXICAL_POSTINGS", 1)  # only the rarest term is searched
    searched = engine._searched_terms(stats, useful)
    assert len(searched) == 1 < len(useful)
    plain = catalog.lexical_search(searched, limit=20)
    credited = catalog.lexical_search(searched, limit=20, credited=useful)
    assert [(h.chunk_id, h.score) for h in plain] == [(h.chunk_id, h.score) for h in credited]
    with sqlite3.connect(catalog.path) as db:
        for hit in credited:
            (text,) = db.execute(
                "SELECT terms FROM chunk_terms WHERE chunk_id = ?", (hit.chunk_id,)
            ).fetchone()
            assert hit.terms == set(useful) & set(text.split())
    assert any(len(h.terms) > 1 for h in credited), "no hit holds a cut term: the test proves nothing"
