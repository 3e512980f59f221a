"""The MCP surface through the SDK's in-process client: tools, resources, prompts, action memory."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client

from tests.helpers import lookup

QUERY = "ERR_TIMEOUT 是什么"
DOC = "error-codes/err-timeout.md"


class FakeClock:
    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


async def test_tools_resources_and_prompts_are_listed(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == {
            "lookup_knowledge",
            "read_knowledge_doc",
            "reset_session",
            "list_knowledge_domains",
        }
        schema = tools["lookup_knowledge"].output_schema
        assert schema is not None and "relevance_level" in schema["properties"]
        assert "score" not in json.dumps(schema).lower()
        assert "STOP" in (tools["lookup_knowledge"].description or "")
        resources = {str(r.uri) for r in (await client.list_resources()).resources}
        assert {"knowledge://map", "knowledge://stats"} <= resources
        templates = {t.uri_template for t in (await client.list_resource_templates()).resource_templates}
        assert {"knowledge://domain/{domain}", "knowledge://doc/{+doc_key}{?section}"} <= templates
        prompts = {p.name for p in (await client.list_prompts()).prompts}
        assert prompts == {"executor_retrieval_rules", "planner_with_knowledge_map"}


async def test_lookup_returns_structured_content_and_a_text_rendering(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        result = await client.call_tool("lookup_knowledge", {"query": QUERY})
    content = result.structured_content
    assert content["relevance_level"] == "PRECISE" and content["found"] is True
    assert content["primary"]["doc_key"] == DOC and content["primary"]["domain"] == "error-codes"
    assert content["session_scope"] == "connection"
    assert (
        content["retrieved_domains_this_session"][0:1] == ["error-codes"]
        or "error-codes" in content["retrieved_domains_this_session"]
    )
    assert set(content["budget"]) == {"calls_used", "water_level", "next_call", "guidance"}
    text = result.content[0].text
    assert text.startswith("relevance: PRECISE") and DOC in text
    assert "0.8" not in json.dumps(content)  # no raw similarity leaks into the result


async def test_second_lookup_of_same_document_returns_deduped(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        first = await lookup(client, QUERY, session=None)
        second = await lookup(client, QUERY, session=None)
    assert first["relevance_level"] == "PRECISE"
    assert second["relevance_level"] == "DEDUPED" and second["dedup_reason"] == "doc_retrieved"
    assert second["found"] is False and second["primary"] is None
    assert DOC in [d["doc_key"] for d in second["already_in_context"]]
    assert "error-codes" in second["retrieved_domains_this_session"]


async def test_a_deduped_message_ends_with_the_guidance_as_a_sentence(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        await lookup(client, "what does ERR_TIMEOUT mean", session=None)
        second = await lookup(client, "what does ERR_TIMEOUT mean", session=None)
    assert second["relevance_level"] == "DEDUPED"
    guidance = second["budget"]["guidance"]  # English, and lower case where it stands alone
    assert guidance[0].islower()
    assert second["message"].endswith(". " + guidance[0].upper() + guidance[1:])


async def test_a_passage_is_never_returned_twice_to_a_session(make_server: Any) -> None:
    queries = [
        "数据库连接池怎么配置",
        "HikariCP 连接池参数",
        "connection pool size settings",
        "连接池耗尽怎么排查",
        "maxLifetime 和 wait_timeout 的关系",
    ]
    returned: list[str] = []
    async with Client(make_server(overrides={"governance": {"enabled": False}}), mode="legacy") as client:
        for query in queries:
            content = await lookup(client, query, session=None, top_k=5)
            documents = ([content["primary"]] if content["primary"] else []) + content["supplement"]
            passages = [f"{d['doc_key']}#{s}" for d in documents for s in d["sections"] or [""]]
            assert not set(passages) & set(returned)
            returned += passages
    assert returned


async def test_reset_session_makes_the_session_fresh(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        await lookup(client, QUERY, session=None)
        reset = await client.call_tool("reset_session", {})
        assert reset.structured_content == {
            "session_scope": "connection",
            "forgotten": True,
            "message": "session memory cleared; lookup_knowledge is open again",
        }
        again = await lookup(client, QUERY, session=None)
    assert again["relevance_level"] == "PRECISE" and again["primary"]["doc_key"] == DOC


async def test_idle_session_is_forgotten_after_the_ttl(make_server: Any) -> None:
    clock = FakeClock()
    server = make_server(clock=clock, overrides={"memory": {"ttl_seconds": 60, "persist": False}})
    async with Client(server, mode="legacy") as client:
        await lookup(client, QUERY, session=None)
        clock.now += 59
        assert (await lookup(client, QUERY, session=None))["relevance_level"] == "DEDUPED"
        clock.now += 61
        assert (await lookup(client, QUERY, session=None))["relevance_level"] == "PRECISE"


async def test_two_clients_never_share_memory(make_server: Any) -> None:
    server = make_server()
    async with Client(server, mode="legacy") as a, Client(server, mode="legacy") as b:
        assert (await lookup(a, QUERY, session=None))["relevance_level"] == "PRECISE"
        assert (await lookup(b, QUERY, session=None))["relevance_level"] == "PRECISE"
        assert (await lookup(a, QUERY, session=None))["relevance_level"] == "DEDUPED"


async def test_explicit_meta_session_id_scopes_memory_on_the_sessionless_protocol(make_server: Any) -> None:
    async with Client(make_server()) as client:  # negotiates 2026-07-28: no MCP session
        assert client.protocol_version == "2026-07-28"
        anonymous = [await lookup(client, QUERY, session=None) for _ in range(2)]
        assert [c["session_scope"] for c in anonymous] == ["none", "none"]
        assert [c["relevance_level"] for c in anonymous] == ["PRECISE", "PRECISE"]
        assert anonymous[0]["budget"]["next_call"] is None
        one = await lookup(client, QUERY, session="agent-1")
        two = await lookup(client, QUERY, session="agent-1")
        other = await lookup(client, QUERY, session="agent-2")
    assert one["session_scope"] == "explicit"
    assert (one["relevance_level"], two["relevance_level"], other["relevance_level"]) == (
        "PRECISE",
        "DEDUPED",
        "PRECISE",
    )


async def test_malformed_explicit_session_key_is_rejected(make_server: Any) -> None:
    async with Client(make_server()) as client:
        result = await client.call_tool(
            "lookup_knowledge", {"query": QUERY}, meta={"session_id": "has space"}
        )
    assert result.is_error
    assert "_meta.session_id must be 1-256 printable ASCII characters" in result.content[0].text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"query": "   "}, "query must not be blank"),
        ({"query": "x" * 2001}, "query"),
        ({"query": "ok", "top_k": 0}, "top_k"),
        ({"query": "ok", "top_k": 11}, "top_k"),
        ({"query": "ok", "domain": "cooking"}, "unknown domain 'cooking'; known domains: api, error-codes"),
    ],
)
async def test_invalid_arguments_name_the_field_and_the_server_keeps_serving(
    make_server: Any, args: dict[str, Any], message: str
) -> None:
    async with Client(make_server(), mode="legacy") as client:
        bad = await client.call_tool("lookup_knowledge", args)
        assert bad.is_error and message in bad.content[0].text
        assert (await lookup(client, QUERY, session=None))["relevance_level"] == "PRECISE"


async def test_domain_filter_restricts_results(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        content = await lookup(client, "timeout configuration", session=None, domain="api", top_k=5)
    # The api domain has a timeout document, so an empty result would be a failure, not a pass.
    assert content["primary"] is not None, content
    docs = [content["primary"], *content["supplement"]]
    assert {d["domain"] for d in docs} == {"api"}


async def test_off_topic_query_returns_no_match_without_content(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        content = await lookup(client, "how do I bake sourdough bread at home", session=None)
    assert content["relevance_level"] == "NO_MATCH"
    assert content["found"] is False and content["primary"] is None and content["supplement"] == []


async def test_knowledge_map_resource_template_and_tool_agree(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        resource = json.loads((await client.read_resource("knowledge://map")).contents[0].text)
        tool = (await client.call_tool("list_knowledge_domains", {})).structured_content
        domain = json.loads((await client.read_resource("knowledge://domain/error-codes")).contents[0].text)
    assert resource == tool
    ids = [d["domain_id"] for d in resource["domains"]]
    assert ids == ["api", "error-codes", "infrastructure", "onboarding", "troubleshooting"]
    assert resource["document_count"] == 32
    for entry in resource["domains"]:
        assert (
            entry["description"]
            and entry["when_to_retrieve"]
            and entry["covers"]
            and entry["document_count"] > 0
        )
    assert domain["domain_id"] == "error-codes" and "ERR_TIMEOUT" in domain["covers"]


async def test_unknown_domain_resource_is_an_error(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        with pytest.raises(Exception, match="unknown domain 'cooking'"):
            await client.read_resource("knowledge://domain/cooking")


async def test_prompts_render_in_both_languages(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        en = await client.get_prompt("executor_retrieval_rules", {"language": "en"})
        zh = await client.get_prompt("executor_retrieval_rules", {"language": "zh"})
        planner = await client.get_prompt("planner_with_knowledge_map", {"language": "en"})
    assert "Legal exit" in en.messages[0].content.text
    assert "合法出口" in zh.messages[0].content.text
    text = planner.messages[0].content.text
    assert "available_knowledge_domains:" in text and "domain_id: error-codes" in text
