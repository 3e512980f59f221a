"""The BGE-M3 path (FlagEmbedding) against a tiny random XLM-RoBERTa built by the test itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mcp import Client

from retrieval.embedders import BgeM3Embedder, EmbedderError, create_embedder
from server.app import create_server
from server.runtime import open_runtime
from server.settings import load_settings
from storage.vector_store import LAYOUT
from tests.bge_tiny import HIDDEN, build_tiny_bge_m3

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
    with pytest.raises(EmbedderError, match="cannot load BGE-M3 model from"):
        create_embedder("bge-m3", model_path=str(empty))


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
    async with Client(create_server(settings), mode="legacy") as client:
        result = await client.call_tool("lookup_knowledge", {"query": "ERR_TIMEOUT 是什么"})
    assert not result.is_error, result.content
    assert result.structured_content["relevance_level"] == "PRECISE"
    assert result.structured_content["primary"]["doc_key"] == "error-codes/timeout.md"
