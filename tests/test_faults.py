"""Faults: a killed ingest, a locked or deleted log, Milvus down or failing, a failing model, a restart.

Each test breaks one thing and checks that nothing is lost, the failure is reported where it
belongs (an ``isError`` result, a clear start-up error, a counted log failure) and the next
request is served.
"""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from mcp import Client
from pymilvus.exceptions import MilvusException

from retrieval.embedders import EmbedderError
from tests.helpers import CLI, ROOT, WrappedEmbedder, free_port, stop
from tests.wire import RawSession, post, private_data_dir, served_http, server_env

GOOD_QUERY = "ERR_TIMEOUT 是什么"
GOOD_DOC = "error-codes/err-timeout.md"


async def _lookup(client: Client, query: str, **meta: Any) -> Any:
    with anyio.fail_after(120):
        return await client.call_tool("lookup_knowledge", {"query": query}, meta=meta or None)


# -- kill -9 during ingest -------------------------------------------------------------------------


def _write_knowledge_base(root: Path, count: int) -> Path:
    for i in range(count):
        domain = ("alpha", "beta", "gamma")[i % 3]
        (root / domain).mkdir(parents=True, exist_ok=True)
        (root / domain / f"note-{i:03d}.md").write_text(
            f"---\ntitle: Service note {i}\nkeywords: [NOTE_{i:03d}]\n---\n# Service note {i}\n\n"
            f"Service {i} answers requests for team {i % 7}. It retries {i % 5} times and times out "
            f"after {100 + i} ms. On-call rotation {i % 4} owns it; dashboards live under /svc/{i}.\n",
            encoding="utf-8",
        )
    return root


def _catalog_progress(data_dir: Path) -> tuple[int, int]:
    """(visible documents, pending documents) of the one catalog in data_dir, or (0, 0)."""
    catalogs = list((data_dir / "catalog").glob("*.sqlite"))
    if not catalogs:
        return 0, 0
    try:
        with sqlite3.connect(f"file:{catalogs[0]}?mode=ro", uri=True, timeout=0.2) as db:
            documents = db.execute("SELECT COUNT(*) FROM documents").fetchone()[0]
            pending = db.execute("SELECT COUNT(*) FROM pending").fetchone()[0]
    except sqlite3.OperationalError:  # created but not yet migrated, or busy
        return 0, 0
    return int(documents), int(pending)


