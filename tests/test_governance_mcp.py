"""Governance enforced in the tool layer, through the real in-process MCP client.

"No retrieval" is proven by counting calls into the vector store and the query embedder,
never by timing.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from mcp import Client

from server.settings import Settings
from storage.vector_store import ChunkHit, MilvusVectorStore, collection_name

# Queries over the sample knowledge base and what they grade on their own (e5-small defaults).
POOL = "数据库连接池怎么配置"  # PRECISE: hikaricp-pool-config (+ mysql-server-config), infrastructure
POOL_AGAIN = "HikariCP 连接池参数"  # every candidate is among POOL's documents -> DEDUPED
QUEUE = "消息队列基础"  # PRECISE: message-queue-basics, also infrastructure
GATEWAY = "API 网关超时怎么设置"  # PRECISE: api/gateway-timeouts
LOGS = "日志分析步骤"  # PRECISE: troubleshooting/log-analysis-steps
OFF_TOPIC_EN = "how to bake sourdough bread"  # NO_MATCH


class CountingStore(MilvusVectorStore):
    """The real Milvus Lite store, counting searches."""

    searches = 0

    def search(self, vector: np.ndarray, **kwargs: Any) -> list[ChunkHit]:
        self.searches += 1
        return super().search(vector, **kwargs)


class CountingEmbedder:
    """Counts query embeddings on the way to the shared real model."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self.queries = 0

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.queries += len(texts)
        return self.inner.embed_queries(texts)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_passages(texts)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def counted(make_settings: Any, make_server: Any, e5_embedder: Any) -> Any:
    """make_server(...) returning (server, store, embedder) with counting store and embedder."""

    def make(**kwargs: Any) -> tuple[Any, CountingStore, CountingEmbedder]:
        settings: Settings = make_settings(**kwargs.get("overrides", {}))
        store = CountingStore(
            uri=settings.milvus_uri,
            token=None,
            collection=collection_name(settings.milvus.collection_prefix, e5_embedder.name, e5_embedder.dim),
            dim=e5_embedder.dim,
            timeout_s=settings.milvus.timeout_s,
        )
        embedder = CountingEmbedder(e5_embedder.inner)
        return make_server(store=store, embedder=embedder, **kwargs), store, embedder

    return make


async def lookup(client: Client, query: str, *, session: str = "s1", **args: Any) -> dict[str, Any]:
    with anyio.fail_after(60):
        result = await client.call_tool(
            "lookup_knowledge", {"query": query, **args}, meta={"session_id": session}
        )
    assert not result.is_error, result.content
    return result.structured_content


def doc_keys(result: dict[str, Any]) -> list[str]:
    return [d["doc_key"] for d in [result["primary"], *result["supplement"]] if d]


async def test_after_stop_the_next_lookup_runs_no_retrieval(counted: Any) -> None:
    server, store, embedder = counted()
    async with Client(server) as client:
        first = await lookup(client, POOL)
        assert first["budget"]["next_call"] == "ALLOW"
        second = await lookup(client, POOL_AGAIN)
        assert (second["relevance_level"], second["dedup_reason"]) == ("DEDUPED", "doc_retrieved")
        assert second["budget"]["next_call"] == "STOP"
        engine = server.resources_state.service.engine
        searches, embeddings, engine_searches = store.searches, embedder.queries, engine.searches

        # A query never seen before would need a search and an embedding; the circuit is open.
        blocked = await lookup(client, GATEWAY)

    assert store.searches == searches
    assert embedder.queries == embeddings
    assert engine.searches == engine_searches
    assert blocked["relevance_level"] == "DEDUPED"
    assert blocked["dedup_reason"] == "circuit_open"
    assert blocked["found"] is False
    assert blocked["primary"] is None and blocked["supplement"] == []
    assert blocked["budget"]["next_call"] == "STOP"
    assert blocked["budget"]["calls_used"] == 3
    assert blocked["budget"]["guidance"].startswith("本会话的 lookup_knowledge 已熔断")


async def test_circuit_open_is_a_normal_result_not_a_tool_error(counted: Any) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        await lookup(client, POOL)
        await lookup(client, POOL_AGAIN)
        result = await client.call_tool(
            "lookup_knowledge", {"query": "what is ERR_TIMEOUT"}, meta={"session_id": "s1"}
        )
    assert result.is_error is False
    assert result.structured_content["dedup_reason"] == "circuit_open"
    assert result.structured_content["budget"]["guidance"].startswith(
        "lookup_knowledge is closed for this session"
    )


async def test_the_circuit_of_one_session_leaves_other_sessions_open(counted: Any) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        await lookup(client, POOL, session="a")
        await lookup(client, POOL_AGAIN, session="a")
        other = await lookup(client, GATEWAY, session="b")
    assert other["relevance_level"] == "PRECISE"
    assert other["dedup_reason"] is None


