"""Parallel calls of one session are ordered: memory, dedup, calls_used and call_index as if sequential.

Agents issue tool calls in parallel, and the SDK runs the requests of one session concurrently.
Each transport is tested: in-process, a stdio subprocess and streamable HTTP on loopback.
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters

from tests.helpers import ROOT, http_server

N = 10
IDENTICAL = "ERR_TIMEOUT 是什么"
DIFFERENT = [
    "ERR_TIMEOUT 是什么",
    "数据库连接池怎么配置",
    "how do partners rotate their API keys",
    "webhook 签名怎么校验",
    "how do I read a Java stack trace",
    "慢查询怎么排查",
    "redis 缓存淘汰策略",
    "what is the on-call rotation",
    "how many days do I have to file an expense claim",
    "cursor pagination page size limit",
]


async def _parallel(
    client: Client, queries: list[str], meta: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []

    async def one(query: str) -> None:
        result = await client.call_tool("lookup_knowledge", {"query": query}, meta=meta)
        assert not result.is_error, result.content
        results.append(result.structured_content or {})

    with anyio.fail_after(180):
        async with anyio.create_task_group() as tg:
            for query in queries:
                tg.start_soon(one, query)
    return results


def _passages(results: list[dict[str, Any]]) -> list[str]:
    documents = [d for r in results for d in ([r["primary"]] if r["primary"] else []) + r["supplement"]]
    return [f"{d['doc_key']}#{s}" for d in documents for s in d["sections"] or [""]]


def _call_indexes(data_dir: Path, scope: str) -> list[int]:
    with sqlite3.connect(data_dir / "log.sqlite") as db:
        rows = db.execute(
            "SELECT call_index FROM tool_invocation WHERE tool_name = 'lookup_knowledge' AND session_scope = ?"
            " ORDER BY id",
            (scope,),
        ).fetchall()
    return [r[0] for r in rows]


def _check_identical(results: list[dict[str, Any]], data_dir: Path) -> None:
    scope = results[0]["session_scope"]
    delivered = [r for r in results if r["found"]]
    assert len(delivered) == 1, [r["relevance_level"] for r in results]
    assert sorted(r["budget"]["calls_used"] for r in results) == list(range(1, N + 1))
    assert sorted(_call_indexes(data_dir, scope)) == list(range(1, N + 1))
    refused = [r for r in results if not r["found"]]
    assert all(r["relevance_level"] == "DEDUPED" for r in refused)
    assert all(
        "error-codes/err-timeout.md" in [d["doc_key"] for d in r["already_in_context"]] for r in refused
    )


def _check_different(results: list[dict[str, Any]], data_dir: Path) -> None:
    passages = _passages(results)
    assert len(passages) == len(set(passages)), "a passage was delivered twice"
    assert sorted(r["budget"]["calls_used"] for r in results) == list(range(1, N + 1))
    assert sorted(_call_indexes(data_dir, results[0]["session_scope"])) == list(range(1, N + 1))


async def test_parallel_identical_calls_in_process_deliver_the_document_once(
    make_server: Any, data_dir: Path
) -> None:
    async with Client(make_server(), mode="legacy") as client:
        results = await _parallel(client, [IDENTICAL] * N)
    _check_identical(results, data_dir)


async def test_parallel_different_calls_in_process_never_repeat_a_passage(
    make_server: Any, data_dir: Path
) -> None:
    async with Client(make_server(), mode="legacy") as client:
        results = await _parallel(client, DIFFERENT)
    _check_different(results, data_dir)


async def test_parallel_calls_of_different_sessions_stay_independent(make_server: Any) -> None:
    async with Client(make_server()) as client:
        first = await _parallel(client, [IDENTICAL] * 3, meta={"session_id": "one"})
        second = await _parallel(client, [IDENTICAL] * 3, meta={"session_id": "two"})
    assert sum(r["found"] for r in first) == 1 and sum(r["found"] for r in second) == 1


@pytest.mark.slow
async def test_parallel_calls_over_stdio_are_ordered(server_env: dict[str, str], data_dir: Path) -> None:
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "server", "serve"], env=server_env, cwd=str(ROOT)
    )
    with anyio.fail_after(240):
        async with Client(params, mode="legacy") as client:
            identical = await _parallel(client, [IDENTICAL] * N)
    _check_identical(identical, data_dir)


@pytest.mark.slow
async def test_parallel_calls_over_streamable_http_are_ordered(
    server_env: dict[str, str], data_dir: Path
) -> None:
    with http_server(server_env) as (port, _proc), anyio.fail_after(240):
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
            identical = await _parallel(client, [IDENTICAL] * N)
        async with Client(f"http://127.0.0.1:{port}/mcp") as client:  # explicit key, no MCP session
            different = await _parallel(client, DIFFERENT, meta={"session_id": "agent-7"})
    _check_identical(identical, data_dir)
    _check_different(different, data_dir)