def _kill_midway(ingest: Sequence[str], env: dict[str, str], data_dir: Path) -> tuple[int, int]:
    """Run the ingest, SIGKILL it once a document is pending: (documents, pending) after its death."""
    proc = subprocess.Popen(ingest, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        documents, pending = _catalog_progress(data_dir)
        if documents >= 4 and pending > 0:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"ingest was not killed mid-way (exit {proc.returncode})"
    return _catalog_progress(data_dir)


@pytest.mark.slow
def test_ingest_killed_with_sigkill_midway_is_completed_by_the_next_run_without_duplicates(
    tmp_path: Path, e5_embedder: Any
) -> None:
    from server.config.loading import load_settings
    from server.container import chunking_rule, open_runtime
    from storage.discovery import discover
    from storage.documents import load_document

    total = 60
    kb = _write_knowledge_base(tmp_path / "kb", total)
    data_dir = tmp_path / "data"
    env = server_env(data_dir, LOOKUP_KNOWLEDGE_EMBEDDER__BATCH_SIZE="1")  # commits every 4 chunks
    ingest = [*CLI, "ingest", str(kb)]

    # The kill must leave a document pending. Seen pending, the ingest can still commit it in the
    # moment before the signal lands (more likely on a loaded machine): then the run is killed
    # between two documents, and it is started and killed again, on the same data directory.
    killed_at = (0, 0)
    for _attempt in range(5):
        killed_at = _kill_midway(ingest, env, data_dir)
        if killed_at[1] > 0:
            break
    assert killed_at[1] > 0, f"no kill left a document pending (last: {killed_at})"
    assert 4 <= killed_at[0] < total

    rerun = subprocess.run(ingest, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "failed 0" in rerun.stdout
    assert "repaired" in rerun.stdout  # the killed run had left documents pending

    settings = load_settings(None, data_dir=data_dir)
    runtime = open_runtime(settings, embedder=e5_embedder)
    try:
        expected = {
            doc.doc_key: doc
            for doc in (
                load_document(c, rule=chunking_rule(settings, runtime.embedder)) for c in discover(kb)
            )
        }
        entries = {entry.doc_key: entry for entry in runtime.catalog.entries()}
        assert set(entries) == set(expected), "missing or extra documents"
        for key, doc in expected.items():
            assert entries[key].content_hash == doc.content_hash
            # Exactly the chunks of the visible version: no duplicates, no chunks of a killed write.
            assert runtime.store.chunk_ids(key) == sorted(runtime.catalog.chunk_ids(key))
            assert len(runtime.store.chunk_ids(key)) == len(doc.chunks)
        assert runtime.store.count() == sum(len(doc.chunks) for doc in expected.values())
        assert runtime.catalog.pending() == {}
        assert not runtime.ingestor().run(kb).changed
    finally:
        runtime.close()


# -- the SQLite log locked or deleted while serving --------------------------------------------------


async def _stats(client: Client) -> dict[str, Any]:
    contents = (await client.read_resource("knowledge://stats")).contents
    return json.loads(contents[0].text)  # type: ignore[union-attr]


def _rows(log_path: Path) -> int:
    with sqlite3.connect(f"file:{log_path}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT COUNT(*) FROM tool_invocation").fetchone()[0])


async def test_lookups_are_answered_while_the_log_is_locked_and_the_log_recovers(
    make_server: Any, data_dir: Path
) -> None:
    log_path = data_dir / "log.sqlite"
    async with Client(make_server(), mode="legacy") as client:
        assert not (await _lookup(client, GOOD_QUERY)).is_error
        rows_before = _rows(log_path)

        locker = sqlite3.connect(log_path, isolation_level=None, timeout=5)
        locker.execute("BEGIN EXCLUSIVE")
        try:
            during = [await _lookup(client, q) for q in ("redis cluster failover", "分页游标怎么用")]
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        assert all(not r.is_error for r in during)
        assert (await _stats(client))["log"]["write_failures"] == 2

        assert not (await _lookup(client, "webhook retries")).is_error
    assert _rows(log_path) == rows_before + 1
    with sqlite3.connect(log_path) as db:
        assert db.execute("SELECT SUM(missed) FROM log_gap").fetchone()[0] == 2


async def test_lookups_are_answered_when_the_log_file_is_deleted_and_it_is_recreated(
    make_server: Any, data_dir: Path
) -> None:
    log_path = data_dir / "log.sqlite"
    async with Client(make_server(), mode="legacy") as client:
        assert not (await _lookup(client, GOOD_QUERY)).is_error
        for suffix in ("", "-wal", "-shm"):
            Path(f"{log_path}{suffix}").unlink(missing_ok=True)
        after = await _lookup(client, "redis cluster failover")
        assert not after.is_error
        assert (await _stats(client))["log"]["reopens"] == 1
    assert log_path.exists()
    with sqlite3.connect(log_path) as db:
        queries = [
            row[0]
            for row in db.execute("SELECT query FROM tool_invocation WHERE tool_name = 'lookup_knowledge'")
        ]
    assert queries == ["redis cluster failover"]


# -- Milvus unreachable at start, or failing mid-request ------------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections and never answers, like a hung server."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["streamable-http", "stdio"])
@pytest.mark.parametrize("peer", ["refusing", "silent"])
def test_unreachable_milvus_stops_serve_with_a_clear_error_within_the_timeout(
    tmp_path: Path, transport: str, peer: str, silent_port: int
) -> None:
    port = free_port() if peer == "refusing" else silent_port
    uri = f"http://127.0.0.1:{port}"
    env = server_env(
        tmp_path / "data", LOOKUP_KNOWLEDGE_MILVUS__URI=uri, LOOKUP_KNOWLEDGE_MILVUS__TIMEOUT_S="2"
    )
    http_port = free_port()
    args = [*CLI, "serve", "--transport", transport, "--port", str(http_port)]
    started = time.monotonic()
    done = subprocess.run(
        args, env=env, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.PIPE, timeout=90
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 2
    assert f"error: cannot connect to Milvus at '{uri}' within 2s" in done.stderr
    assert "serving" not in done.stderr and done.stdout == ""
    # Interpreter start and imports take a few seconds on a busy machine; the connection itself is bounded by 2s.
    assert elapsed < 45


@pytest.mark.slow
def test_lookup_command_reports_an_unreachable_milvus_instead_of_hanging(
    tmp_path: Path, silent_port: int
) -> None:
    env = server_env(
        tmp_path / "data",
        LOOKUP_KNOWLEDGE_MILVUS__URI=f"http://127.0.0.1:{silent_port}",
        LOOKUP_KNOWLEDGE_MILVUS__TIMEOUT_S="2",
    )
    done = subprocess.run(
        [*CLI, "lookup", "timeout"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "error: cannot connect to Milvus at" in done.stderr


def _flaky_store(settings: Any, embedder: Any, failures: int) -> Any:
    from storage.vector_store import MilvusVectorStore, collection_name

    class FlakyStore(MilvusVectorStore):
        """A real store whose first searches fail as if the Milvus server had gone away."""

        remaining = failures

        def search(self, *args: Any, **kwargs: Any) -> Any:
            if FlakyStore.remaining > 0:
                FlakyStore.remaining -= 1
                raise MilvusException(code=2, message="Fail connecting to server on 127.0.0.1:19530")
            return super().search(*args, **kwargs)

    return FlakyStore(
        uri=settings.milvus_uri,
        token=None,
        collection=collection_name(settings.milvus.collection_prefix, embedder.name, embedder.dim),
        dim=embedder.dim,
        timeout_s=settings.milvus.timeout_s,
    )


async def test_milvus_failing_mid_request_is_a_tool_error_and_the_next_request_works(
    make_server: Any, make_settings: Any, e5_embedder: Any
) -> None:
    store = _flaky_store(make_settings(), e5_embedder, failures=1)
    async with Client(make_server(store=store), mode="legacy") as client:
        failed = await _lookup(client, "redis cluster failover")
        assert failed.is_error
        text = failed.content[0].text
        assert text.startswith("Error executing tool lookup_knowledge: ")
        assert "MilvusException" in text and "Fail connecting to server" in text
        retried = await _lookup(client, "redis cluster failover")
        assert not retried.is_error
        assert retried.structured_content["budget"]["calls_used"] == 1  # the failed call changed no memory
        assert (await _lookup(client, GOOD_QUERY)).structured_content["primary"]["doc_key"] == GOOD_DOC


class FlakyEmbedder(WrappedEmbedder):
    """The real model, except that its first query encodings raise."""

    def __init__(self, inner: Any, error: Exception, failures: int = 1) -> None:
        super().__init__(inner)
        self.error, self.remaining = error, failures

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        if self.remaining > 0:
            self.remaining -= 1
            raise self.error
        return super().embed_queries(texts)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            EmbedderError("the model failed to encode: out of memory"),
            "the model failed to encode: out of memory",
        ),
        (RuntimeError("onnx session crashed"), "RuntimeError: onnx session crashed"),
    ],
    ids=["embedder error", "unexpected exception"],
)
async def test_an_embedder_failure_is_a_tool_error_and_the_next_request_works(
    make_server: Any, e5_embedder: Any, error: Exception, expected: str
) -> None:
    embedder = FlakyEmbedder(e5_embedder.inner, error)
    async with Client(make_server(embedder=embedder), mode="legacy") as client:
        failed = await _lookup(client, "消息队列的重试策略")
        assert failed.is_error
        assert failed.content[0].text.startswith("Error executing tool lookup_knowledge: ")
        assert expected in failed.content[0].text
        answer = (await _lookup(client, GOOD_QUERY)).structured_content
        assert answer["primary"]["doc_key"] == GOOD_DOC and answer["budget"]["calls_used"] == 1


# -- restart mid-conversation ----------------------------------------------------------------------


def _stop(served: Any, how: str) -> None:
    if how == "kill -9":
        served.proc.kill()
        served.proc.wait(timeout=30)
    else:
        stop(served.proc)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["graceful stop", "kill -9"])
