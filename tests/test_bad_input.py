"""Bad input: every case gets a clear error that names the problem, and the server serves the next request.

The three tables below are the list of cases: tool arguments (through the SDK client, in process),
JSON-RPC frames over streamable HTTP, and lines over stdio (both against a real server process).
docs/reliability.md reproduces them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.from_thread import BlockingPortal
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS

from tests.wire import (
    RawSession,
    Served,
    StdioPeer,
    blocking_client,
    post,
    private_data_dir,
    served_http,
    server_env,
)

GOOD_QUERY = "ERR_TIMEOUT 是什么"
GOOD_DOC = "error-codes/err-timeout.md"
FILTER_INJECTION = '" or 1==1 or "'


@dataclass(frozen=True)
class ToolCase:
    """One call of lookup_knowledge with bad arguments, and fragments its error text must contain."""

    id: str
    arguments: dict[str, Any]
    expected: tuple[str, ...]
    meta: dict[str, Any] | None = None


TOOL_CASES = [
    ToolCase("empty query", {"query": ""}, ("query", "at least 1 character")),
    ToolCase("whitespace-only query", {"query": " \t\n  "}, ("query must not be blank",)),
    # No term to match: it came back as REFERENCE with three unrelated documents.
    *(
        ToolCase(f"{what} query", {"query": query}, ("query has no word to look up",))
        for what, query in (
            ("punctuation-only", "???"),
            ("full-width punctuation", "？？？"),
            ("emoji", "🙂 🙂"),
        )
    ),
    ToolCase("100,000-character query", {"query": "timeout " * 12_500}, ("query", "at most 2000 characters")),
    ToolCase(
        "NUL in query",
        {"query": "ERR_TIMEOUT\x00"},
        ("query contains control character U+0000 at position 11",),
    ),
    ToolCase(
        "escape sequence in query", {"query": "\x1b[31mred"}, ("query contains control character U+001B",)
    ),
    ToolCase("C1 control in query", {"query": "next\x85line"}, ("query contains control character U+0085",)),
    ToolCase(
        "lone surrogate in query", {"query": "timeout \ud800"}, ("query contains a lone surrogate (U+D800)",)
    ),
    ToolCase(
        "lone surrogate in domain",
        {"query": "timeout", "domain": "api\udfff"},
        ("domain contains a lone surrogate",),
    ),
    ToolCase("query missing", {}, ("query", "Field required")),
    ToolCase("query is a number", {"query": 42}, ("query", "Input should be a valid string")),
    ToolCase("query is a list", {"query": ["timeout"]}, ("query", "Input should be a valid string")),
    ToolCase(
        "query is an object", {"query": {"text": "timeout"}}, ("query", "Input should be a valid string")
    ),
    ToolCase("query is null", {"query": None}, ("query", "Input should be a valid string")),
    ToolCase(
        "domain is a number", {"query": "timeout", "domain": 3}, ("domain", "Input should be a valid string")
    ),
    ToolCase(
        "unknown extra argument", {"query": "timeout", "topk": 5}, ("unknown argument(s) 'topk'", "top_k")
    ),
    ToolCase(
        "several unknown arguments",
        {"query": "timeout", "limit": 1, "filter": "x"},
        (
            "unknown argument(s) 'filter', 'limit'",
            "accepted arguments: domain, missing_dimension, query, top_k",
        ),
    ),
    ToolCase(
        "unknown domain",
        {"query": "timeout", "domain": "databases"},
        ("unknown domain 'databases'", "known domains: api"),
    ),
    ToolCase(
        "domain with Milvus filter syntax",
        {"query": "timeout", "domain": FILTER_INJECTION},
        ("unknown domain", "known domains: api"),
    ),
    ToolCase(
        "domain with backslashes and quotes",
        {"query": "timeout", "domain": 'api\\" || domain != "\\'},
        ("unknown domain", "known domains: api"),
    ),
    ToolCase(
        "domain of 129 characters",
        {"query": "timeout", "domain": "d" * 129},
        ("domain", "at most 128 characters"),
    ),
    ToolCase("top_k of 0", {"query": "timeout", "top_k": 0}, ("top_k", "greater than or equal to 1")),
    ToolCase("top_k of -1", {"query": "timeout", "top_k": -1}, ("top_k", "greater than or equal to 1")),
    ToolCase(
        "top_k of 1e9", {"query": "timeout", "top_k": 1e9}, ("top_k", "Input should be a valid integer")
    ),
    ToolCase("top_k of 10**9", {"query": "timeout", "top_k": 10**9}, ("top_k", "less than or equal to 10")),
    ToolCase(
        "top_k as a string", {"query": "timeout", "top_k": "3"}, ("top_k", "Input should be a valid integer")
    ),
    ToolCase(
        "top_k as a boolean",
        {"query": "timeout", "top_k": True},
        ("top_k", "Input should be a valid integer"),
    ),
    ToolCase(
        "top_k of 2.5", {"query": "timeout", "top_k": 2.5}, ("top_k", "Input should be a valid integer")
    ),
    ToolCase(
        "missing_dimension of 501 characters",
        {"query": "timeout", "missing_dimension": "x" * 501},
        ("missing_dimension", "at most 500 characters"),
    ),
    ToolCase(
        "malformed _meta.session_id",
        {"query": "timeout"},
        ("_meta.session_id must be 1-256 printable ASCII characters",),
        meta={"session_id": "has spaces in it"},
    ),
]


@pytest.fixture(scope="module")
def in_process(
    tmp_path_factory: pytest.TempPathFactory, sample_template: Path, e5_embedder: Any
) -> Iterator[tuple[BlockingPortal, Client]]:
    """One in-process server and client for the whole table; each case uses its own session."""
    data_dir = private_data_dir(sample_template, tmp_path_factory.mktemp("bad-input") / "data")
    with blocking_client(data_dir, e5_embedder) as (portal, client):
        yield portal, client


def _call(
    portal: BlockingPortal, client: Client, arguments: dict[str, Any], meta: dict[str, Any] | None
) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(120):
            return await client.call_tool("lookup_knowledge", arguments, meta=meta)

    return portal.call(bounded)


@pytest.mark.parametrize("case", TOOL_CASES, ids=lambda case: case.id)
def test_bad_tool_arguments_get_an_error_naming_the_problem_and_the_session_carries_on(
    in_process: tuple[BlockingPortal, Client], case: ToolCase
) -> None:
    portal, client = in_process
    session = {"session_id": "case-" + "".join(c if c.isalnum() else "-" for c in case.id)}
    bad = _call(portal, client, case.arguments, case.meta or session)
    assert bad.is_error
    text = bad.content[0].text
    assert text.startswith("Error executing tool lookup_knowledge: ")
    for fragment in case.expected:
        assert fragment in text

    good = _call(portal, client, {"query": GOOD_QUERY}, session)
    assert not good.is_error, good.content
    result = good.structured_content
    assert result["relevance_level"] == "PRECISE"
    assert result["primary"]["doc_key"] == GOOD_DOC
    # The refused call left nothing in the session's memory: this is its first counted call.
    assert result["budget"]["calls_used"] == 1
    assert result["already_in_context"] == []


def test_an_oversized_meta_is_refused_as_invalid_params_and_the_next_request_is_served(
    in_process: tuple[BlockingPortal, Client],
) -> None:
    portal, client = in_process
    with pytest.raises(MCPError) as refused:
        _call(portal, client, {"query": GOOD_QUERY}, {"session_id": "big-meta", "trace": "x" * 100_000})
    assert refused.value.code == INVALID_PARAMS
    assert refused.value.message.startswith("_meta is too large: ")
    assert "the limit is 16384 bytes" in refused.value.message
    good = _call(portal, client, {"query": GOOD_QUERY}, {"session_id": "big-meta"})
    assert good.structured_content["budget"]["calls_used"] == 1


def test_a_meta_within_the_limit_is_accepted(in_process: tuple[BlockingPortal, Client]) -> None:
    portal, client = in_process
    result = _call(portal, client, {"query": GOOD_QUERY}, {"session_id": "small-meta", "trace": "x" * 8_000})
    assert not result.is_error


def test_unknown_arguments_of_other_tools_are_refused_too(in_process: tuple[BlockingPortal, Client]) -> None:
    portal, client = in_process

    async def call() -> Any:
        with anyio.fail_after(60):
            return await client.call_tool("list_knowledge_domains", {"domain": "api"})

    result = portal.call(call)
    assert result.is_error
    assert result.content[0].text.startswith(
        "Error executing tool list_knowledge_domains: unknown argument(s) 'domain'; accepted arguments: (none)"
    )


# -- over streamable HTTP -------------------------------------------------------------------------

MAX_BODY_BYTES = 65_536


@dataclass(frozen=True)
class HttpCase:
    """A raw POST to /mcp: its body, the HTTP status and a fragment of the error it must get."""

    id: str
    body: bytes
    status: int
    expected: str
    code: int | None = None  # the JSON-RPC error code, when the reply is a JSON-RPC error
    in_session: bool = False  # sent inside an initialized session rather than as an opening request
    headers: dict[str, str] = field(default_factory=dict)


def _tool_call(arguments_json: str) -> bytes:
    return (
        '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", '
        f'"params": {{"name": "lookup_knowledge", "arguments": {arguments_json}}}}}'
    ).encode()


HTTP_CASES = [
    HttpCase("not JSON", b"{not json", 400, "Parse error", code=-32700),
    HttpCase("truncated JSON", b'{"jsonrpc": "2.0", "id": 1, "method": "pi', 400, "Parse error", code=-32700),
    HttpCase("empty body", b"", 400, "Parse error", code=-32700),
    HttpCase(
        "JSON array (batch)",
        b'[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]',
        400,
        "Validation error",
        code=-32602,
    ),
    HttpCase("JSON string", b'"ping"', 400, "Validation error", code=-32602),
    HttpCase("no method", b'{"jsonrpc": "2.0", "id": 1}', 400, "Validation error", code=-32602),
    HttpCase(
        "wrong jsonrpc version",
        b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}',
        400,
        "Validation error",
        code=-32602,
    ),
    HttpCase(
        "lone surrogate escape",
        _tool_call('{"query": "timeout \\ud800"}'),
        400,
        "Parse error",
        code=-32700,
        in_session=True,
    ),
    HttpCase("not JSON inside a session", b"{not json", 400, "Parse error", code=-32700, in_session=True),
    HttpCase(
        "body over the limit",
        _tool_call(json.dumps({"query": "x" * (MAX_BODY_BYTES + 1)})),
        413,
        "Request body too large",
    ),
    HttpCase(
        "body over the limit inside a session",
        b"[" + b" " * MAX_BODY_BYTES + b"]",
        413,
        "Request body too large",
        in_session=True,
    ),
    HttpCase(
        "wrong content type",
        b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}',
        400,
        "Invalid Content-Type header",
        headers={"Content-Type": "text/plain"},
    ),
]


@pytest.fixture(scope="module")
def http_served(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[Served]:
    """One streamable-HTTP server process for the HTTP table (body limit lowered to 64 KiB)."""
    base = tmp_path_factory.mktemp("bad-input-http")
    env = server_env(
        private_data_dir(sample_template, base / "data"),
        LOOKUP_KNOWLEDGE_HTTP__MAX_BODY_BYTES=str(MAX_BODY_BYTES),
    )
    with served_http(env, base / "logs") as served:
        yield served


@pytest.mark.slow
@pytest.mark.parametrize("case", HTTP_CASES, ids=lambda case: case.id)
def test_malformed_http_requests_get_an_error_and_the_server_keeps_serving(
    http_served: Served, case: HttpCase
) -> None:
    session = RawSession(http_served.url) if case.in_session else None
    headers = {**(session.headers if session else {}), **case.headers}
    reply = post(http_served.url, case.body, headers=headers)
    assert reply.status == case.status, reply.text[:500]
    assert case.expected in reply.text
    if case.code is not None:
        error = reply.message()["error"]
        assert error["code"] == case.code
        assert error["message"].startswith(case.expected)

    # The session that got the bad frame, or a fresh one, is served as usual.
    session = session or RawSession(http_served.url)
    answer = session.call_tool("lookup_knowledge", {"query": GOOD_QUERY})
    assert answer["result"]["structuredContent"]["primary"]["doc_key"] == GOOD_DOC


@pytest.mark.slow
def test_bad_tool_arguments_over_http_are_tool_errors_in_the_same_session(http_served: Served) -> None:
    session = RawSession(http_served.url)
    for arguments in (
        {"query": "timeout", "topk": 2},
        {"query": "timeout", "domain": FILTER_INJECTION},
        {"query": ""},
    ):
        result = session.call_tool("lookup_knowledge", arguments)["result"]
        assert result["isError"] is True
        assert result["content"][0]["text"].startswith("Error executing tool lookup_knowledge: ")
    answer = session.call_tool("lookup_knowledge", {"query": GOOD_QUERY})["result"]["structuredContent"]
    assert answer["budget"]["calls_used"] == 1 and answer["primary"]["doc_key"] == GOOD_DOC


# -- over stdio -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StdioCase:
    """One line written to the server's stdin and the JSON-RPC error it must answer with."""

    id: str
    line: str
    code: int
    expected: str
    reply_id: int | None = None


