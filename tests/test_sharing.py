"""Several server processes on one data directory: all serve, a survivor takes over, a holder is named."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from storage import lite_share, lite_socket
from tests.helpers import CLI, ROOT, stop
from tests.milvus_target import target_env
from tests.wire import RawSession, StdioPeer, primary, served_http, server_env

pytestmark = pytest.mark.slow

QUERY = "ERR_TIMEOUT 是什么"
DOC = "error-codes/err-timeout.md"
LATER_QUERY = "Redis cluster failover"
LATER_DOC = "infrastructure/redis-cluster.md"
_ids = itertools.count(100)


def stdio_lookup(peer: StdioPeer, query: str, timeout: float = 120.0) -> dict[str, Any]:
    """One tools/call over a raw stdio peer; returns the JSON-RPC result."""
    request_id = next(_ids)
    peer.send(
        {
            "jsonrpc": "2.0",
            "id": request_id,
            "method": "tools/call",
            "params": {"name": "lookup_knowledge", "arguments": {"query": query}},
        }
    )
    while True:
        message = peer.receive(timeout=timeout)
        if message.get("id") == request_id:
            return message["result"]  # type: ignore[no-any-return]


@contextlib.contextmanager
def stdio_peer(env: dict[str, str], stderr: Path) -> Iterator[StdioPeer]:
    peer = StdioPeer(env, stderr)
    try:
        peer.initialize()
        yield peer
    finally:
        peer.close()


def test_two_stdio_servers_and_one_http_server_on_one_data_dir_answer_the_same_lookup(
    data_dir: Path, tmp_path: Path
) -> None:
    env = server_env(data_dir)
    with (
        stdio_peer(env, tmp_path / "a.err") as a,
        stdio_peer(env, tmp_path / "b.err") as b,
        served_http(env, tmp_path / "http") as http,
    ):
        session = RawSession(http.url)
        answers = {
            "stdio a": primary(stdio_lookup(a, QUERY)),
            "stdio b": primary(stdio_lookup(b, QUERY)),
            "http": primary(session.call_tool("lookup_knowledge", {"query": QUERY})["result"]),
        }
        assert answers == {"stdio a": DOC, "stdio b": DOC, "http": DOC}, (
            answers,
            (tmp_path / "a.err").read_text(errors="replace")[-2000:],
            (tmp_path / "b.err").read_text(errors="replace")[-2000:],
        )
        if target_env():
            return  # a Milvus server has no owning process to stop
        # The process that owns the Lite directory exits: the other two keep answering.
        lookups = {
            a.proc.pid: lambda query: stdio_lookup(a, query),
            b.proc.pid: lambda query: stdio_lookup(b, query),
            http.proc.pid: lambda query: session.call_tool("lookup_knowledge", {"query": query})["result"],
        }
        holder = lite_socket.lock_holder(data_dir / "milvus.db")
        assert holder in lookups, (holder, list(lookups))
        stop(next(p for p in (a.proc, b.proc, http.proc) if p.pid == holder))
        for pid, lookup in lookups.items():
            if pid != holder:
                assert primary(lookup(LATER_QUERY)) == LATER_DOC
        assert lite_socket.lock_holder(data_dir / "milvus.db") in set(lookups) - {holder}


@pytest.mark.lite_only
def test_a_holder_that_does_not_share_the_directory_stops_serve_naming_its_pid(data_dir: Path) -> None:
    lock = data_dir / "milvus.db" / lite_socket.LOCK_FILENAME
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held like an old version would, without a socket
        proc = subprocess.run(
            [*CLI, "serve"],
            env=server_env(data_dir, LOOKUP_KNOWLEDGE_MILVUS__TIMEOUT_S="2"),
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.close(fd)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("error: the Milvus Lite data at ")
    assert f"is held by PID {os.getpid()} " in errors[0]
    assert "stop that process, use another --data-dir, or set milvus.uri to a Milvus server" in errors[0]
    assert proc.stdout == ""


@pytest.mark.lite_only
def test_an_owner_that_exits_leaves_the_socket_of_the_survivor_that_took_over(tmp_path: Path) -> None:
    """The survivor can take the lock the moment the owner releases it; the owner must not then
    remove the socket file, which is by then the survivor's (a lost file is a lasting outage)."""
    db_path = tmp_path / "milvus.db"
    owner, survivor = lite_share._Share(db_path), lite_share._Share(db_path)
    owner.ensure(timeout_s=10)
    assert owner.owned
    survivor.ensure(timeout_s=10)
    assert not survivor.owned  # reached over the owner's socket
    db = owner._db
    close = db.close

    def close_then_survivor_takes_over() -> None:
        close()
        assert survivor._try_own()

    db.close = close_then_survivor_takes_over
    try:
        owner.disown()
        assert survivor.owned
        assert lite_socket.socket_answers(survivor.socket)
    finally:
        survivor.disown()