def test_a_restart_mid_conversation_does_not_hand_back_documents_the_session_already_has(
    tmp_path: Path, sample_template: Path, how: str
) -> None:
    data_dir = private_data_dir(sample_template, tmp_path / "data")
    env = server_env(data_dir)
    conversation = {"X-Session-Id": "conversation-42"}

    with served_http(env, tmp_path / "logs") as served:
        first = RawSession(served.url, headers=conversation).call_tool(
            "lookup_knowledge", {"query": GOOD_QUERY}
        )
        answer = first["result"]["structuredContent"]
        assert answer["primary"]["doc_key"] == GOOD_DOC and answer["session_scope"] == "explicit"
        old_mcp_session = RawSession(served.url)
        _stop(served, how)

    with served_http(env, tmp_path / "logs") as served:
        # MCP session ids live in the process: a client must initialize again after a restart.
        gone = post(
            served.url, {"jsonrpc": "2.0", "id": 1, "method": "ping"}, headers=old_mcp_session.headers
        )
        assert gone.status == 404
        again = RawSession(served.url, headers=conversation).call_tool(
            "lookup_knowledge", {"query": GOOD_QUERY}
        )
        answer = again["result"]["structuredContent"]
        assert answer["relevance_level"] == "DEDUPED" and answer["dedup_reason"] == "doc_retrieved"
        assert GOOD_DOC in [doc["doc_key"] for doc in answer["already_in_context"]]
        assert answer["budget"]["calls_used"] == 2
        assert answer["primary"] is None
        other = RawSession(served.url, headers={"X-Session-Id": "another-conversation"})
        assert other.call_tool("lookup_knowledge", {"query": GOOD_QUERY})["result"]["structuredContent"][
            "primary"
        ]


@pytest.mark.slow
def test_persisted_memory_older_than_the_ttl_is_not_restored(tmp_path: Path, sample_template: Path) -> None:
    data_dir = private_data_dir(sample_template, tmp_path / "data")
    env = server_env(data_dir)
    conversation = {"X-Session-Id": "conversation-idle"}
    with served_http(env, tmp_path / "logs") as served:
        RawSession(served.url, headers=conversation).call_tool("lookup_knowledge", {"query": GOOD_QUERY})
    # Age the stored state instead of waiting: it was last seen an hour ago, past the 30-minute TTL.
    with sqlite3.connect(data_dir / "log.sqlite") as db:
        aged = db.execute(
            "UPDATE session_memory SET last_seen = last_seen - 3600 WHERE session_key = ?",
            ("explicit:conversation-idle",),
        )
        assert aged.rowcount == 1
    with served_http(env, tmp_path / "logs") as served:
        answer = RawSession(served.url, headers=conversation).call_tool(
            "lookup_knowledge", {"query": GOOD_QUERY}
        )
    fresh = answer["result"]["structuredContent"]
    assert fresh["relevance_level"] == "PRECISE" and fresh["budget"]["calls_used"] == 1
