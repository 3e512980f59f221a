"""Topic-aware governance: repeats stay refused, a new topic is always answered, refusals are terse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from server.protocol.app import create_server
from server.rendering import TERSE_LIMIT
from tests.conftest import SAMPLE_KB
from tests.helpers import ingest_into, write_knowledge_base
from tests.test_passages import CLOUD, CLOUD_ANSWER, EXPENSE, EXPENSE_ANSWER, HANDBOOK

TIMEOUT_DOC = "error-codes/err-timeout.md"
POOL_DOC = "infrastructure/hikaricp-pool-config.md"
# A tier model that never grades HIGHLY_RELEVANT, so a paraphrase is REFERENCE deterministically.
NEVER_HIGHLY_RELEVANT = {
    "relevance": {
        "models": {
            "e5-small": {
                "on_topic": {"weights": {}, "bias": 5.0, "threshold": 0.5},
                "top_right": {"weights": {}, "bias": -5.0, "threshold": 0.5},
                "cross_language_offset": 0.05,
            }
        }
    }
}


async def call(client: Client, query: str, session: str = "s1", **args: Any) -> tuple[dict[str, Any], str]:
    result = await client.call_tool(
        "lookup_knowledge", {"query": query, **args}, meta={"session_id": session}
    )
    assert not result.is_error, result.content
    return result.structured_content or {}, result.content[0].text  # type: ignore[union-attr]


def held(result: dict[str, Any]) -> list[str]:
    return [d["doc_key"] for d in result["already_in_context"]]


async def test_a_new_topic_is_answered_after_a_stop_caused_by_a_repeat(make_server: Any) -> None:
    async with Client(make_server()) as client:
        first, _ = await call(client, "ERR_TIMEOUT 是什么")
        repeat, _ = await call(client, "ERR_TIMEOUT 是什么")
        new_topic, _ = await call(client, "HikariCP 连接池参数怎么配置")
        repeat_again, _ = await call(client, "ERR_TIMEOUT 超时错误码")
    assert first["primary"]["doc_key"] == TIMEOUT_DOC
    assert repeat["relevance_level"] == "DEDUPED" and repeat["budget"]["next_call"] == "STOP"
    assert new_topic["found"] and new_topic["primary"]["doc_key"] == POOL_DOC
    assert repeat_again["relevance_level"] == "DEDUPED" and TIMEOUT_DOC in held(repeat_again)


async def test_a_repeat_after_reference_is_deduped_and_names_the_document_held(make_server: Any) -> None:
    async with Client(make_server(overrides=NEVER_HIGHLY_RELEVANT)) as client:
        first, _ = await call(client, "how should our services size the database connection pool")
        second, _ = await call(client, "how should our services size the database connection pool")
    assert first["relevance_level"] == "REFERENCE" and first["budget"]["next_call"] == "TARGETED_ONLY"
    assert second["relevance_level"] == "DEDUPED" and second["dedup_reason"] == "doc_retrieved"
    assert first["primary"]["doc_key"] in held(second)
    assert second["already_in_context"][0]["sections"] == first["primary"]["sections"]


async def test_high_water_closes_the_session_and_skips_retrieval(make_resources: Any) -> None:
    tight = {"governance": {"water_metric": "calls", "levels": {"calls": {"low_max": 1, "medium_max": 2}}}}
    resources = make_resources(overrides=tight)
    server = create_server(resources)
    async with Client(server) as client:
        await call(client, "ERR_TIMEOUT 是什么")
        await call(client, "数据库连接池怎么配置")
        closing, _ = await call(client, "how do partners rotate API keys")
        engine = (await resources.lookup_service()).engine
        searches = engine.searches
        refused, _ = await call(client, "webhook 签名怎么校验")
        assert engine.searches == searches
    assert closing["budget"]["water_level"] == "HIGH" and closing["budget"]["next_call"] == "STOP"
    assert refused["dedup_reason"] == "circuit_open" and not refused["found"]
    assert "retrieval skipped" in refused["message"].lower() or "未执行检索" in refused["message"]


async def test_a_closed_session_names_what_it_holds_when_the_query_is_known(make_server: Any) -> None:
    tight = {"governance": {"water_metric": "calls", "levels": {"calls": {"low_max": 0, "medium_max": 1}}}}
    async with Client(make_server(overrides=tight)) as client:
        await call(client, "ERR_TIMEOUT 是什么")
        await call(client, "数据库连接池怎么配置")
        refused, _ = await call(client, "ERR_TIMEOUT 是什么")
    assert refused["dedup_reason"] == "circuit_open" and TIMEOUT_DOC in held(refused)


@pytest.mark.parametrize(
    ("overrides", "queries", "reason"),
    [
        ({}, ["ERR_TIMEOUT 是什么", "ERR_TIMEOUT 是什么"], "doc_retrieved"),
        (
            {"governance": {"domain_policy": "hard"}},
            ["ERR_TIMEOUT 是什么", "AUTH_E401_EXPIRED 怎么处理"],
            "domain_retrieved",
        ),
        (
            {"governance": {"water_metric": "calls", "levels": {"calls": {"low_max": 0, "medium_max": 1}}}},
            ["ERR_TIMEOUT 是什么", "数据库连接池怎么配置", "webhook 签名怎么校验"],
            "circuit_open",
        ),
        (
            {},
            [
                "how many days do I have to file an expense claim",
                "how many days do I have to file an expense claim",
                "Who approves a new cloud resource that costs more than 500 dollars a month?",
            ],
            "missing_dimension_required",
        ),
    ],
)
async def test_every_refusal_reason_has_at_most_200_characters_of_text(
    make_server: Any, overrides: dict[str, Any], queries: list[str], reason: str
) -> None:
    async with Client(make_server(overrides=overrides)) as client:
        for query in queries:
            result, text = await call(client, query)
    assert result["dedup_reason"] == reason and not result["found"]
    assert len(text) <= TERSE_LIMIT, text
    assert (
        result["budget"]["guidance"] and "calls_used" in result["budget"]
    )  # structured content keeps every field


async def test_no_match_text_is_terse_too(make_server: Any) -> None:
    async with Client(make_server()) as client:
        result, text = await call(client, "how do I bake sourdough bread at home")
    assert result["relevance_level"] == "NO_MATCH" and len(text) <= TERSE_LIMIT


@pytest.mark.slow
async def test_a_copy_in_another_folder_is_held_in_the_parts_its_twin_was_sent(
    tmp_path: Path, e5_embedder: Any, make_server: Any
) -> None:
    # Without a front-matter domain, each copy's folder is its domain.
    handbook = (SAMPLE_KB / HANDBOOK).read_text(encoding="utf-8").replace("domain: onboarding\n", "")
    kb = write_knowledge_base(tmp_path / "kb", {"ops/handbook.md": handbook, "team-b/handbook.md": handbook})
    data = tmp_path / "copies"
    ingest_into(data, kb, e5_embedder)
    async with Client(make_server(overrides={"data_dir": data})) as client:
        first, _ = await call(client, EXPENSE)
        sent = first["primary"]["doc_key"]
        copy = "team-b/handbook.md" if sent == "ops/handbook.md" else "ops/handbook.md"
        folder = copy.split("/")[0]
        # Another part of the copy is new to the session.
        other_part, _ = await call(client, CLOUD, domain=folder)
        # The first question, filtered to the copy's folder, used to send the same passage again.
        again, _ = await call(client, EXPENSE, domain=folder)
    assert EXPENSE_ANSWER in first["primary"]["content"]
    assert other_part["primary"]["doc_key"] == copy and CLOUD_ANSWER in other_part["primary"]["content"]
    assert again["relevance_level"] == "DEDUPED" and again["dedup_reason"] == "doc_retrieved", again
    assert sent in held(again)
