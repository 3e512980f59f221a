"""The lexical channel: BM25 over the catalog's chunk terms, scored in memory exactly as FTS5 scores them."""

from __future__ import annotations

import itertools
import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from retrieval import engine
from storage.catalog import Catalog
from storage.lexical_index import LexicalIndex, TermRow, TermStats
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


def fts5(
    path: Path, query_terms: list[str], limit: int, domain: str | None = None
) -> list[tuple[str, str, float]]:
    """FTS5's own ranking and bm25() scores: what the in-memory index must return, bit for bit."""
    match = " OR ".join(f'"{t}"' for t in sorted(set(query_terms)))
    sql = "SELECT chunk_id, doc_key, -bm25(chunk_terms) FROM chunk_terms WHERE chunk_terms MATCH ?"
    params: list[object] = [match]
    if domain is not None:
        sql += " AND domain = ?"
        params.append(domain)
    with sqlite3.connect(path) as db:
        return db.execute(sql + " ORDER BY rank LIMIT ?", [*params, limit]).fetchall()


def searched(
    index: LexicalIndex, query_terms: list[str], limit: int, domain: str | None = None
) -> list[tuple[str, str, float]]:
    return [(h.chunk_id, h.doc_key, h.score) for h in index.search(query_terms, limit=limit, domain=domain)]


@pytest.mark.parametrize("query", QUERIES)
def test_the_index_returns_the_fts5_ranking_with_its_exact_scores(catalog: Catalog, query: str) -> None:
    index = LexicalIndex(catalog.term_rows())
    query_terms = terms(query)
    expected = fts5(catalog.path, query_terms, 20)
    assert expected, f"{query!r} matches nothing in the sample: the comparison proves nothing"
    assert searched(index, query_terms, 20) == expected
    (domain,) = {r.domain for r in catalog.term_rows() if r.doc_key == expected[0][1]}
    assert searched(index, query_terms, 20, domain) == fts5(catalog.path, query_terms, 20, domain)
    texts = {r.chunk_id: set(r.terms.split()) for r in catalog.term_rows()}
    for hit in index.search(query_terms, limit=20):
        assert hit.terms == set(query_terms) & texts[hit.chunk_id] != set()


def test_the_index_matches_fts5_on_ties_common_terms_domains_and_cut_offs(tmp_path: Path) -> None:
    """A random corpus with duplicate chunks (ties at every cut-off) and terms in over half the
    chunks (FTS5 floors their idf at 1e-6): every ranking and score is FTS5's."""
    rng = random.Random(7)
    vocabulary = [f"w{i}" for i in range(300)] + ["超时", "连接", "err_timeout"]
    weights = [1.0 / (rank + 1) for rank in range(len(vocabulary))]
    catalog = Catalog(tmp_path / "catalog.sqlite")
    try:
        rows: list[tuple[str, str]] = []
        for n in range(600):
            text = " ".join(rng.choices(vocabulary, weights, k=rng.randint(1, 120)))
            rows.append((f"d{n % 7}", text))
            if n % 5 == 0:
                rows.append((f"d{n % 7}", text))  # an identical chunk: tied scores
        with sqlite3.connect(catalog.path) as db:
            db.executemany(
                "INSERT INTO chunk_terms (chunk_id, doc_key, domain, terms) VALUES (?, ?, ?, ?)",
                [(f"c{i}", f"doc{i // 3}.md", domain, text) for i, (domain, text) in enumerate(rows)],
            )
        index = LexicalIndex(catalog.term_rows())
        assert index.frequency("w0") > index.total / 2, (
            "no term in over half the chunks: the floor is untested"
        )
        compared = ties = 0
        for _ in range(150):
            query_terms = [*rng.sample(vocabulary, rng.randint(1, 6)), "not_in_the_corpus"]
            limit = rng.choice([1, 3, 10, 32])
            domain = rng.choice([None, None, "d3", "nowhere"])
            expected = fts5(catalog.path, query_terms, limit, domain)
            assert searched(index, query_terms, limit, domain) == expected, (query_terms, limit, domain)
            compared += len(expected)
            ties += sum(a[2] == b[2] for a, b in itertools.pairwise(expected))
        assert compared > 500
        assert ties > 20, "no tied scores: their order is untested"
    finally:
        catalog.close()


def test_term_frequencies_are_the_chunks_holding_each_term(catalog: Catalog) -> None:
    query_terms = terms("Redis failover 超时 zzzunknownterm")
    stats = LexicalIndex(catalog.term_rows()).stats(query_terms)
    with sqlite3.connect(catalog.path) as db:
        (total,) = db.execute("SELECT count(*) FROM chunks").fetchone()
        db.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, chunk_terms, 'row')")
        for term in set(query_terms):
            row = db.execute("SELECT doc FROM temp.vocab WHERE term = ?", (term,)).fetchone()
            assert stats.frequency[term] == (row[0] if row else 0)
    assert stats.total == total > 0
    assert stats.frequency["zzzunknownterm"] == 0
    weights = stats.weights()
    # The rarer the term, the heavier: an unknown term weighs most.
    assert weights["zzzunknownterm"] == max(weights.values())
    by_frequency = sorted(weights, key=lambda t: (stats.frequency[t], t))
    assert [weights[t] for t in by_frequency] == sorted(weights.values(), reverse=True)
    assert len(set(stats.frequency.values())) > 1, "all terms equally common: the order proves nothing"
    assert LexicalIndex([]).stats([]) == TermStats(0, {})
    assert LexicalIndex([]).search(["redis"], limit=5) == []
    assert LexicalIndex([TermRow("c", "d.md", "x", "")]).search(["redis"], limit=5) == []


def test_terms_in_over_a_quarter_of_the_chunks_are_left_out_unless_rarest() -> None:
    stats = TermStats(total=100, frequency={"specific": 3, "everywhere": 60})
    assert engine._useful_terms(stats.weights(), stats.total) == ["specific"]
    only_common = TermStats(total=100, frequency={"everywhere": 60})
    assert engine._useful_terms(only_common.weights(), only_common.total) == ["everywhere"]


def test_the_lexical_channel_follows_the_catalog_generation(catalog: Catalog) -> None:
    """A removed document leaves the lexical hits at the next lookup: the index is the snapshot's."""
    lookups = engine.KnowledgeEngine(catalog, store=None, embedder=None)  # type: ignore[arg-type]
    query = "Redis cluster failover"
    before = {h.doc_key for h in engine._lexical(lookups.view(), query, None)[2]}
    assert "infrastructure/redis-cluster.md" in before
    catalog.remove_document("infrastructure/redis-cluster.md")
    after = {h.doc_key for h in engine._lexical(lookups.view(), query, None)[2]}
    assert after == before - {"infrastructure/redis-cluster.md"} != set()
