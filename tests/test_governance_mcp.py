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

import numpy as np
import pytest
from mcp import Client

from server.config.settings import Settings
from storage.vector_store import ChunkHit, MilvusVectorStore, collection_name
from tests.helpers import WrappedEmbedder, lookup

# Queries over the sample knowledge base.
POOL = "数据库连接池怎么配置"  # hikaricp-pool-config first, infrastructure
POOL_AGAIN = "数据库连接池怎么配置"  # the same question again: a repeat
QUEUE = "Kafka 消息堆积怎么处理"  # message-queue-basics, also infrastructure
GATEWAY = "API 网关超时怎么设置"  # PRECISE: api/gateway-timeouts
OFF_TOPIC_EN = "how to bake sourdough bread at home"  # NO_MATCH
POOL_DOC = "infrastructure/hikaricp-pool-config.md"
# Close the session at HIGH water after two lookups: the calls metric with tight bounds.
TIGHT = {"governance": {"water_metric": "calls", "levels": {"calls": {"low_max": 0, "medium_max": 1}}}}


class CountingStore(MilvusVectorStore):
    """The real Milvus Lite store, counting searches."""

    searches = 0

    def search(self, vector: np.ndarray, **kwargs: Any) -> list[ChunkHit]:
        self.searches += 1
        return super().search(vector, **kwargs)


class CountingEmbedder(WrappedEmbedder):
    """Counts query embeddings on the way to the shared real model."""

    queries = 0

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        self.queries += len(texts)
        return super().embed_queries(texts)


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


def doc_keys(result: dict[str, Any]) -> list[str]:
    return [d["doc_key"] for d in [result["primary"], *result["supplement"]] if d]


async def test_after_high_water_the_next_lookup_runs_no_retrieval(counted: Any) -> None:
    server, store, embedder = counted(overrides=TIGHT)
    async with Client(server) as client:
        await lookup(client, POOL)
        closing = await lookup(client, GATEWAY)
        searches, embeddings = store.searches, embedder.queries
        refused = await lookup(client, QUEUE)
        assert (store.searches, embedder.queries) == (searches, embeddings)
    assert closing["found"] and closing["budget"]["water_level"] == "HIGH"
    assert closing["budget"]["next_call"] == "STOP"
    assert refused["relevance_level"] == "DEDUPED" and refused["dedup_reason"] == "circuit_open"
    assert refused["found"] is False and refused["primary"] is None


async def test_a_repeat_runs_retrieval_to_name_what_the_session_holds(counted: Any) -> None:
    server, store, _ = counted()
    async with Client(server) as client:
        await lookup(client, POOL)
        before = store.searches
        repeat = await lookup(client, "HikariCP 连接池参数")
    assert store.searches == before + 1
    assert repeat["relevance_level"] == "DEDUPED" and POOL_DOC in doc_keys_held(repeat)


def doc_keys_held(result: dict[str, Any]) -> list[str]:
    return [d["doc_key"] for d in result["already_in_context"]]


async def test_a_closed_session_is_a_normal_result_not_a_tool_error(counted: Any) -> None:
    server, _, _ = counted(overrides=TIGHT)
    async with Client(server) as client:
        await lookup(client, POOL)
        await lookup(client, GATEWAY)
        result = await client.call_tool("lookup_knowledge", {"query": QUEUE}, meta={"session_id": "s1"})
    assert not result.is_error
    assert result.structured_content["dedup_reason"] == "circuit_open"  # type: ignore[index]


async def test_the_closed_session_of_one_client_leaves_other_sessions_open(counted: Any) -> None:
    server, _, _ = counted(overrides=TIGHT)
    async with Client(server) as client:
        await lookup(client, POOL)
        await lookup(client, GATEWAY)
        assert (await lookup(client, QUEUE))["dedup_reason"] == "circuit_open"
        other = await lookup(client, QUEUE, session="s2")
    assert other["found"] and other["dedup_reason"] is None


