"""The BGE-M3 path (FlagEmbedding) and the reranker, against tiny random checkpoints the tests build."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import numpy as np
import pytest
from mcp import Client

from retrieval.embedders import BgeM3Embedder, CachedEmbedder, EmbedderError, create_embedder
from retrieval.engine import Evidence, interleave
from retrieval.ranking import rank
from retrieval.reranker import RerankerError, create_reranker
from retrieval.sparse import lexical_match
from server.config.loading import load_settings
from server.config.settings import Settings
from server.container import chunking_rule, open_runtime
from server.protocol.app import app_resources, create_server
from storage.chunking import chunk_context
from storage.discovery import discover
from storage.documents import load_document
from storage.vector_store import LAYOUT
from tests.bge_tiny import HIDDEN, build_tiny_bge_m3, build_tiny_reranker
from tests.helpers import ROOT

pytestmark = pytest.mark.bge


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_bge_m3(tmp_path_factory.mktemp("bge-m3-tiny"))


def test_tiny_checkpoint_is_small(tiny_model: Path) -> None:
    size = sum(p.stat().st_size for p in tiny_model.rglob("*") if p.is_file())
    assert size < 400_000
    assert (tiny_model / "colbert_linear.pt").exists() and (tiny_model / "sparse_linear.pt").exists()


def test_bge_m3_embedder_loads_and_encodes_unit_vectors(tiny_model: Path) -> None:
    embedder = create_embedder("bge-m3", model_path=str(tiny_model), device="cpu")
    assert isinstance(embedder, BgeM3Embedder) and embedder.dim == HIDDEN
    queries = embedder.embed_queries(["ERR_TIMEOUT 是什么", "how to configure the pool"])
    passages = embedder.embed_passages(["ERR_TIMEOUT 超时错误"])
    assert queries.shape == (2, HIDDEN) and passages.shape == (1, HIDDEN)
    assert np.allclose(np.linalg.norm(queries, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(queries[0], queries[1])


def test_bad_model_path_is_a_clear_error(tmp_path: Path) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    with pytest.raises(EmbedderError, match="cannot load BGE-M3 model from") as raised:
        create_embedder("bge-m3", model_path=str(empty))
    # A local directory that fails to load is not told to download itself from the hub.
    assert "Hugging Face cache" not in str(raised.value)


@pytest.mark.slow
async def test_ingest_and_lookup_through_the_server_with_bge_m3(tiny_model: Path, tmp_path: Path) -> None:
    kb = tmp_path / "kb" / "error-codes"
    kb.mkdir(parents=True)
    (kb / "timeout.md").write_text(
        "---\ntitle: ERR_TIMEOUT\nkeywords: [ERR_TIMEOUT]\n---\n# ERR_TIMEOUT\n\n请求超时。\n"
    )
    (kb / "pool.md").write_text("---\ntitle: Pool\nkeywords: [HikariCP]\n---\n# Pool\n\nconnection pool.\n")
    settings = load_settings(
        None, data_dir=tmp_path / "data", embedder={"name": "bge-m3", "model_path": str(tiny_model)}
    )
    runtime = open_runtime(settings)
    try:
        report = runtime.ingestor().run(tmp_path / "kb")
        assert sorted(report.added) == ["error-codes/pool.md", "error-codes/timeout.md"]
        assert runtime.store.collection == f"lookup_knowledge_bge_m3_{HIDDEN}_{LAYOUT}"
    finally:
        runtime.close()
    assert settings.tier_model == settings.relevance.models["bge-m3"]
    async with Client(create_server(app_resources(settings)), mode="legacy") as client:
        result = await client.call_tool("lookup_knowledge", {"query": "ERR_TIMEOUT 是什么"})
    assert not result.is_error, result.content
    assert result.structured_content["relevance_level"] == "PRECISE"
    assert result.structured_content["primary"]["doc_key"] == "error-codes/timeout.md"


# -- lexical weights (BGE-M3 sparse) and the reranker ---------------------------------------

# Four one-section documents in the tiny vocabulary (its Chinese characters are real tokens).
_DOCS = {"pool": "连接池超时", "cache": "缓存配置", "db": "数据库错误", "what": "是什么配置"}
# Dense vectors of the random model all but tie here; the document sharing the query's
# weighted tokens is another than the dense channel's first.
_QUERY = "连接池是什么"


@pytest.fixture(scope="module")
def tiny_reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_reranker(tmp_path_factory.mktemp("reranker-tiny"))


def _kb(root: Path) -> Path:
    folder = root / "kb" / "d"
    folder.mkdir(parents=True)
    for name, text in _DOCS.items():
        (folder / f"{name}.md").write_text(f"---\ntitle: {name}\n---\n# {name}\n\n{text}\n", encoding="utf-8")
    return root / "kb"


def _settings(tmp_path: Path, model: Path, **extra: Any) -> Settings:
    return load_settings(
        None, data_dir=tmp_path / "data", embedder={"name": "bge-m3", "model_path": str(model)}, **extra
    )


def _top(evidence: Evidence, **weights: float) -> str:
    ranked = rank(
        evidence,
        0.0,
        0.0,
        sparse_weight=weights.get("sparse", 0.0),
        rerank_weight=weights.get("rerank", 0.0),
    )
    return ranked[0].doc_key


def test_lexical_weights_are_stored_with_each_chunk_and_kept_across_edits(
    tiny_model: Path, tmp_path: Path
) -> None:
    kb = _kb(tmp_path)
    # Sections too long to merge into one chunk of at most 100 characters.
    first, second = "数据库" * 25, "连接池" * 25
    (kb / "d" / "two.md").write_text(f"# two\n\n## 一\n\n{first}\n\n## 二\n\n{second}\n", encoding="utf-8")
    runtime = open_runtime(_settings(tmp_path, tiny_model, chunking={"max_chars": 100}))
    try:
        runtime.ingestor().run(kb)
        chunks = runtime.catalog.chunks_of("d/two.md")
        stored = runtime.catalog.lexical_weights([c.chunk_id for c in chunks])
        doc = load_document(
            next(c for c in discover(kb) if c.doc_key == "d/two.md"),
            rule=chunking_rule(runtime.settings, runtime.embedder),
        )
        _, expected = runtime.embedder.embed_passages_with_lexical(doc.embedding_texts())
        assert len(chunks) == 2 and expected is not None and all(expected)
        for chunk, weights in zip(chunks, expected, strict=True):
            assert stored[chunk.chunk_id] == pytest.approx(weights)

        # Editing the second section re-embeds only it; the first keeps its stored weights.
        (kb / "d" / "two.md").write_text(
            f"# two\n\n## 一\n\n{first}\n\n## 二\n\n{'缓存' * 30}\n", encoding="utf-8"
        )
        report = runtime.ingestor().run(kb)
        assert report.embedded == 1
        kept = chunks[0].chunk_id
        ids = [c.chunk_id for c in runtime.catalog.chunks_of("d/two.md")]
        assert ids[0] == kept and ids[1] != chunks[1].chunk_id
        assert runtime.catalog.lexical_weights([kept]) == {kept: stored[kept]}
    finally:
        runtime.close()


def test_lexical_weights_decide_the_ranking_where_the_dense_vectors_tie(
    tiny_model: Path, tmp_path: Path
) -> None:
    runtime = open_runtime(_settings(tmp_path, tiny_model))
    try:
        runtime.ingestor().run(_kb(tmp_path))
        evidence = runtime.engine.retrieve(_QUERY, None)
        query_weights = runtime.embedder.encode_query(_QUERY).lexical
        stored = runtime.catalog.lexical_weights([cid for cid, _ in evidence.sparse])
    finally:
        runtime.close()
    assert query_weights
    # Every candidate is scored, with BGE-M3's normalised dot product over shared tokens.
    candidates = {h.chunk_id for h in evidence.dense} | {h.chunk_id for h in evidence.lexical}
    assert {cid for cid, _ in evidence.sparse} == candidates
    for cid, score in evidence.sparse:
        assert score == pytest.approx(lexical_match(query_weights, stored.get(cid, {})))
    best_sparse = max(evidence.sparse, key=lambda item: item[1])[0]
    doc_of = {h.chunk_id: h.doc_key for h in evidence.dense}
    dense_only = _top(evidence)
    assert doc_of[best_sparse] != dense_only  # the constructed case: the channels disagree
    assert _top(evidence, sparse=0.3) == doc_of[best_sparse]
    # The shipped bge-m3 model carries that weight; e5-small leaves it at 0.
    settings = Settings()
    assert settings.relevance.models["bge-m3"].sparse_weight == 0.3
    assert settings.relevance.models["e5-small"].sparse_weight == 0.0


class _DenseOnly:
    name = "dense-only"
    dim = 4

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.ones((len(texts), 4), dtype=np.float32) / 2

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_queries(texts)

    def count_tokens(self, text: str) -> int:
        return len(text)


def test_an_embedder_without_lexical_weights_adds_no_sparse_step() -> None:
    cached = CachedEmbedder(_DenseOnly(), size=4)
    assert cached.encode_query("q").lexical is None
    vectors, lexical = cached.embed_passages_with_lexical(["a", "b"])
    assert vectors.shape == (2, 4) and lexical is None


def test_reranker_scores_the_best_candidates_and_reorders_them(
    tiny_model: Path, tiny_reranker: Path, tmp_path: Path
) -> None:
    settings = _settings(
        tmp_path, tiny_model, reranker={"enabled": True, "model_path": str(tiny_reranker), "top_n": 3}
    )
    runtime = open_runtime(settings)
    try:
        runtime.ingestor().run(_kb(tmp_path))
        evidence = runtime.engine.retrieve(_QUERY, None)
        assert runtime.engine.reranker is not None
        chunks = runtime.catalog.chunks_by_id([cid for cid, _ in evidence.rerank])
        entries = runtime.engine.view().entries
        # What the reranker reads: the chunk as it was embedded, title and heading first.
        texts = [
            f"{chunk_context(entries[chunks[cid].doc_key].title, chunks[cid].heading)}\n{chunks[cid].text}"
            for cid, _ in evidence.rerank
        ]
        direct = create_reranker(str(tiny_reranker)).score(_QUERY, texts)
    finally:
        runtime.close()
    assert len(evidence.rerank) == 3  # top_n of the four candidates
    assert [s for _, s in evidence.rerank] == pytest.approx(direct)
    doc_of = {h.chunk_id: h.doc_key for h in evidence.dense}
    best = doc_of[max(evidence.rerank, key=lambda item: item[1])[0]]
    assert best != _top(evidence)  # without the reranker another document leads
    assert _top(evidence, rerank=2.0) == best


def test_interleave_takes_each_ranking_in_turn() -> None:
    assert interleave(["a", "b", "c"], ["b", "d"], [], limit=3) == ["a", "b", "d"]
    assert interleave(["a"], ["a"], limit=5) == ["a"]


def test_reranker_is_never_loaded_when_disabled(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import FlagEmbedding

    loaded: list[str] = []

    def record(path: str, **_: Any) -> None:
        loaded.append(path)
        raise RuntimeError("the reranker was loaded")

    monkeypatch.setattr(FlagEmbedding, "FlagReranker", record)
    runtime = open_runtime(_settings(tmp_path, tiny_model))
    try:
        runtime.ingestor().run(_kb(tmp_path))
        assert runtime.engine.reranker is None
        assert runtime.engine.retrieve(_QUERY, None).rerank == ()
    finally:
        runtime.close()
    assert loaded == []
    # The same hook does see a load when the reranker is enabled.
    with pytest.raises(RerankerError, match="cannot load reranker model from 'x'"):
        open_runtime(_settings(tmp_path, tiny_model, reranker={"enabled": True, "model_path": "x"}))
    assert loaded == ["x"]


async def test_bad_reranker_path_is_a_clear_error(tiny_model: Path, tmp_path: Path) -> None:
    empty = tmp_path / "not-a-reranker"
    empty.mkdir()
    with pytest.raises(RerankerError, match=f"cannot load reranker model from {str(empty)!r}"):
        create_reranker(str(empty))
    settings = _settings(tmp_path, tiny_model, reranker={"enabled": True, "model_path": str(empty)})
    with pytest.raises(EmbedderError, match="cannot load reranker model from"):
        open_runtime(settings)
    with anyio.fail_after(120):
        async with Client(create_server(app_resources(settings)), mode="legacy") as client:
            result = await client.call_tool("lookup_knowledge", {"query": _QUERY})
    assert result.is_error
    assert "cannot load reranker model from" in result.content[0].text


@pytest.mark.slow
async def test_lookup_through_the_server_with_bge_m3_and_the_reranker(
    tiny_model: Path, tiny_reranker: Path, tmp_path: Path
) -> None:
    settings = _settings(tmp_path, tiny_model, reranker={"enabled": True, "model_path": str(tiny_reranker)})
    runtime = open_runtime(settings)
    try:
        runtime.ingestor().run(_kb(tmp_path))
    finally:
        runtime.close()
    resources = app_resources(settings)
    server = create_server(resources)
    with anyio.fail_after(120):
        async with Client(server, mode="legacy") as client:
            result = await client.call_tool("lookup_knowledge", {"query": _QUERY, "top_k": 4})
            engine = (await resources.lookup_service()).engine
            evidence = engine.cached_evidence(_QUERY, None)
    assert not result.is_error, result.content
    assert evidence is not None and evidence.sparse and evidence.rerank
    model = settings.tier_model
    expected = rank(
        evidence, model.cross_language_offset, model.lexical_weight, model.sparse_weight, model.rerank_weight
    )
    content = result.structured_content
    delivered = [content["primary"]["doc_key"], *(s["doc_key"] for s in content["supplement"])]
    assert delivered == [d.doc_key for d in expected]
    # The reranker's score is part of that order: without it the documents come otherwise.
    unreranked = rank(evidence, model.cross_language_offset, model.lexical_weight, model.sparse_weight)
    assert delivered != [d.doc_key for d in unreranked]


# -- hub ids: cached files load without the network ------------------------------------------
def _cache_as_hub_id(cache: Path, model: Path, hub_id: str) -> None:
    """The layout huggingface_hub keeps a downloaded repository in: refs/main names a snapshot."""
    repo = cache / f"models--{hub_id.replace('/', '--')}"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit, encoding="utf-8")
    shutil.copytree(model, repo / "snapshots" / commit)


class _Hub(http.server.BaseHTTPRequestHandler):
    """A hub that knows no repository, and notes every request it gets."""

    seen: ClassVar[list[str]] = []

    def _not_found(self) -> None:
        self.seen.append(f"{self.command} {self.path}")
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = _not_found

    def log_message(self, *args: Any) -> None:  # keep the test's output clean
        pass


_LOAD_BY_HUB_ID = """
from retrieval.embedders import create_embedder
from retrieval.reranker import create_reranker
embedder = create_embedder("bge-m3", model_path="tiny-org/bge-m3-tiny")
reranker = create_reranker("tiny-org/reranker-tiny")
print(embedder.dim, len(reranker.score("pool timeout", ["connection pool", "rate limit"])))
"""


@pytest.mark.slow
def test_a_cached_hub_id_loads_from_the_cache_without_asking_the_hub(
    tiny_model: Path, tiny_reranker: Path, tmp_path: Path
) -> None:
    # FlagEmbedding and transformers asked the hub about a hub id on every load, cached or not:
    # offline, five retries per file before they fell back to the cache, on every start.
    cache = tmp_path / "hf-cache"
    _cache_as_hub_id(cache, tiny_model, "tiny-org/bge-m3-tiny")
    _cache_as_hub_id(cache, tiny_reranker, "tiny-org/reranker-tiny")
    _Hub.seen.clear()
    hub = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=hub.serve_forever, daemon=True).start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(HF_HUB_CACHE=str(cache), HF_ENDPOINT=f"http://127.0.0.1:{hub.server_port}")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LOAD_BY_HUB_ID], env=env, cwd=ROOT, capture_output=True, timeout=300
        )
    finally:
        hub.shutdown()
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().split() == [str(HIDDEN), "2"]
    assert _Hub.seen == []


@pytest.mark.parametrize(
    ("model_path", "why"),
    [
        ("/no/such/model", "no such directory"),
        ("./models/missing", "no such directory"),
        ("", "empty model_path"),
    ],
)
def test_a_model_path_written_as_a_path_that_is_not_there_is_named_as_such(model_path: str, why: str) -> None:
    # An absolute path used to reach the hub as a repository id ("Repo id must use alphanumeric chars").
    shown = re.escape(repr(model_path))
    with pytest.raises(EmbedderError, match=rf"^cannot load BGE-M3 model from {shown}: {why}$"):
        create_embedder("bge-m3", model_path=model_path)
    with pytest.raises(RerankerError, match=rf"^cannot load reranker model from {shown}: {why}$"):
        create_reranker(model_path)


def test_a_file_is_not_a_model_directory(tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(
        EmbedderError, match=rf"^cannot load BGE-M3 model from '{re.escape(str(weights))}': not a directory$"
    ):
        create_embedder("bge-m3", model_path=str(weights))
