"""Session keys belong to their principal; stateless HTTP trusts no client-chosen session id.

Issue 14, findings 1 and 2: over HTTP an explicit key (``X-Session-Id``, ``_meta.session_id``)
was shared by every client that named it, and ``--stateless`` took any ``mcp-session-id`` as a
session. Here two principals with their own tokens name the same keys, concurrently and at
load, and never see, spend or reset each other's memory.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from server.config.http_settings import token_digest
from server.protocol.session import SessionKeyError, resolve_session
from tests.wire import (
    INITIALIZE,
    RawSession,
    RawSSE,
    Served,
    post,
    private_data_dir,
    served_http,
    server_env,
)

GOOD_QUERY = "ERR_TIMEOUT 是什么"
GOOD_DOC = "error-codes/err-timeout.md"
TOKENS = {"alice": "tok-alice-3b8e51", "bob": "tok-bob-9c02d7"}
CLIENTS = json.dumps([{"name": name, "token_sha256": token_digest(tok)} for name, tok in TOKENS.items()])


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


@pytest.fixture(scope="module")
def two_principals(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[Served]:
    """A streamable-HTTP server with the clients alice and bob, governance on (the default)."""
    base = tmp_path_factory.mktemp("isolation")
    env = server_env(private_data_dir(sample_template, base / "data"), LOOKUP_KNOWLEDGE_HTTP__CLIENTS=CLIENTS)
    with served_http(env, base / "logs") as served:
        yield served


def _lookup(session: RawSession, **meta: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"name": "lookup_knowledge", "arguments": {"query": GOOD_QUERY}}
    if meta:
        params["_meta"] = meta
    reply = session.request("tools/call", params)
    return reply["result"]["structuredContent"]  # type: ignore[no-any-return]


@pytest.mark.slow
@pytest.mark.parametrize("carrier", ["header", "meta"])
def test_a_principal_naming_another_principals_key_gets_a_memory_of_its_own(
    two_principals: Served, carrier: str
) -> None:
    key = f"user-42-{carrier}"

    def session(name: str) -> RawSession:
        headers = auth(name) | ({"X-Session-Id": key} if carrier == "header" else {})
        return RawSession(two_principals.url, headers=headers)

    meta = {"session_id": key} if carrier == "meta" else {}
    alice, bob = session("alice"), session("bob")
    first = _lookup(alice, **meta)
    assert (first["session_scope"], first["relevance_level"]) == ("explicit", "PRECISE")
    # bob names alice's key: he sees none of her titles or domains and spends none of her budget.
    other = _lookup(bob, **meta)
    assert other["relevance_level"] == "PRECISE" and other["already_in_context"] == []
    assert other["budget"]["calls_used"] == 1
    # bob's reset does not wipe alice's memory.
    bob.call_tool("reset_session", {}) if carrier == "header" else bob.request(
        "tools/call", {"name": "reset_session", "arguments": {}, "_meta": meta}
    )
    again = _lookup(alice, **meta)
    assert again["relevance_level"] == "DEDUPED"
    assert GOOD_DOC in [d["doc_key"] for d in again["already_in_context"]]
    assert again["budget"]["calls_used"] == 2


@pytest.mark.slow
def test_the_same_principal_shares_its_key_across_connections(two_principals: Served) -> None:
    headers = auth("alice") | {"X-Session-Id": "shared-by-alice"}
    _lookup(RawSession(two_principals.url, headers=headers))
    second = _lookup(RawSession(two_principals.url, headers=headers))
    assert second["relevance_level"] == "DEDUPED" and second["budget"]["calls_used"] == 2


def _resolve(**changes: Any) -> Any:
    arguments: dict[str, Any] = {
        "headers": {"x-session-id": "user-42"},
        "meta": None,
        "query_params": None,
        "connection": None,
        "is_http": True,
        "stdio_key": None,
        "handshake": True,
        "principal": None,
        "peer": "203.0.113.9",
    }
    return resolve_session(**(arguments | changes))


def test_without_auth_explicit_keys_from_a_remote_peer_are_refused_unless_allowed() -> None:
    with pytest.raises(SessionKeyError, match=r"explicit session keys .* are refused from 203\.0\.113\.9"):
        _resolve()
    with pytest.raises(SessionKeyError, match="refused from"):
        _resolve(headers={}, meta={"session_id": "user-42"})
    assert _resolve(peer="127.0.0.1").key == "explicit:user-42"
    assert _resolve(peer="::1").key == "explicit:user-42"
    assert _resolve(allow_remote_keys=True).key == "explicit:user-42"
    # An authenticated principal may send keys from anywhere: they are its own.
    assert _resolve(principal="alice").key == "explicit@alice:user-42"
    # stdio and in-process calls have no HTTP peer: keys are honoured.
    assert _resolve(is_http=False, headers=None, meta={"session_id": "k"}, peer=None).key == "explicit:k"


def test_keys_of_different_principals_never_collide() -> None:
    keys = {
        _resolve(principal=p, headers={"x-session-id": k}).key
        for p, k in [("alice", "bob:x"), ("bob", "x"), ("alice", "x"), ("bob", "alice:x")]
    }
    assert len(keys) == 4
    assert _resolve(peer="127.0.0.1").key not in keys


def test_an_mcp_session_id_is_trusted_only_when_the_transport_issued_it() -> None:
    headers = {"mcp-session-id": "victim"}
    trusted = _resolve(headers=headers, transport_session="mcp-session-id")
    assert (trusted.key, trusted.scope) == ("mcp:victim", "mcp-session")
    assert _resolve(headers=headers, transport_session="none").scope == "none"
    assert _resolve(headers=headers, transport_session="sse").scope == "none"
    assert _resolve(headers=headers, principal="bob").key == "mcp@bob:victim"


def test_a_session_id_query_parameter_is_read_only_on_the_sse_message_endpoint() -> None:
    query = {"session_id": "v"}
    for transport in ("mcp-session-id", "none"):
        for handshake in (True, False):
            found = _resolve(headers={}, query_params=query, transport_session=transport, handshake=handshake)
            assert found.scope == "none", (transport, handshake)
    sse = _resolve(headers={}, query_params=query, transport_session="sse")
    assert (sse.key, sse.scope) == ("sse:v", "mcp-session")
    # SSE memory keys carry the principal, as every other key does.
    assert _resolve(headers={}, query_params=query, transport_session="sse", principal="alice").key == (
        "sse@alice:v"
    )


@pytest.mark.slow
def test_stateless_http_ignores_a_client_chosen_mcp_session_id(tmp_path: Path, sample_template: Path) -> None:
    env = server_env(private_data_dir(sample_template, tmp_path / "data"))
    with served_http(env, tmp_path / "logs", extra=["--stateless"]) as served:
        headers = {"mcp-protocol-version": "2025-06-18", "mcp-session-id": "victim"}
        assert post(served.url, INITIALIZE, headers=headers).status == 200
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
        body["params"] = {"name": "lookup_knowledge", "arguments": {"query": GOOD_QUERY}}
        answers = [post(served.url, body, headers=headers).message()["result"] for _ in range(2)]
        long_id = post(served.url, body, headers={**headers, "mcp-session-id": "v" * 8000}).message()
    for answer in answers:
        content = answer["structuredContent"]
        assert content["session_scope"] == "none"
        assert content["relevance_level"] == "PRECISE" and content["already_in_context"] == []
    assert long_id["result"]["structuredContent"]["session_scope"] == "none"


# -- issue 34, broken 1 and 2: transport session ids belong to the principal that opened them --------


def _stolen(session: RawSession, thief: str) -> dict[str, str]:
    """The victim's session headers, with the thief's own (valid) token."""
    return session.headers | auth(thief)


@pytest.mark.slow
def test_another_principal_cannot_end_join_or_use_a_streamable_http_session(two_principals: Served) -> None:
    alice = RawSession(two_principals.url, headers=auth("alice"))
    first = _lookup(alice)
    assert (first["session_scope"], first["relevance_level"]) == ("mcp-session", "PRECISE")
    stolen = _stolen(alice, "bob")
    # bob knows alice's mcp-session-id: as far as he can tell, the session does not exist.
    assert httpx.delete(two_principals.url, headers=stolen, timeout=30).status_code == 404
    with httpx.stream(
        "GET", two_principals.url, headers=stolen | {"Accept": "text/event-stream"}, timeout=30
    ) as stream:
        assert stream.status_code == 404
    reset = {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "reset_session"}}
    assert post(two_principals.url, reset, headers=stolen).status == 404
    # alice's session is alive, with its memory.
    again = _lookup(alice)
    assert again["relevance_level"] == "DEDUPED" and again["budget"]["calls_used"] == 2


@pytest.fixture(scope="module")
def two_principals_sse(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[Served]:
    """An SSE server with the clients alice and bob."""
    base = tmp_path_factory.mktemp("isolation-sse")
    env = server_env(private_data_dir(sample_template, base / "data"), LOOKUP_KNOWLEDGE_HTTP__CLIENTS=CLIENTS)
    with served_http(env, base / "logs", extra=["--transport", "sse"]) as served:
        yield served


def _sse_lookup(session: RawSSE) -> dict[str, Any]:
    reply = session.request("tools/call", {"name": "lookup_knowledge", "arguments": {"query": GOOD_QUERY}})
    return reply["result"]["structuredContent"]  # type: ignore[no-any-return]


@pytest.mark.slow
def test_another_principal_cannot_post_to_an_sse_session_and_its_memory_carries_the_principal(
    two_principals_sse: Served,
) -> None:
    base = f"http://127.0.0.1:{two_principals_sse.port}"
    alice = RawSSE(base, headers=auth("alice"))
    try:
        alice.initialize()
        first = _sse_lookup(alice)
        assert (first["session_scope"], first["relevance_level"]) == ("mcp-session", "PRECISE")
        reset = {"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "reset_session"}}
        assert alice.post(reset, headers=auth("bob")) == 404
        again = _sse_lookup(alice)
        assert again["relevance_level"] == "DEDUPED" and again["budget"]["calls_used"] == 2
    finally:
        alice.close()
    data_dir = two_principals_sse.stdout.parent.parent / "data"
    with sqlite3.connect(data_dir / "log.sqlite") as db:
        keys = {key for (key,) in db.execute("SELECT DISTINCT session_key FROM tool_invocation")}
    assert keys and all(key.startswith("sse@alice:") for key in keys), keys


def _call_body(name: str, arguments: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": name, "arguments": arguments},
    }


@pytest.mark.slow
def test_stateless_http_ignores_a_client_chosen_session_id_query_parameter(
    tmp_path: Path, sample_template: Path
) -> None:
    env = server_env(private_data_dir(sample_template, tmp_path / "data"))
    with served_http(env, tmp_path / "logs", extra=["--stateless"]) as served:
        url = served.url + "?session_id=v"
        headers = {"mcp-protocol-version": "2025-06-18"}
        # Two peers naming the same ?session_id=: neither sees the other's documents.
        answers = [
            post(url, _call_body("lookup_knowledge", {"query": GOOD_QUERY}), headers=headers).message()
            for _ in range(2)
        ]
    for answer in answers:
        content = answer["result"]["structuredContent"]
        assert content["session_scope"] == "none"
        assert content["relevance_level"] == "PRECISE" and content["already_in_context"] == []


@pytest.mark.slow
def test_on_the_sessionless_protocol_two_principals_naming_one_session_id_share_nothing(
    two_principals: Served,
) -> None:
    url = two_principals.url + "?session_id=v"

    async def lookups(name: str, tool: str = "lookup_knowledge") -> list[Any]:
        arguments = {"query": GOOD_QUERY} if tool == "lookup_knowledge" else {}
        async with (
            create_mcp_http_client(headers=auth(name)) as http,
            Client(streamable_http_client(url, http_client=http)) as client,  # 2026-07-28
        ):
            assert client.protocol_version == "2026-07-28"
            return [(await client.call_tool(tool, arguments)).structured_content for _ in range(2)]

    async def run() -> tuple[list[Any], list[Any], list[Any]]:
        with anyio.fail_after(120):
            return await lookups("alice"), await lookups("bob", "reset_session"), await lookups("bob")

    alice, bob_reset, bob = anyio.run(run)
    assert [r["session_scope"] for r in alice + bob] == ["none"] * 4
    assert [r["relevance_level"] for r in bob] == ["PRECISE", "PRECISE"]
    assert [r["forgotten"] for r in bob_reset] == [False, False]


# -- load: 50 sessions under two principals, every pair naming the same keys ---------------------

SESSIONS = 50
CALLS = 4
BOUND_S = 240.0


async def _keyed_session(url: str, index: int, report: dict[str, Any]) -> None:
    principal = "alice" if index % 2 == 0 else "bob"
    # Sessions 2k (alice) and 2k+1 (bob) send the same key: only the principal tells them apart.
    key = f"user-{index // 2}"
    queries = [GOOD_QUERY, "webhook retries", GOOD_QUERY + "?", "webhook retries again"][:CALLS]
    own: set[str] = set()
    async with (
        create_mcp_http_client(headers=auth(principal) | {"X-Session-Id": key}) as http,
        Client(streamable_http_client(url, http_client=http), mode="legacy") as client,
    ):
        for number, query in enumerate(queries, start=1):
            result = await client.call_tool("lookup_knowledge", {"query": query})
            report["calls"] += 1
            if result.is_error:
                report["errors"].append(f"{index}: {result.content!r}"[:300])
                continue
            answer = result.structured_content or {}
            already = {d["doc_key"] for d in answer["already_in_context"]}
            if not already <= own:
                report["cross_reads"].append(f"session {index} ({principal}) shown {sorted(already - own)}")
            if answer["budget"]["calls_used"] != number:
                report["cross_reads"].append(
                    f"session {index} ({principal}) call {number} counted {answer['budget']['calls_used']}"
                )
            returned = ([answer["primary"]] if answer.get("primary") else []) + answer["supplement"]
            own |= {d["doc_key"] for d in returned}
            report["deduped"] += len(already)


@pytest.mark.slow
def test_fifty_sessions_under_two_principals_never_read_each_others_memory(
    two_principals: Served,
) -> None:
    report: dict[str, Any] = {"calls": 0, "errors": [], "cross_reads": [], "deduped": 0}

    async def run() -> None:
        with anyio.fail_after(BOUND_S):
            async with anyio.create_task_group() as tg:
                for index in range(SESSIONS):
                    tg.start_soon(_keyed_session, two_principals.url, index, report)

    anyio.run(run)
    assert report["calls"] == SESSIONS * CALLS
    assert report["errors"] == []
    assert report["cross_reads"] == []
    assert report["deduped"] > 0, "no session repeated a document: the check saw nothing"