STDIO_CASES = [
    StdioCase("not JSON", "{not json", -32700, "Parse error: "),
    StdioCase("truncated JSON", '{"jsonrpc": "2.0", "id": 3, "method": "pi', -32700, "Parse error: "),
    StdioCase(
        "JSON array (batch)",
        '[{"jsonrpc": "2.0", "id": 1, "method": "ping"}]',
        -32600,
        "Invalid request: expected a JSON-RPC 2.0 request object, got a JSON array",
    ),
    StdioCase(
        "JSON number",
        "42",
        -32600,
        "Invalid request: expected a JSON-RPC 2.0 request object, got a JSON number",
    ),
    StdioCase(
        "no method",
        '{"jsonrpc": "2.0", "id": 5}',
        -32600,
        "Invalid request: not a JSON-RPC 2.0 message",
        reply_id=5,
    ),
    StdioCase(
        "wrong jsonrpc version",
        '{"jsonrpc": "1.0", "id": 6, "method": "ping"}',
        -32600,
        "Invalid request: not a JSON-RPC 2.0 message",
        reply_id=6,
    ),
    StdioCase(
        "lone surrogate escape",
        '{"jsonrpc": "2.0", "id": 8, "method": "ping", "params": {"x": "\\ud800"}}',
        -32700,
        "Parse error: ",
    ),
    StdioCase(
        "params of the wrong type",
        '{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": "lookup"}',
        -32600,
        "Invalid request: not a JSON-RPC 2.0 message",
        reply_id=9,
    ),
]


