"""Milvus Lite's search with the visible-rows cache: exact on small corpora, the engine's own above.

Every search runs through the real Lite engine served by ``storage.lite_share``. An exact search
is compared with the cosines of the rows kept beside the collection; an index search runs twice
on the same data, once with the cache installed, once with milvus_lite's own
``execute_search_with_index`` put back.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from storage import lite_search
from storage.vector_store import ChunkRow, MilvusVectorStore, tie_broken

DIM = 16
DOMAINS = ("billing", "network")


@pytest.fixture()
def store(tmp_path: Path) -> Iterator[MilvusVectorStore]:
    store = MilvusVectorStore(
        uri=str(tmp_path / "milvus.db"), token=None, collection="chunks", dim=DIM, timeout_s=30.0
    )
    store.ensure_collection()
    try:
        yield store
    finally:
        store.close()


def installed() -> lite_search.CachedVisibilitySearch:
    from milvus_lite.engine import collection

    search = collection.execute_search_with_index
    assert isinstance(search, lite_search.CachedVisibilitySearch), "lite_share did not install the cache"
    return search


@contextlib.contextmanager
def engine_search() -> Iterator[None]:
    """milvus_lite's own search, for the length of the block."""
    from milvus_lite.engine import collection

    cached = installed()
    collection.execute_search_with_index = cached.original
    try:
        yield
    finally:
        collection.execute_search_with_index = cached


def rows(rng: np.random.Generator, ids: range, version: int) -> list[ChunkRow]:
    out = []
    for i in ids:
        vector = rng.standard_normal(DIM).astype(np.float32)
        out.append(
            ChunkRow(
                f"c{i}", f"doc{i // 3}-v{version}", DOMAINS[i % 2], "en", vector / np.linalg.norm(vector)
            )
        )
    return out


def answers(store: MilvusVectorStore, queries: list[np.ndarray]) -> list[Any]:
    found = []
    for query in queries:
        for domain in (None, *DOMAINS):
            hits = store.search(query, limit=12, domain=domain)
            found.append([(h.chunk_id, h.doc_key, h.score) for h in hits])
    return found


def settle(store: MilvusVectorStore) -> None:
    """Wait for the engine's background compaction and index build that a flush started.

    They run on the engine's worker thread and attach a segment's HNSW index when done: one that
    lands between the two searches of a comparison changes the second's answer (an exact search
    before, the graph's after), whichever search path runs.
    """
    db = store._client._share._db
    db.get_collection(store.collection)._wait_for_bg(timeout=30.0)  # milvus_lite's drain point for tests


def assert_same_as_engine(store: MilvusVectorStore, queries: list[np.ndarray]) -> list[Any]:
    settle(store)
    cached = answers(store, queries)
    with engine_search():
        own = answers(store, queries)
    assert cached == own
    assert any(cached), "the searches found nothing: the comparison proves nothing"
    return cached


class Mirror:
    """The rows the collection holds, kept beside it: the exact answer of every search."""

    def __init__(self, store: MilvusVectorStore) -> None:
        self.store = store
        self.rows: dict[str, tuple[str, str, np.ndarray]] = {}

    def upsert(self, rows: list[ChunkRow]) -> None:
        self.store.upsert(rows)
        for r in rows:
            self.rows[r.chunk_id] = (r.doc_key, r.domain, tie_broken(r.vector, r.chunk_id))

    def delete(self, chunk_ids: list[str]) -> None:
        self.store.delete_chunks(chunk_ids)
        for chunk_id in chunk_ids:
            self.rows.pop(chunk_id, None)

    def answers(self, queries: list[np.ndarray]) -> list[Any]:
        found = []
        for query in queries:
            for domain in (None, *DOMAINS):
                scored = [
                    (float(v @ query / (np.linalg.norm(v) * np.linalg.norm(query))), cid, doc)
                    for cid, (doc, dom, v) in self.rows.items()
                    if domain in (None, dom)
                ]
                found.append([(cid, doc, score) for score, cid, doc in sorted(scored, reverse=True)[:12]])
        return found


def assert_exact(mirror: Mirror, queries: list[np.ndarray]) -> list[Any]:
    got, want = answers(mirror.store, queries), mirror.answers(queries)
    assert [[(c, d) for c, d, _ in hits] for hits in got] == [[(c, d) for c, d, _ in hits] for hits in want]
    assert np.allclose(
        [s for hits in got for *_, s in hits], [s for hits in want for *_, s in hits], atol=1e-5
    )
    assert any(got), "the searches found nothing: the comparison proves nothing"
    return got