@pytest.mark.lite_only
def test_a_new_collection_on_the_shared_directory_logs_no_grpc_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """pymilvus asks the socket for a timestamp after create_index; the answer is "unimplemented",
    as from milvus_lite's own servicer, but with no ERROR traceback in the server's log."""
    from storage.vector_store import VECTOR_FIELD, MilvusVectorStore

    caplog.set_level(logging.WARNING)
    store = MilvusVectorStore(
        uri=str(tmp_path / "milvus.db"), token=None, collection="fresh", dim=8, timeout_s=30
    )
    try:
        store.ensure_collection()
        described = store._client.describe_index(store.collection, VECTOR_FIELD)
        assert described["state"] == "Finished" and described["index_type"] == "HNSW"
    finally:
        store.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


class _LostChannel:
    """Stands in for a client whose channel went with the old owner: its calls fail as pymilvus's do."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.calls = 0

    def list_collections(self) -> list[str]:
        self.calls += 1
        raise self.error

    def close(self) -> None:
        pass


def _owner_and_survivor(tmp_path: Path) -> tuple[lite_share._Share, lite_share.SharedLiteClient]:
    """One Milvus Lite file: the process that owns it, and another one's client through it."""
    db_path = tmp_path / "milvus.db"
    owner, survivor = lite_share._Share(db_path), lite_share._Share(db_path)
    owner.ensure(timeout_s=10)
    survivor.ensure(timeout_s=10)
    return owner, lite_share.SharedLiteClient(survivor, timeout_s=10)


@pytest.mark.lite_only
@pytest.mark.parametrize(
    ("code", "recovers"),
    [
        # What a survivor saw when another survivor had already taken over: the socket answered
        # again, so the lost channel was taken for the caller's error and the lookup failed.
        (2, True),  # Status.CONNECT_FAILED: "Fail connecting to server … server unavailable"
        (100, False),  # a failure over a working channel (collection not found) is the caller's
    ],
)
def test_a_survivor_retries_a_lost_channel_even_when_the_socket_answers_again(
    tmp_path: Path, code: int, recovers: bool
) -> None:
    from pymilvus.exceptions import MilvusException

    owner, client = _owner_and_survivor(tmp_path)
    lost = _LostChannel(MilvusException(code=code, message="failed"))
    real, client._client = client._client, lost
    try:
        if recovers:
            assert client.list_collections() == []
            assert lost.calls == 1 and client._client is not lost
        else:
            with pytest.raises(MilvusException, match="failed"):
                client.list_collections()
            assert lost.calls == 1 and client._client is lost
    finally:
        real.close()
        client._client.close()
        owner.disown()


class _Closable(_LostChannel):
    """A lost channel that, once closed, fails as a closed ``MilvusClient`` does."""

    def close(self) -> None:
        self.error = _closed_client_error()


def _closed_client_error() -> Exception:
    from pymilvus.exceptions import MilvusException

    return MilvusException(message="should create connection first")  # pymilvus: code 1, a closed client


@pytest.mark.lite_only
def test_a_survivor_whose_new_client_cannot_connect_yet_retries_until_it_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The new owner's socket may refuse the first client made on it: the survivor then tries again
    and never retries its call on the client it has closed ("should create connection first")."""
    from pymilvus.client.types import Status
    from pymilvus.exceptions import MilvusException

    owner, client = _owner_and_survivor(tmp_path)
    real = client._client
    lost = _Closable(MilvusException(code=Status.CONNECT_FAILED, message="failed"))
    client._client = lost
    made = [MilvusException(code=Status.CONNECT_FAILED, message="not yet"), real]

    def new_client() -> Any:
        next_client = made.pop(0)
        if isinstance(next_client, Exception):
            raise next_client
        return next_client

    monkeypatch.setattr(client, "_new_client", new_client)
    try:
        assert client.list_collections() == []
        assert made == [] and lost.calls == 1 and client._client is real
    finally:
        client._client.close()
        owner.disown()


@pytest.mark.lite_only
def test_a_call_on_a_client_another_thread_replaced_is_retried_on_the_replacement(tmp_path: Path) -> None:
    owner, client = _owner_and_survivor(tmp_path)
    real = client._client

    class Replaced(_LostChannel):
        """Closed by another thread's recovery, which put ``real`` in its place, before the call."""

        def list_collections(self) -> list[str]:
            client._client = real
            return super().list_collections()

    stale = Replaced(_closed_client_error())
    client._client = stale
    try:
        # The socket answers and the error is not a lost channel: only the replacement shows
        # that the failure was the closed client's, not the call's.
        assert client.list_collections() == []
        assert stale.calls == 1 and client._client is real
    finally:
        client._client.close()
        owner.disown()
