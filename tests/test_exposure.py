"""What a client can send and learn (issue 34, weak 8): the stdio line cap, an unknown document
resource, no data-directory path in answers, and proxy headers counted as remote.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types.jsonrpc import INVALID_PARAMS, INVALID_REQUEST

from server.protocol.session import SessionKeyError
from tests.test_isolation import _resolve
from tests.wire import RawSession, StdioPeer, private_data_dir, served_http, server_env

GOOD_QUERY = "ERR_TIMEOUT 是什么"
PROXIED_PEER = "a client behind a proxy"  # server.transport.http_security.PROXIED_PEER


@pytest.mark.slow
def test_a_stdio_line_over_the_cap_is_refused_unparsed_and_the_next_line_is_served(
    tmp_path: Path, sample_template: Path
) -> None:
    peer = StdioPeer(server_env(private_data_dir(sample_template, tmp_path / "data")), tmp_path / "stderr")
    try:
        assert "result" in peer.initialize()
        padded = {"jsonrpc": "2.0", "id": 5, "method": "ping", "params": {"_meta": {"pad": "x" * 2_000_000}}}
        peer.send_line(json.dumps(padded))
        refused = peer.receive(timeout=60)
        peer.send({"jsonrpc": "2.0", "id": 6, "method": "ping"})
        served = peer.receive(timeout=60)
    finally:
        peer.close()
    assert refused["error"]["code"] == INVALID_REQUEST
    assert refused["error"]["message"].startswith("Invalid request: the line is longer than 1000000 bytes")
    assert served == {"jsonrpc": "2.0", "id": 6, "result": {}}


async def test_reading_an_unknown_document_resource_is_a_not_found_error(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        with anyio.fail_after(120), pytest.raises(MCPError) as raised:
            await client.read_resource("knowledge://doc/no/such-doc.md")
    assert raised.value.error.code == INVALID_PARAMS  # the SDK's code for a resource not found; not -32603
    assert "no/such-doc.md" in raised.value.error.message


def test_a_request_naming_a_proxy_header_counts_as_remote_for_explicit_keys() -> None:
    with pytest.raises(SessionKeyError, match="refused from a client behind a proxy"):
        _resolve(headers={"x-session-id": "k"}, peer=PROXIED_PEER)
    assert (
        _resolve(headers={"x-session-id": "k"}, peer=PROXIED_PEER, principal="alice").key
        == "explicit@alice:k"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "proxy_header",
    [{"Forwarded": "for=203.0.113.9"}, {"X-Forwarded-For": "203.0.113.9"}, {"X-Real-IP": "203.0.113.9"}],
    ids=["forwarded", "x-forwarded-for", "x-real-ip"],
)
def test_behind_a_same_host_proxy_explicit_keys_without_auth_are_refused(
    tmp_path: Path, sample_template: Path, proxy_header: dict[str, str]
) -> None:
    env = server_env(private_data_dir(sample_template, tmp_path / "data"))
    with served_http(env, tmp_path / "logs") as served:
        proxied = RawSession(served.url, headers={"X-Session-Id": "user-1", **proxy_header})
        refused = proxied.call_tool("lookup_knowledge", {"query": GOOD_QUERY})["result"]
        direct = RawSession(served.url, headers={"X-Session-Id": "user-1"})
        answered = direct.call_tool("lookup_knowledge", {"query": GOOD_QUERY})["result"]
    assert refused["isError"] is True
    assert "refused from a client behind a proxy" in refused["content"][0]["text"]
    assert answered["structuredContent"]["session_scope"] == "explicit"