async def test_a_targeted_lookup_on_a_held_topic_gets_a_passage_it_does_not_hold(counted: Any) -> None:
    # Under the default 4,000 characters the pool page (1,550) would go whole, leaving nothing to target.
    server, _, _ = counted(overrides={"retrieval": {"primary_max_chars": 1000}})
    async with Client(server) as client:
        first = await lookup(client, POOL)
        targeted = await lookup(
            client, POOL_AGAIN, missing_dimension="用 hikaricp_connections_pending 指标判断池是否够用"
        )
    assert first["primary"]["doc_key"] == POOL_DOC
    assert targeted["found"] and targeted["primary"]["doc_key"] == POOL_DOC
    assert targeted["primary"]["sections"] == ["监控与调优"]  # the section the dimension names
    assert not set(targeted["primary"]["sections"]) & set(first["primary"]["sections"])
    assert targeted["supplement"] == []  # one targeted passage, nothing around it


async def test_a_targeted_lookup_is_ranked_by_its_missing_dimension(counted: Any) -> None:
    # The pool page goes whole: ranked by the query alone, the session would hold all of it.
    server, store, _ = counted()
    async with Client(server) as client:
        first = await lookup(client, POOL)
        before = store.searches
        targeted = await lookup(client, POOL_AGAIN, missing_dimension="连接泄漏怎么检测")
        assert store.searches == before + 2  # the dimension, and the query with it (the topic)
    assert first["primary"]["doc_key"] == POOL_DOC and not first["primary"]["partial"]
    assert (
        targeted["found"] and targeted["primary"]["doc_key"] == "infrastructure/connection-leak-detection.md"
    )
    assert POOL_DOC in doc_keys_held(targeted)


async def test_a_targeted_lookup_whose_best_document_is_held_gets_the_next_one_as_reference(
    counted: Any,
) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        await lookup(client, "MySQL 服务端参数怎么配置")
        targeted = await lookup(
            client, "MySQL 服务端参数怎么配置", missing_dimension="wait_timeout 和连接池的关系"
        )
    assert "infrastructure/mysql-server-config.md" in doc_keys_held(targeted)
    assert targeted["found"] and targeted["primary"]["doc_key"] == POOL_DOC
    assert targeted["relevance_level"] == "REFERENCE"  # the tier graded the held document


# Alone, "more details" ranks the operations handbook (onboarding) first; "其他" matches nothing.
@pytest.mark.parametrize("dimension", ["more details", "其他"])
async def test_a_dimension_that_names_no_topic_stays_in_the_query_topic(counted: Any, dimension: str) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        await lookup(client, POOL)
        targeted = await lookup(client, POOL_AGAIN, missing_dimension=dimension)
    assert targeted["found"] and targeted["primary"]["domain"] == "infrastructure"
    assert targeted["primary"]["doc_key"] != POOL_DOC  # the session holds all of the pool page


async def test_no_match_is_decided_like_reference(counted: Any) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        result = await lookup(client, OFF_TOPIC_EN)
    assert result["relevance_level"] == "NO_MATCH"
    assert result["budget"]["next_call"] == "TARGETED_ONLY"


async def test_reset_session_reopens_a_closed_session(counted: Any) -> None:
    server, _, _ = counted(overrides=TIGHT)
    async with Client(server) as client:
        await lookup(client, POOL)
        await lookup(client, GATEWAY)
        assert (await lookup(client, QUEUE))["dedup_reason"] == "circuit_open"
        await client.call_tool("reset_session", {}, meta={"session_id": "s1"})
        again = await lookup(client, POOL)
    assert again["found"] and again["budget"]["calls_used"] == 1


async def test_the_ttl_reopens_a_closed_session(counted: Any) -> None:
    clock = FakeClock()
    overrides = {**TIGHT, "memory": {"ttl_seconds": 60, "persist": False}}
    server, _, _ = counted(overrides=overrides, clock=clock)
    async with Client(server) as client:
        await lookup(client, POOL)
        await lookup(client, GATEWAY)
        assert (await lookup(client, QUEUE))["dedup_reason"] == "circuit_open"
        clock.now += 61
        again = await lookup(client, QUEUE)
    assert again["found"] and again["budget"]["calls_used"] == 1


async def test_budget_reports_calls_water_level_and_guidance_in_the_query_language(counted: Any) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        chinese = await lookup(client, GATEWAY)
        english = await lookup(client, "how do partners rotate their API keys")
    assert chinese["budget"]["calls_used"] == 1 and chinese["budget"]["water_level"] == "LOW"
    assert chinese["budget"]["guidance"].startswith("已调用 1 次，水位 LOW")
    assert english["budget"]["calls_used"] == 2
    assert english["budget"]["guidance"].startswith("2 lookups, water LOW")