def targeted_after_a_hit() -> dict[str, Any]:
    """Overrides under which a PRECISE or HIGHLY_RELEVANT result at LOW water allows only targeted lookups.

    The enforcement is then tested without depending on which query grades REFERENCE.
    """
    matrix = {
        tier: {"LOW": "ALLOW", "MEDIUM": "ALLOW", "HIGH": "STOP"} for tier in ("PRECISE", "HIGHLY_RELEVANT")
    }
    matrix["PRECISE"]["LOW"] = matrix["HIGHLY_RELEVANT"]["LOW"] = "TARGETED_ONLY"
    matrix["REFERENCE"] = {"LOW": "TARGETED_ONLY", "MEDIUM": "TARGETED_ONLY", "HIGH": "STOP"}
    matrix["DEDUPED"] = {"LOW": "STOP", "MEDIUM": "STOP", "HIGH": "STOP"}
    return {"governance": {"matrix": matrix}}


async def test_targeted_only_refuses_a_lookup_without_missing_dimension(counted: Any) -> None:
    server, store, embedder = counted(overrides=targeted_after_a_hit())
    async with Client(server) as client:
        first = await lookup(client, POOL)
        assert first["relevance_level"] == "PRECISE"
        assert first["budget"]["next_call"] == "TARGETED_ONLY"
        assert first["budget"]["guidance"].startswith("水位充足：可针对缺少的维度定向补充检索一次")
        searches, embeddings = store.searches, embedder.queries

        untargeted = await lookup(client, LOGS)
        blank = await lookup(client, LOGS, missing_dimension="   ")

    assert (store.searches, embedder.queries) == (searches, embeddings)
    for refused in (untargeted, blank):
        assert refused["relevance_level"] == "DEDUPED"
        assert refused["dedup_reason"] == "missing_dimension_required"
        assert refused["primary"] is None
        assert refused["budget"]["next_call"] == "TARGETED_ONLY"
        assert refused["budget"]["guidance"].startswith("现在只允许定向补充")
    assert blank["budget"]["calls_used"] == 3


async def test_targeted_only_lets_a_lookup_with_missing_dimension_through(counted: Any) -> None:
    server, store, _ = counted(overrides=targeted_after_a_hit())
    async with Client(server) as client:
        await lookup(client, POOL)
        searches = store.searches
        targeted = await lookup(client, LOGS, missing_dimension="日志分析的具体步骤")
    assert store.searches > searches  # a retrieval ran
    assert targeted["relevance_level"] == "PRECISE"
    assert doc_keys(targeted)[0] == "troubleshooting/log-analysis-steps.md"
    assert targeted["dedup_reason"] is None


async def test_no_match_is_decided_like_reference(counted: Any) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        result = await lookup(client, OFF_TOPIC_EN)
        untargeted = await lookup(client, "what is the capital of France")
    assert result["relevance_level"] == "NO_MATCH"
    assert result["primary"] is None
    assert result["budget"]["next_call"] == "TARGETED_ONLY"
    assert result["budget"]["guidance"].startswith("enough budget: one targeted lookup")
    assert untargeted["dedup_reason"] == "missing_dimension_required"


async def test_reset_session_reopens_the_circuit(counted: Any) -> None:
    server, store, _ = counted()
    async with Client(server) as client:
        await lookup(client, POOL)
        await lookup(client, POOL_AGAIN)
        assert (await lookup(client, GATEWAY))["dedup_reason"] == "circuit_open"
        with anyio.fail_after(30):
            reset = await client.call_tool("reset_session", {}, meta={"session_id": "s1"})
        assert reset.structured_content["forgotten"] is True
        searches = store.searches
        reopened = await lookup(client, GATEWAY)
    assert store.searches > searches  # a retrieval ran
    assert reopened["relevance_level"] == "PRECISE"
    assert reopened["budget"]["calls_used"] == 1
    assert reopened["budget"]["next_call"] == "ALLOW"


async def test_the_ttl_reopens_the_circuit(counted: Any) -> None:
    clock = FakeClock()
    server, store, _ = counted(clock=clock, overrides={"memory": {"ttl_seconds": 60, "persist": False}})
    async with Client(server) as client:
        await lookup(client, POOL)
        await lookup(client, POOL_AGAIN)
        clock.now += 59
        assert (await lookup(client, GATEWAY))["dedup_reason"] == "circuit_open"  # also refreshes last_seen
        clock.now += 61
        searches = store.searches
        reopened = await lookup(client, GATEWAY)
    assert store.searches > searches  # a retrieval ran
    assert reopened["relevance_level"] == "PRECISE"
    assert reopened["budget"]["calls_used"] == 1


