"""Hypothesis over raw JSON-RPC frames POSTed to the streamable-HTTP endpoint of a real server.

Invariants (issue 14, item 10; docs/reliability.md, Security):
- the server keeps serving: no 5xx, the process stays up, and a valid lookup works after;
- the invocation log stays consistent: every ``tools/call`` request that the MCP layer
  answered (a JSON-RPC result or error carrying the request's id) wrote exactly one
  ``tool_invocation`` row, and nothing else wrote any. Frames the transport refuses before
  the MCP layer (not JSON, not a JSON-RPC message) write none.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.wire import RawSession, Served, private_data_dir, served_http, server_env

pytestmark = pytest.mark.slow

BOUND_S = 300.0
GOOD_QUERY = "ERR_TIMEOUT 是什么"

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["\ud800", "\x00", "a" * 3000, "../../etc/passwd", '" or 1==1 or "']),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)
request_ids = st.one_of(st.integers(min_value=1, max_value=10**9), st.text(min_size=1, max_size=12))
arguments = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "query": st.text(max_size=120) | values,
            "top_k": st.integers(min_value=-3, max_value=30) | values,
            "domain": st.sampled_from(["api", "error-codes", "nope"]) | values,
            "missing_dimension": st.text(max_size=60) | values,
            "topk": values,
        },
    ),
    values,
)
tool_calls = st.builds(
    lambda rid, name, args, meta: {
        "jsonrpc": "2.0",
        "id": rid,
        "method": "tools/call",
        "params": {"name": name, "arguments": args, **({"_meta": meta} if meta is not None else {})},
    },
    request_ids,
    st.sampled_from(["lookup_knowledge", "reset_session", "list_knowledge_domains", "nope"]) | values,
    arguments,
    st.none() | st.dictionaries(st.sampled_from(["session_id", "progressToken", "x"]), values, max_size=2),
)
other_requests = st.builds(
    lambda version, rid, method, params: {"jsonrpc": version, "id": rid, "method": method, "params": params},
    st.sampled_from(["2.0", "2.0", "1.0"]),
    request_ids | values,
    st.sampled_from(["ping", "tools/list", "resources/read", "prompts/get", "tools/call", "x/y"]) | st.text(),
    values,
)
frames = st.one_of(
    tool_calls,
    other_requests,
    st.lists(tool_calls, min_size=1, max_size=3),
    st.binary(max_size=200),
    values,
)


def tool_rows(data_dir: Path) -> int:
    with sqlite3.connect(f"file:{data_dir / 'log.sqlite'}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT COUNT(*) FROM tool_invocation").fetchone()[0])


def answered_tool_calls(frame: Any, replies: list[dict[str, Any]]) -> int:
    """The tools/call requests of a frame that got a JSON-RPC answer with their id."""
    requests = frame if isinstance(frame, list) else [frame]
    answered_ids = [r.get("id") for r in replies if isinstance(r, dict) and ("result" in r or "error" in r)]
    return sum(
        1
        for request in requests
        if isinstance(request, dict)
        and request.get("method") == "tools/call"
        and request.get("id") is not None
        and request["id"] in answered_ids
    )


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[tuple[Served, Path]]:
    base = tmp_path_factory.mktemp("fuzz")
    data_dir = private_data_dir(sample_template, base / "data")
    with served_http(server_env(data_dir), base / "logs") as served:
        yield served, data_dir


def test_random_json_rpc_frames_leave_the_server_serving_and_the_log_consistent(
    fuzzed: tuple[Served, Path],
) -> None:
    served, data_dir = fuzzed
    session = RawSession(served.url)
    expected = {"rows": tool_rows(data_dir)}

    @settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(frame=frames)
    def check(frame: Any) -> None:
        body = frame if isinstance(frame, bytes) else json.dumps(frame).encode()
        reply = session.send(body)
        assert reply.status < 500, (reply.status, reply.text[:300])
        assert served.proc.poll() is None, "the server exited"
        expected["rows"] += answered_tool_calls(frame, reply.messages()) if reply.status == 200 else 0
        assert tool_rows(data_dir) == expected["rows"], (frame, reply.status, reply.text[:300])

    async def run() -> None:
        with anyio.fail_after(BOUND_S):
            await anyio.to_thread.run_sync(check, abandon_on_cancel=True)

    anyio.run(run)
    # Still serving: a fresh session gets a real answer, and its call is logged.
    answer = RawSession(served.url).call_tool("lookup_knowledge", {"query": GOOD_QUERY})
    assert answer["result"]["structuredContent"]["relevance_level"] == "PRECISE"
    assert tool_rows(data_dir) == expected["rows"] + 1
