"""Every transport through a real server process: stdio, streamable HTTP and SSE on loopback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.sse import sse_client

from tests.helpers import ROOT, http_server

pytestmark = pytest.mark.slow

QUERY = "ERR_TIMEOUT 是什么"
DOC = "error-codes/err-timeout.md"


async def _call(client: Client, **meta: Any) -> dict[str, Any]:
    result = await client.call_tool("lookup_knowledge", {"query": QUERY}, meta=meta or None)
    assert not result.is_error, result.content
    return result.structured_content  # type: ignore[return-value]


async def _session_pair(client_a: Client, client_b: Client) -> None:
    """Session A repeats a lookup while session B, concurrently, makes the same lookup once."""
    results: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}

    async def run_a() -> None:
        results["a"].append(await _call(client_a))
        results["a"].append(await _call(client_a))

    async def run_b() -> None:
        results["b"].append(await _call(client_b))

    async with anyio.create_task_group() as tg:
        tg.start_soon(run_a)
        tg.start_soon(run_b)
    first, second = results["a"]
    (other,) = results["b"]
    assert first["relevance_level"] == "PRECISE" and first["primary"]["doc_key"] == DOC
    assert second["relevance_level"] == "DEDUPED" and second["dedup_reason"] == "doc_retrieved"
    assert DOC in [d["doc_key"] for d in second["already_in_context"]]
    assert other["relevance_level"] == "PRECISE" and other["primary"]["doc_key"] == DOC


async def test_stdio_subprocess_dedups_within_its_one_client(server_env: dict[str, str]) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "server", "serve"], env=server_env, cwd=str(ROOT)
    )
    with anyio.fail_after(120):
        async with Client(params, mode="legacy") as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            assert "lookup_knowledge" in tools
            first, second = await _call(client), await _call(client)
    assert first["session_scope"] == "connection" and first["relevance_level"] == "PRECISE"
    assert second["relevance_level"] == "DEDUPED" and DOC in [
        d["doc_key"] for d in second["already_in_context"]
    ]


async def test_stdio_on_the_sessionless_protocol_still_has_connection_memory(
    server_env: dict[str, str],
) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "server", "serve"], env=server_env, cwd=str(ROOT)
    )
    with anyio.fail_after(120):
        async with Client(params) as client:
            assert client.protocol_version == "2026-07-28"
            first, second = await _call(client), await _call(client)
    assert first["session_scope"] == "connection"
    assert second["relevance_level"] == "DEDUPED"


async def test_streamable_http_sessions_are_isolated(server_env: dict[str, str]) -> None:
    with http_server(server_env) as (port, _proc), anyio.fail_after(120):
        url = f"http://127.0.0.1:{port}/mcp"
        async with Client(url, mode="legacy") as a, Client(url, mode="legacy") as b:
            await _session_pair(a, b)
            assert (await _call(b))["session_scope"] == "mcp-session"


async def test_streamable_http_without_a_session_turns_memory_off_unless_a_key_is_given(
    server_env: dict[str, str],
) -> None:
    with http_server(server_env) as (port, _proc), anyio.fail_after(120):
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:  # 2026-07-28: no MCP session
            plain = [await _call(client), await _call(client)]
            keyed = [await _call(client, session_id="host-key"), await _call(client, session_id="host-key")]
    assert [r["session_scope"] for r in plain] == ["none", "none"]
    assert [r["relevance_level"] for r in plain] == ["PRECISE", "PRECISE"]
    assert [r["relevance_level"] for r in keyed] == ["PRECISE", "DEDUPED"]
    assert keyed[0]["session_scope"] == "explicit"


async def test_sse_sessions_are_isolated(server_env: dict[str, str]) -> None:
    with http_server(server_env, transport="sse") as (port, _proc), anyio.fail_after(120):
        url = f"http://127.0.0.1:{port}/sse"
        async with Client(sse_client(url), mode="legacy") as a, Client(sse_client(url), mode="legacy") as b:
            await _session_pair(a, b)
            assert (await _call(b))["session_scope"] == "mcp-session"


def test_server_subprocess_writes_nothing_but_protocol_to_stdout(
    server_env: dict[str, str], tmp_path: Path
) -> None:
    import json
    import subprocess

    requests = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"},
            },
        },
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "lookup_knowledge", "arguments": {"query": QUERY}},
        },
    ]
    stdin = "".join(json.dumps(r) + "\n" for r in requests)
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "serve"],
        env=server_env,
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(stdin)
    proc.stdin.flush()
    lines = [proc.stdout.readline(), proc.stdout.readline()]
    proc.stdin.close()
    proc.wait(timeout=60)
    messages = [json.loads(line) for line in lines]
    assert [m["id"] for m in messages] == [1, 2]
    assert messages[1]["result"]["structuredContent"]["relevance_level"] == "PRECISE"
    assert proc.stdout.read() == ""