async def test_a_result_at_high_water_still_returns_content_and_closes_the_circuit(counted: Any) -> None:
    levels = {"calls": {"low_max": 0, "medium_max": 1}}
    server, _, _ = counted(overrides={"governance": {"levels": levels}})
    async with Client(server) as client:
        first = await lookup(client, POOL)
        second = await lookup(client, GATEWAY)
        third = await lookup(client, LOGS)
    assert (first["budget"]["water_level"], first["budget"]["next_call"]) == ("MEDIUM", "ALLOW")
    assert (second["budget"]["water_level"], second["budget"]["next_call"]) == ("HIGH", "STOP")
    assert second["relevance_level"] == "PRECISE" and second["primary"] is not None
    assert second["budget"]["guidance"].startswith("水位已高")
    assert third["dedup_reason"] == "circuit_open"


async def test_budget_reports_calls_water_level_and_guidance_in_the_query_language(counted: Any) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        chinese = await lookup(client, "ERR_TIMEOUT 是什么", session="zh")
        english = await lookup(client, "what is ERR_TIMEOUT", session="en")
        english_again = await lookup(client, GATEWAY, session="en")
    assert chinese["budget"] == {
        "calls_used": 1,
        "water_level": "LOW",
        "next_call": "ALLOW",
        "guidance": chinese["budget"]["guidance"],
    }
    assert chinese["budget"]["guidance"].startswith("检索预算充足（已调用 1 次，水位 LOW）")
    assert english["budget"]["guidance"].startswith("enough budget (1 lookups used, water level LOW)")
    assert english_again["budget"]["calls_used"] == 2


async def test_hard_domain_policy_refuses_a_lookup_landing_in_a_retrieved_domain(counted: Any) -> None:
    server, store, _ = counted(overrides={"governance": {"domain_policy": "hard"}})
    async with Client(server) as client:
        await lookup(client, POOL)
        same_domain = await lookup(client, QUEUE)
        other_domain_refused = await lookup(client, GATEWAY)
        searches = store.searches
        targeted = await lookup(client, QUEUE, missing_dimension="Kafka 消费者组")
    assert same_domain["relevance_level"] == "DEDUPED"
    assert same_domain["dedup_reason"] == "domain_retrieved"
    assert same_domain["primary"] is None
    assert same_domain["retrieved_domains_this_session"] == ["infrastructure"]
    # The refusal leaves only the targeted channel open, as its guidance says.
    assert same_domain["budget"]["next_call"] == "TARGETED_ONLY"
    assert same_domain["budget"]["guidance"].startswith("该域在本会话中已检索过")
    assert other_domain_refused["dedup_reason"] == "missing_dimension_required"
    # missing_dimension lets the same-domain lookup through (the evidence is reused, not searched).
    assert store.searches == searches
    assert targeted["relevance_level"] == "PRECISE"
    assert doc_keys(targeted)[0] == "infrastructure/message-queue-basics.md"


async def test_soft_domain_policy_only_reports_a_retrieved_domain(counted: Any) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        await lookup(client, POOL)
        same_domain = await lookup(client, QUEUE)
    assert same_domain["relevance_level"] == "PRECISE"
    assert same_domain["dedup_reason"] is None
    assert doc_keys(same_domain)[0] == "infrastructure/message-queue-basics.md"
    assert "The best match is in domain 'infrastructure', already retrieved." in same_domain["message"]
    assert same_domain["budget"]["next_call"] == "ALLOW"


async def test_disabled_governance_never_refuses_but_still_dedups(counted: Any) -> None:
    server, _, _ = counted(overrides={"governance": {"enabled": False}})
    async with Client(server) as client:
        await lookup(client, POOL)
        second = await lookup(client, POOL_AGAIN)
        third = await lookup(client, GATEWAY)
    assert second["dedup_reason"] == "doc_retrieved"
    assert second["budget"]["next_call"] is None
    assert second["budget"]["guidance"] == "governance is off: lookups are not limited"
    assert third["relevance_level"] == "PRECISE"


async def test_every_decision_is_written_to_the_invocation_log(make_server: Any, data_dir: Path) -> None:
    server = make_server()
    async with Client(server) as client:
        await lookup(client, POOL)
        await lookup(client, POOL_AGAIN)
        await lookup(client, GATEWAY)
    with contextlib.closing(sqlite3.connect(data_dir / "log.sqlite")) as db:
        rows = db.execute(
            "SELECT query, relevance_level, water_level, next_call, dedup_reason, call_index "
            "FROM tool_invocation WHERE tool_name = 'lookup_knowledge' ORDER BY id"
        ).fetchall()
    assert rows == [
        (POOL, "PRECISE", "LOW", "ALLOW", None, 1),
        (POOL_AGAIN, "DEDUPED", "LOW", "STOP", "doc_retrieved", 2),
        (GATEWAY, "DEDUPED", "LOW", "STOP", "circuit_open", 3),
    ]