@pytest.fixture(scope="module")
def stdio_peer(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[StdioPeer]:
    base = tmp_path_factory.mktemp("bad-input-stdio")
    peer = StdioPeer(server_env(private_data_dir(sample_template, base / "data")), base / "stderr.log")
    try:
        assert "result" in peer.initialize()
        yield peer
    finally:
        peer.close()


@pytest.mark.slow
@pytest.mark.parametrize("case", STDIO_CASES, ids=lambda case: case.id)
def test_malformed_stdio_lines_are_answered_and_the_next_line_is_served(
    stdio_peer: StdioPeer, case: StdioCase
) -> None:
    stdio_peer.send_line(case.line)
    reply = stdio_peer.receive()
    assert reply["id"] == case.reply_id
    assert reply["error"]["code"] == case.code
    assert reply["error"]["message"].startswith(case.expected)

    stdio_peer.send({"jsonrpc": "2.0", "id": 100, "method": "ping"})
    assert stdio_peer.receive() == {"jsonrpc": "2.0", "id": 100, "result": {}}


@pytest.mark.slow
def test_unknown_arguments_over_stdio_are_a_tool_error(stdio_peer: StdioPeer) -> None:
    stdio_peer.send(
        {
            "jsonrpc": "2.0",
            "id": 200,
            "method": "tools/call",
            "params": {"name": "lookup_knowledge", "arguments": {"query": "timeout", "k": 1}},
        }
    )
    result = stdio_peer.receive()["result"]
    assert result["isError"] is True
    assert "unknown argument(s) 'k'" in result["content"][0]["text"]
