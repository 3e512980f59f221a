"""Load shedding (issue 34, weak 7): past retrieval.max_lookups_in_flight a lookup is refused at once.

A burst above the bound gets immediate, retryable busy errors that name the limit, and each is
logged; the calls within the bound complete. In-process, the admitted lookups are held inside
the embedder while the burst arrives, so "at once" is shown without timing anything: every
refusal is answered while the admitted calls are still held. Over streamable HTTP, a burst
against a bound of 1 gets answers only of the two kinds, within the client's timeout.
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.wire import INITIALIZE, post, private_data_dir, served_http, server_env

BOUND = 2
BURST = 8
BUSY = "server busy: "
# The SDK's prefix of every tool error, then the refusal.
BUSY_ERROR = "Error executing tool lookup_knowledge: " + BUSY
QUERIES = ["ERR_TIMEOUT 是什么", "webhook retries", "connection pool size", "on-call rotation"]


class GatedEmbedder:
    """The real embedder, but each query encoding waits for the gate to open."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.dim = inner.name, inner.dim
        self.gate = threading.Event()
        self.entered = 0
        self._lock = threading.Lock()

    def _held(self) -> None:
        with self._lock:
            self.entered += 1
        if not self.gate.wait(60):
            raise TimeoutError("the gate was never opened")

    def encode_query(self, text: str) -> Any:
        self._held()
        return self.inner.encode_query(text)

    def embed_query(self, text: str) -> Any:
        self._held()
        return self.inner.embed_query(text)

    def embed_queries(self, texts: Any) -> Any:
        self._held()
        return self.inner.embed_queries(texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def _lookup(client: Client, query: str) -> Any:
    # A session per call: the calls of one session run one at a time (tests/test_concurrency.py).
    key = hashlib.sha256(query.encode()).hexdigest()[:16]
    return await client.call_tool("lookup_knowledge", {"query": query}, meta={"session_id": key})


async def test_a_burst_above_the_bound_is_refused_at_once_and_the_admitted_calls_complete(
    make_server: Any, data_dir: Path, e5_embedder: Any
) -> None:
    embedder = GatedEmbedder(e5_embedder)
    overrides = {"retrieval": {"max_lookups_in_flight": BOUND}, "governance": {"enabled": False}}
    server = make_server(overrides=overrides, embedder=embedder)
    admitted: list[Any] = []
    async with Client(server, mode="legacy") as client:
        with anyio.fail_after(120):
            embedder.gate.set()
            assert not (await client.call_tool("lookup_knowledge", {"query": "warm-up"})).is_error
            embedder.gate.clear()
            before = embedder.entered
            async with anyio.create_task_group() as tg:

                async def lookup(query: str) -> None:
                    admitted.append(await _lookup(client, query))

                for query in QUERIES[:BOUND]:
                    tg.start_soon(lookup, query)
                while embedder.entered < before + BOUND:  # both admitted lookups are held in the embedder
                    await anyio.sleep(0.01)
                refused = [
                    await client.call_tool("lookup_knowledge", {"query": f"burst {i}"})
                    for i in range(BURST // 2)
                ]
                async with anyio.create_task_group() as burst:
                    for i in range(BURST // 2, BURST):

                        async def one(i: int = i) -> None:
                            refused.append(
                                await client.call_tool("lookup_knowledge", {"query": f"burst {i}"})
                            )

                        burst.start_soon(one)
                # Every refusal came back while the admitted lookups were still held.
                assert embedder.entered == before + BOUND and not admitted
                embedder.gate.set()
    assert len(refused) == BURST
    for result in refused:
        assert result.is_error
        text = result.content[0].text
        assert (
            text.startswith(BUSY_ERROR)
            and "retrieval.max_lookups_in_flight) is 2" in text
            and "retry" in text
        )
    assert len(admitted) == BOUND and not any(r.is_error for r in admitted)
    with sqlite3.connect(data_dir / "log.sqlite") as db:
        logged = db.execute(
            "SELECT COUNT(*) FROM tool_invocation WHERE tool_name = 'lookup_knowledge' AND error LIKE ?",
            (BUSY + "%",),
        ).fetchone()[0]
    assert logged == BURST


@pytest.mark.slow
def test_over_http_a_burst_gets_answers_or_busy_errors_and_never_a_queue(
    tmp_path: Path, sample_template: Path
) -> None:
    env = server_env(
        private_data_dir(sample_template, tmp_path / "data"),
        LOOKUP_KNOWLEDGE_RETRIEVAL__MAX_LOOKUPS_IN_FLIGHT="1",
        LOOKUP_KNOWLEDGE_GOVERNANCE__ENABLED="false",
    )
    headers = {"mcp-protocol-version": "2025-06-18"}
    with served_http(env, tmp_path / "logs", extra=["--stateless"]) as served:
        assert post(served.url, INITIALIZE, headers=headers).status == 200

        def call(i: int) -> dict[str, Any]:
            body = {"jsonrpc": "2.0", "id": i, "method": "tools/call"}
            body["params"] = {"name": "lookup_knowledge", "arguments": {"query": f"{QUERIES[i % 4]} {i}"}}
            # The stated bound on any one call's wait: the client gives up after 60 s.
            return post(served.url, body, headers=headers, timeout=60).message()["result"]

        with ThreadPoolExecutor(max_workers=24) as pool:
            results = list(pool.map(call, range(48)))
    busy = [r for r in results if r.get("isError")]
    assert busy, "48 concurrent lookups against a bound of 1 were all admitted"
    assert all(r["content"][0]["text"].startswith(BUSY_ERROR) for r in busy)
    answered = [r for r in results if not r.get("isError")]
    assert answered and all(r["structuredContent"]["relevance_level"] for r in answered)