@pytest.mark.parametrize("path", ["exact", "index"])
def test_searches_are_exact_or_match_the_engine_through_upserts_deletes_and_flushes(
    store: MilvusVectorStore, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small corpora are searched exactly; above EXACT_ROWS, the HNSW indexes answer as the engine's own."""
    assert lite_search.install(), "the installed milvus_lite is not a checked version"
    if path == "index":
        monkeypatch.setattr(lite_search, "EXACT_ROWS", 0)
    mirror = Mirror(store)
    rng = np.random.default_rng(7)
    queries = [rng.standard_normal(DIM).astype(np.float32) for _ in range(6)]

    def check() -> list[Any]:
        return assert_exact(mirror, queries) if path == "exact" else assert_same_as_engine(store, queries)

    mirror.upsert(rows(rng, range(0, 60), version=1))
    store.flush_and_load()
    check()

    # New versions of some keys in a second segment: the old ones must stay hidden.
    mirror.upsert(rows(rng, range(20, 40), version=2))
    store.flush_and_load()
    check()

    # Deletes, flushed into tombstones over both segments.
    mirror.delete([f"c{i}" for i in range(0, 60, 4)])
    store.flush_and_load()
    after_delete = check()
    deleted = {f"c{i}" for i in range(0, 60, 4)}
    assert not any(cid in deleted for hits in after_delete for cid, _, _ in hits)

    # Written but not flushed: the engine's own search answers (the memtable is not empty).
    mirror.upsert(rows(rng, range(50, 70), version=3))
    mirror.delete(["c1", "c2"])
    assert_same_as_engine(store, queries)
    store.flush_and_load()
    check()


def test_the_visible_rows_are_walked_once_per_state_of_the_data(store: MilvusVectorStore) -> None:
    rng = np.random.default_rng(11)
    query = rng.standard_normal(DIM).astype(np.float32)
    store.upsert(rows(rng, range(0, 30), version=1))
    store.flush_and_load()
    visible = installed().visible

    before = visible.computed
    for _ in range(5):
        store.search(query, limit=5, domain=None)
    assert visible.computed == before + 1

    store.delete_chunks(["c3"])
    store.flush_and_load()
    hits = store.search(query, limit=30, domain=None)
    assert visible.computed == before + 2
    assert "c3" not in {h.chunk_id for h in hits}


def test_the_owner_searches_in_process_with_the_hits_the_socket_gives(
    store: MilvusVectorStore, tmp_path: Path
) -> None:
    from pymilvus import MilvusClient

    from storage import lite_share

    rng = np.random.default_rng(5)
    store.upsert(rows(rng, range(0, 40), version=1))
    store.flush_and_load()
    share = lite_share._shares[(tmp_path / "milvus.db").resolve()]
    assert share.owned
    over_socket = MilvusClient(uri=share.uri, timeout=30.0, dedicated=True)
    try:
        for query in [rng.standard_normal(DIM).astype(np.float32) for _ in range(4)]:
            for expr in ("", 'domain == "billing"'):
                kwargs: dict[str, Any] = {
                    "data": [(query / np.linalg.norm(query)).tolist()],
                    "limit": 10,
                    "filter": expr,
                    "output_fields": ["doc_key"],
                    "search_params": {"metric_type": "COSINE", "params": {"ef": 64}},
                }
                local = share.local_search("chunks", **kwargs)
                assert local is not None and len(local[0]) == 10
                remote = over_socket.search("chunks", **kwargs)
                assert [(h["id"], h["entity"]["doc_key"], h["distance"]) for h in local[0]] == [
                    (h["id"], h["entity"]["doc_key"], h["distance"]) for h in remote[0]
                ]
        # An option only the socket's servicer translates: left to the socket.
        assert share.local_search("chunks", **kwargs, consistency_level="Strong") is None
        assert store._client.search("chunks", **kwargs, consistency_level="Strong")[0]
    finally:
        over_socket.close()


def test_hits_carry_the_fields_asked_for_as_the_engine_builds_them(
    store: MilvusVectorStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the asked-for columns are read: vectors, dynamic fields, $meta, '*' and no list alike."""
    # The index path, so the engine's own search finds the same hits with the same distances.
    monkeypatch.setattr(lite_search, "EXACT_ROWS", 0)
    from pymilvus import DataType, MilvusClient

    client = store._client
    schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=True)
    schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=40)
    schema.add_field("doc_key", DataType.VARCHAR, max_length=64)
    schema.add_field("vector", DataType.FLOAT_VECTOR, dim=DIM)
    index = client.prepare_index_params()
    index.add_index(field_name="vector", index_type="HNSW", metric_type="COSINE", params={"M": 8})
    client.create_collection("dynamic", schema=schema, index_params=index)
    rng = np.random.default_rng(3)
    vectors = rng.standard_normal((30, DIM)).astype(np.float32)
    client.upsert(
        "dynamic",
        [
            {"id": f"r{i}", "doc_key": f"d{i}", "vector": v.tolist(), **({"note": f"n{i}"} if i % 2 else {})}
            for i, v in enumerate(vectors)
        ],
    )
    client.flush("dynamic")
    client.load_collection("dynamic")

    def hits(output_fields: list[str] | None) -> list[Any]:
        found = client.search(
            "dynamic",
            data=[vectors[4].tolist(), vectors[7].tolist()],
            limit=6,
            output_fields=output_fields,
            search_params={"metric_type": "COSINE", "params": {"ef": 64}},
        )
        return [[(h["id"], h["distance"], dict(h["entity"])) for h in per_query] for per_query in found]

    asked = (["doc_key"], ["id", "doc_key"], ["note"], ["doc_key", "$meta"], ["doc_key", "note", "vector"])
    for output_fields in (*asked, ["id"], ["*"], [], None):
        cached = hits(output_fields)
        with engine_search():
            own = hits(output_fields)
        assert cached == own, output_fields
        assert all(len(per_query) == 6 for per_query in cached)
    # The dynamic field and the vector came back where asked for: the comparison saw them.
    both = hits(["note", "vector"])[0]
    assert any("note" in entity for _, _, entity in both) and all("vector" in entity for _, _, entity in both)