async def test_hard_domain_policy_refuses_a_lookup_landing_in_a_retrieved_domain(counted: Any) -> None:
    server, _, _ = counted(overrides={"governance": {"domain_policy": "hard"}})
    async with Client(server) as client:
        await lookup(client, POOL)
        refused = await lookup(client, QUEUE)
        targeted = await lookup(client, QUEUE, missing_dimension="how to handle a poison message")
    assert refused["relevance_level"] == "DEDUPED" and refused["dedup_reason"] == "domain_retrieved"
    assert refused["budget"]["next_call"] == "TARGETED_ONLY"
    assert refused["budget"]["guidance"].startswith("该域已检索过")
    assert targeted["found"] and targeted["primary"]["domain"] == "infrastructure"


async def test_soft_domain_policy_answers_a_new_topic_in_a_retrieved_domain(counted: Any) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        await lookup(client, POOL)
        same_domain = await lookup(client, QUEUE)
    assert same_domain["found"] and same_domain["dedup_reason"] is None
    assert doc_keys(same_domain)[0] == "infrastructure/message-queue-basics.md"


async def test_disabled_governance_never_refuses_but_still_dedups(counted: Any) -> None:
    server, _, _ = counted(overrides={"governance": {"enabled": False, **TIGHT["governance"]}})
    async with Client(server) as client:
        await lookup(client, POOL)
        second = await lookup(client, POOL_AGAIN)
        third = await lookup(client, GATEWAY)
        fourth = await lookup(client, QUEUE)
    assert second["dedup_reason"] == "doc_retrieved"
    assert second["budget"]["next_call"] is None
    assert second["budget"]["guidance"] == "governance is off: lookups are not limited"
    assert third["relevance_level"] == "PRECISE" and fourth["found"]


async def test_every_decision_is_written_to_the_invocation_log(make_server: Any, data_dir: Path) -> None:
    server = make_server()
    async with Client(server) as client:
        await lookup(client, GATEWAY)
        await lookup(client, GATEWAY)
        await lookup(client, POOL)
    with contextlib.closing(sqlite3.connect(data_dir / "log.sqlite")) as db:
        rows = db.execute(
            "SELECT query, relevance_level, water_level, next_call, dedup_reason, call_index "
            "FROM tool_invocation WHERE tool_name = 'lookup_knowledge' ORDER BY id"
        ).fetchall()
    assert rows[0] == (GATEWAY, "PRECISE", "LOW", "ALLOW", None, 1)
    assert rows[1] == (GATEWAY, "DEDUPED", "LOW", "STOP", "doc_retrieved", 2)
    # A new topic after a STOP caused by a repeat is answered.
    assert rows[2][0] == POOL and rows[2][1] in ("PRECISE", "HIGHLY_RELEVANT", "REFERENCE")
    assert rows[2][2:] == ("LOW", rows[2][3], None, 3) and rows[2][3] in ("ALLOW", "TARGETED_ONLY")


HANDBOOK = "onboarding/operations-handbook.md"  # 12k characters: a lookup gets one part of it


async def test_a_targeted_lookup_whose_dimension_the_session_holds_is_deduped_naming_the_held_section(
    counted: Any,
) -> None:
    server, _, _ = counted()
    async with Client(server) as client:
        first = await lookup(client, "How many days do I have to file an expense claim?")
        targeted = await lookup(
            client,
            "How many days do I have to file an expense claim?",
            missing_dimension="the deadline for filing an expense claim after the purchase",
        )
    assert first["primary"]["doc_key"] == HANDBOOK and first["primary"]["partial"]
    held = next(s for s in first["primary"]["sections"] if "Expense claims" in s)
    assert targeted["relevance_level"] == "DEDUPED" and not targeted["found"]
    assert targeted["dedup_reason"] == "doc_retrieved"
    assert HANDBOOK in doc_keys_held(targeted)
    assert f"section '{held}'" in targeted["message"] and HANDBOOK in targeted["message"]
