"""The SQLite invocation log on a real file: migrations, rows, failure handling, action memory."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from storage import call_write, log_retention
from storage.invocation_log import InvocationLog
from storage.invocation_record import InvocationRecord, hash_text
from storage.log_retention import Retention, wal_bytes
from storage.schema import SchemaVersionError, latest_version, migrate
from tests.helpers import loop_ticks

DETAILS = {
    "l0_titles": ["ERR_TIMEOUT 请求超时"],
    "l0_match_count": 1,
    "l1_scores": [0.912, 0.874],
    "l1_top_score": 0.912,
    "l1_top_similarity": 0.912,
    "relevance_level": "PRECISE",
    "completeness_hint": "exact match",
    "retrieved_domains": ["error-codes"],
    "dedup_reason": None,
    "embedder": "e5-small",
    "thresholds": {"highly_relevant": 0.896, "reference": 0.886},
}


def make_record(**changes: Any) -> InvocationRecord:
    base = InvocationRecord(
        ts=time.time(),
        session_key="s1",
        session_scope="connection",
        tool_name="lookup_knowledge",
        query="ERR_TIMEOUT 是什么",
        domain_filter=None,
        missing_dimension=None,
        relevance_level="PRECISE",
        dedup_reason=None,
        completeness_hint="exact match",
        water_level="LOW",
        next_call="ALLOW",
        call_index=1,
        result_doc_keys=["error-codes/err-timeout.md"],
        retrieval_details=DETAILS,
        latency_ms=12.5,
        error=None,
    )
    return replace(base, **changes)


def rows(path: Path, sql: str = "SELECT * FROM tool_invocation ORDER BY id") -> list[sqlite3.Row]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["FULL", "NORMAL"])
async def log(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """A log whose commits sync or do not (the server's setting: WAL writes to the page cache)."""
    opened = await InvocationLog.open(tmp_path / "log.sqlite", log_queries=True, synchronous=request.param)
    yield opened
    await opened.close()


async def log_thread(log: InvocationLog) -> threading.Thread:
    """The thread the log's statements run on (aiosqlite's), asked through a statement."""
    assert log._db is not None
    await log._db.create_function("thread_ident", 0, threading.get_ident)
    ((ident,),) = await log.execute_on_connection("SELECT thread_ident()")
    return next(thread for thread in threading.enumerate() if thread.ident == ident)


# -- migrations ------------------------------------------------------------------------------
def test_migrations_apply_on_an_empty_file_and_rerun_as_a_no_op(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    assert migrate(path) == latest_version()
    assert migrate(path) == latest_version()
    versions = [r["version"] for r in rows(path, "SELECT version FROM schema_version ORDER BY version")]
    assert versions == list(range(1, latest_version() + 1))
    tables = {r["name"] for r in rows(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"tool_invocation", "session_memory", "log_gap", "schema_version"} <= tables
    assert rows(path, "PRAGMA journal_mode")[0][0] == "wal"


async def test_migrations_upgrade_a_file_at_the_previous_version_and_keep_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    previous = latest_version() - 1
    assert migrate(path, target=previous) == previous
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(
            "INSERT INTO tool_invocation (ts, session_scope, tool_name, latency_ms) VALUES (1.0, 'none', 'old', 3.0)"
        )
    conn.close()

    log = await InvocationLog.open(path, log_queries=True)
    try:
        assert await log.record(make_record())
    finally:
        await log.close()
    assert [r["tool_name"] for r in rows(path)] == ["old", "lookup_knowledge"]
    assert rows(path, "SELECT MAX(version) FROM schema_version")[0][0] == latest_version()


async def test_a_log_newer_than_the_code_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite"
    migrate(path)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("INSERT INTO schema_version VALUES (99, 'future', 0)")
    conn.close()
    with pytest.raises(
        SchemaVersionError, match=r"log database .* is at schema version 99, newer than"
    ) as err:
        await InvocationLog.open(path, log_queries=True)
    assert f"(latest {latest_version()})" in str(err.value)


# -- rows ------------------------------------------------------------------------------------
async def test_a_record_fills_every_column_with_valid_json(log: InvocationLog) -> None:
    assert await log.record(make_record(domain_filter="error-codes", call_index=4))
    (row,) = rows(log.path)
    assert row["tool_name"] == "lookup_knowledge" and row["session_key"] == "s1"
    assert row["session_scope"] == "connection" and row["query"] == "ERR_TIMEOUT 是什么"
    assert row["domain_filter"] == "error-codes" and row["call_index"] == 4
    assert (row["relevance_level"], row["water_level"], row["next_call"]) == ("PRECISE", "LOW", "ALLOW")
    assert json.loads(row["result_doc_keys"]) == ["error-codes/err-timeout.md"]
    assert json.loads(row["retrieval_details"]) == DETAILS
    assert row["latency_ms"] == 12.5 and row["error"] is None


async def test_queries_are_stored_as_hashes_when_query_logging_is_off(tmp_path: Path) -> None:
    log = await InvocationLog.open(tmp_path / "log.sqlite", log_queries=False)
    try:
        await log.record(make_record(missing_dimension="重试策略"))
    finally:
        await log.close()
    (row,) = rows(log.path)
    assert row["query"] == hash_text("ERR_TIMEOUT 是什么") and row["query"].startswith("sha256:")
    assert len(row["query"]) == len("sha256:") + 16
    assert row["missing_dimension"] == hash_text("重试策略")


# -- failures --------------------------------------------------------------------------------
async def test_a_locked_log_fails_the_write_counts_it_and_the_next_call_retries(log: InvocationLog) -> None:
    assert await log.record(make_record(call_index=1))
    blocker = sqlite3.connect(log.path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with anyio.fail_after(5):
            assert await log.record(make_record(call_index=2)) is False
            assert await log.record(make_record(call_index=3)) is False
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert log.failures == 2 and "locked" in (log.last_error or "")

    assert await log.record(make_record(call_index=4))
    assert [r["call_index"] for r in rows(log.path)] == [1, 4]
    (gap,) = rows(log.path, "SELECT missed, last_error FROM log_gap")
    assert gap["missed"] == 2 and "locked" in gap["last_error"]


async def test_a_full_disk_fails_the_write_and_the_log_recovers_when_space_returns(
    log: InvocationLog,
) -> None:
    assert await log.record(make_record(call_index=1))
    # SQLite reports SQLITE_FULL ("database or disk is full") once the page cap is reached,
    # exactly as it does when the file system runs out of space. The cap is per connection:
    # it is set on the log's own.
    ((pages,),) = await log.execute_on_connection("PRAGMA page_count")
    await log.execute_on_connection(f"PRAGMA max_page_count = {pages}")
    big = {**DETAILS, "l0_titles": ["x" * 20_000]}
    assert await log.record(make_record(call_index=2, retrieval_details=big)) is False
    assert log.failures == 1 and "full" in (log.last_error or "")
    # Rolled back, not dropped: the same connection, still capped, writes the next row.
    assert await log.execute_on_connection("PRAGMA max_page_count") == [(pages,)]

    await log.execute_on_connection("PRAGMA max_page_count = 1073741823")
    assert await log.record(make_record(call_index=3))
    assert [r["call_index"] for r in rows(log.path)] == [1, 3]


def wal_commits(path: Path) -> int:
    """Commit frames in the write-ahead log: one per transaction since the WAL was started.

    Read from the file (SQLite's WAL format): a 32-byte header, then frames of a 24-byte header
    plus one page; a frame whose bytes 4..8 are non-zero ends a transaction. Frames left over
    from before a WAL restart carry other salts and are not counted.
    """
    data = Path(f"{path}-wal").read_bytes()
    page_size = int.from_bytes(data[8:12], "big")
    salts = data[16:24]
    commits = 0
    for offset in range(32, len(data) - 24 - page_size + 1, 24 + page_size):
        header = data[offset : offset + 24]
        if header[8:16] != salts:
            break
        commits += int.from_bytes(header[4:8], "big") != 0
    return commits


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
async def test_a_record_is_one_transaction_with_its_memory_and_gap_off_the_event_loop(
    tmp_path: Path, synchronous: Any
) -> None:
    """Row, gap and memory commit together, on the log's thread, which ends with close()."""
    log = await InvocationLog.open(tmp_path / "log.sqlite", log_queries=True, synchronous=synchronous)
    with anyio.fail_after(30):
        assert await log.record(make_record(call_index=1))
        # A missed row leaves a gap to write with the next one.
        blocker = sqlite3.connect(log.path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            assert await log.record(make_record(call_index=2)) is False
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        log.queue_memory("s1", session_memory())

        worker = await log_thread(log)
        assert worker is not threading.current_thread()
        commits = wal_commits(log.path)
        assert await log.record(make_record(call_index=3))
        assert wal_commits(log.path) == commits + 1
        assert [r["call_index"] for r in rows(log.path)] == [1, 3]
        assert [r["missed"] for r in rows(log.path, "SELECT missed FROM log_gap")] == [1]
        assert [r["session_key"] for r in rows(log.path, "SELECT session_key FROM session_memory")] == ["s1"]
        assert [key for key, _, _ in await log.load_memories(ttl_seconds=1800)] == ["s1"]

        await log.close()
        worker.join(timeout=5)
        assert not worker.is_alive()


async def test_a_call_cancelled_while_its_row_is_written_keeps_its_row_and_its_own_transaction(
    log: InvocationLog,
) -> None:
    """The caller's cancellation does not cut the transaction: no row lost, none committed late."""
    with anyio.fail_after(30):
        assert await log.record(make_record(call_index=1))
        log.queue_memory("s1", session_memory())
        commits = wal_commits(log.path)
        task = asyncio.create_task(log.record(make_record(call_index=2)))
        await asyncio.sleep(0)  # the write has started: its first statement is on the log's thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await log.record(make_record(call_index=3))
        assert [r["call_index"] for r in rows(log.path)] == [1, 2, 3]
        assert wal_commits(log.path) == commits + 2
        assert [r["session_key"] for r in rows(log.path, "SELECT session_key FROM session_memory")] == ["s1"]


async def test_a_row_and_one_state_written_as_one_statement_equal_the_statements_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The common write (one statement through call_write's trigger) stores what the general path does."""
    record, state = make_record(call_index=7, error="x" * 300), session_memory(3)
    written: dict[str, tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]] = {}
    for path in ("single", "general"):
        if path == "general":
            monkeypatch.setattr(call_write, "parameters", lambda row, memory: None)
        log = await InvocationLog.open(tmp_path / path / "log.sqlite", log_queries=True, clock=Clock())
        try:
            log.queue_memory("s1", state)
            commits = wal_commits(log.path)
            assert await log.record(record)
            assert wal_commits(log.path) == commits + 1
        finally:
            await log.close()
        written[path] = (
            [tuple(r) for r in rows(log.path)],
            [tuple(r) for r in rows(log.path, "SELECT * FROM session_memory")],
        )
    assert written["single"] == written["general"]
    assert written["single"][1] == [("s1", state, 1_800_000_000.0)]


async def test_a_state_that_cannot_be_stored_fails_its_row_in_the_same_statement(log: InvocationLog) -> None:
    """The trigger's upsert failing (the state is not JSON) takes the row with it; the next call recovers."""
    assert await log.record(make_record(call_index=1))
    log.queue_memory("s1", "not json")
    assert await log.record(make_record(call_index=2)) is False
    assert log.failures == 1 and "CHECK constraint" in (log.last_error or "")
    assert [r["call_index"] for r in rows(log.path)] == [1]
    log.queue_memory("s1", session_memory())  # a newer state replaces the one put back
    assert await log.record(make_record(call_index=3))
    assert [r["call_index"] for r in rows(log.path)] == [1, 3]
    assert [r["missed"] for r in rows(log.path, "SELECT missed FROM log_gap")] == [1]
    assert [json.loads(r["state"]) for r in rows(log.path, "SELECT state FROM session_memory")] == [
        json.loads(session_memory())
    ]


async def _record_while_locked(log: InvocationLog, call_index: int) -> int:
    """Record a row while another connection holds the write lock for 0.5 s; the loop's ticks meanwhile."""
    blocker = sqlite3.connect(log.path, isolation_level=None, check_same_thread=False)
    blocker.execute("BEGIN IMMEDIATE")
    release = threading.Timer(0.5, lambda: blocker.execute("ROLLBACK"))
    release.start()
    try:
        async with loop_ticks(0.01) as ticks:
            assert await log.record(make_record(call_index=call_index))
    finally:
        release.join()
        blocker.close()
    return ticks.count


async def test_a_write_that_must_wait_for_the_lock_waits_on_the_log_thread_not_the_event_loop(
    tmp_path: Path,
) -> None:
    """Another process holding the write lock: the row waits for it off the event loop, then lands."""
    log = await InvocationLog.open(
        tmp_path / "log.sqlite", log_queries=True, synchronous="NORMAL", busy_timeout_s=10.0
    )
    try:
        with anyio.fail_after(30):
            assert await log.record(make_record(call_index=1))
            # Waited on the thread: the loop kept running (a write waiting on the loop gets no tick).
            assert await _record_while_locked(log, 2) >= 10
            assert log.failures == 0
            assert [r["call_index"] for r in rows(log.path)] == [1, 2]
            # The connection waits with the configured timeout, for every row.
            assert await log.execute_on_connection("PRAGMA busy_timeout") == [(10_000,)]
            assert await log.record(make_record(call_index=3))
            assert await _record_while_locked(log, 4) >= 10
            assert [r["call_index"] for r in rows(log.path)] == [1, 2, 3, 4]
    finally:
        await log.close()


async def test_a_removed_log_file_is_recreated_and_later_rows_land_in_it(log: InvocationLog) -> None:
    assert await log.record(make_record(call_index=1))
    log.path.unlink()
    assert await log.record(make_record(call_index=2))
    assert log.reopens == 1 and log.failures == 0
    assert [r["call_index"] for r in rows(log.path)] == [2]


async def test_a_log_whose_directory_cannot_be_created_fails_without_raising(tmp_path: Path) -> None:
    log = await InvocationLog.open(tmp_path / "data" / "log.sqlite", log_queries=True)
    try:
        (tmp_path / "data" / "log.sqlite").unlink()
        # A file where the directory should be: neither the row nor a new log can be written.
        (tmp_path / "data").rename(tmp_path / "moved")
        (tmp_path / "data").write_text("not a directory")
        assert await log.record(make_record()) is False
        assert log.failures == 1
    finally:
        await log.close()


# -- action memory ---------------------------------------------------------------------------
def session_memory(calls: int = 2) -> str:
    """Storage keeps a session's memory as opaque JSON: any JSON text round-trips."""
    return json.dumps({"calls": calls, "documents": {"error-codes/err-timeout.md": ["c1"]}})


async def test_queued_memory_rides_in_the_next_row_and_restores_within_the_ttl(tmp_path: Path) -> None:
    clock = Clock()
    log = await InvocationLog.open(tmp_path / "log.sqlite", log_queries=True, clock=clock)
    try:
        log.queue_memory("s1", session_memory(calls=1))
        log.queue_memory("s1", session_memory(calls=2))  # only the latest state is kept
        log.queue_memory("s2", session_memory())
        assert rows(log.path, "SELECT * FROM session_memory") == []
        await log.record(make_record())
        assert len(rows(log.path, "SELECT * FROM session_memory")) == 2

        log.queue_memory("s2", None)  # forgotten (reset_session, TTL, eviction)
        await log.record(make_record())
        clock.now += 60
        restored = await log.load_memories(ttl_seconds=1800)
    finally:
        await log.close()
    ((key, state, age),) = restored
    assert key == "s1" and age == pytest.approx(60)
    assert state == session_memory(calls=2)


async def test_memory_older_than_the_ttl_is_not_restored_and_is_deleted(tmp_path: Path) -> None:
    clock = Clock()
    log = await InvocationLog.open(tmp_path / "log.sqlite", log_queries=True, clock=clock)
    try:
        log.queue_memory("old", session_memory())
        await log.record(make_record())
        clock.now += 1801
        assert await log.load_memories(ttl_seconds=1800) == []
    finally:
        await log.close()
    assert rows(log.path, "SELECT * FROM session_memory") == []


async def test_memory_queued_after_the_last_call_is_written_on_close(tmp_path: Path) -> None:
    log = await InvocationLog.open(tmp_path / "log.sqlite", log_queries=True)
    log.queue_memory("s1", session_memory())
    await log.close()
    assert [r["session_key"] for r in rows(log.path, "SELECT * FROM session_memory")] == ["s1"]


async def test_memory_of_a_failed_write_is_kept_for_the_next_one(log: InvocationLog) -> None:
    log.queue_memory("s1", session_memory())
    blocker = sqlite3.connect(log.path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        assert await log.record(make_record()) is False
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert await log.record(make_record())
    assert [r["session_key"] for r in rows(log.path, "SELECT * FROM session_memory")] == ["s1"]


# -- every tools/call is audited, also the ones no handler runs (issue 14, finding 3) -------------


@pytest.mark.parametrize(
    ("tool", "arguments", "error_fragment"),
    [
        ("lookup_knowledge", {"query": "x", "top_k": "3"}, "top_k"),
        ("lookup_knowledge", {"query": "x", "topk": 1}, "unknown argument(s) 'topk'"),
        ("no_such_tool", {"query": "x"}, "Unknown tool"),
        ("lookup_knowledge", {"query": "x" * 5000}, "at most 2000 characters"),
        ("lookup_knowledge", {"query": "x", "top_k": 3}, None),
    ],
    ids=["string top_k", "unknown argument", "unknown tool", "oversized query", "good call"],
)
async def test_every_tool_call_writes_exactly_one_row_even_when_no_handler_runs(
    make_server: Any, data_dir: Path, tool: str, arguments: dict[str, Any], error_fragment: str | None
) -> None:
    from mcp import Client

    server = make_server()
    with anyio.fail_after(120):
        async with Client(server, mode="legacy") as client:
            result = await client.call_tool(tool, arguments)
    assert result.is_error == (error_fragment is not None)
    logged = rows(data_dir / "log.sqlite")
    assert len(logged) == 1
    row = logged[0]
    assert row["tool_name"] == tool
    assert row["session_scope"] == "connection"
    if error_fragment is None:
        assert row["error"] is None
        return
    assert error_fragment in row["error"]
    # Only the logged fields, cut to the tool's own limits: no other raw argument is stored.
    assert row["query"] == arguments["query"][:2000]
    assert "topk" not in (row["retrieval_details"] or "")


async def test_a_call_with_oversized_meta_is_refused_and_logged_once(
    make_server: Any, data_dir: Path
) -> None:
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    server = make_server()
    with anyio.fail_after(120):
        async with Client(server, mode="legacy") as client:
            with pytest.raises(MCPError, match="_meta is too large"):
                await client.call_tool("lookup_knowledge", {"query": "x"}, meta={"pad": "y" * 20_000})
    logged = rows(data_dir / "log.sqlite")
    assert len(logged) == 1
    assert logged[0]["tool_name"] == "lookup_knowledge"
    assert logged[0]["error"].startswith("JSON-RPC error -32602: _meta is too large")


# -- issue 34, weak 6: retention, and a WAL that stays bounded ----------------------------------------

DAY = 86400.0


async def test_retention_deletes_old_rows_and_rows_beyond_max_rows_as_of_the_injected_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_retention, "BATCH", 2)  # several transactions per pass
    clock = Clock()
    log = await InvocationLog.open(
        tmp_path / "log.sqlite", log_queries=True, clock=clock, synchronous="NORMAL"
    )
    try:
        for age_days in (120, 100, 95, 10, 5, 1, 0):
            await log.record(make_record(ts=clock.now - age_days * DAY))
        clock.now += 0.5 * DAY  # the row 95 days old is now past 95.5
        log.queue_memory("old-session", session_memory())
        await log.record(make_record(ts=clock.now))
        clock.now += 2 * DAY
        pruned = await log.prune(Retention(days=90, max_rows=None, memory_ttl_s=DAY))
        assert (pruned.rows, pruned.memories) == (3, 1)
        assert len(rows(log.path)) == 5
        pruned = await log.prune(Retention(days=None, max_rows=2))
        assert pruned.rows == 3
        kept = rows(log.path)
        assert [row["ts"] for row in kept] == sorted(row["ts"] for row in kept)
        assert kept[-1]["ts"] == clock.now - 2 * DAY  # the newest rows are the ones kept
        assert rows(log.path, "SELECT * FROM session_memory") == []
        assert (await log.prune(Retention(days=None, max_rows=None))).rows == 0
    finally:
        await log.close()


# Checkpoints start at 1 MiB of WAL (storage.log_retention), and rows go on while one runs: the
# bound is journal_size_limit, 4 MiB. The previous code's WAL reached 36.5 MB in this run.
WAL_BOUND = log_retention.JOURNAL_SIZE_LIMIT_BYTES


async def test_the_wal_stays_below_a_bound_over_2000_calls_of_two_processes_sharing_the_log(
    tmp_path: Path,
) -> None:
    path = tmp_path / "log.sqlite"
    # Two logs on one file: as two server processes on a shared data directory.
    logs = [await InvocationLog.open(path, log_queries=True, synchronous="NORMAL") for _ in range(2)]
    largest = 0
    try:
        with anyio.fail_after(240):
            for call in range(2000):
                assert await logs[call % 2].record(make_record(call_index=call))
                # A server's event loop turns between calls (the lookup awaits its threads): the
                # background checkpoint runs then. At most 1,000 rows/s, ten times the capacity of
                # a server on two cores (docs/reliability.md).
                await asyncio.sleep(0.001)
                largest = max(largest, wal_bytes(path))
    finally:
        for log in logs:
            await log.close()
    assert len(rows(path)) == 2000
    assert largest < WAL_BOUND, f"the WAL reached {largest} bytes"


async def test_rows_are_written_while_a_checkpoint_finds_a_reader_of_an_older_snapshot(
    tmp_path: Path,
) -> None:
    """A reader in another process (a console page over a large log) holds an old snapshot while a
    checkpoint runs: the checkpoint gives up instead of holding the write lock until the reader
    ends, the rows written meanwhile land, and a later checkpoint empties the WAL."""
    log = await InvocationLog.open(tmp_path / "log.sqlite", log_queries=True, synchronous="NORMAL")
    reader = sqlite3.connect(log.path, isolation_level=None, check_same_thread=False)
    try:
        with anyio.fail_after(60):
            for call in range(20):
                assert await log.record(make_record(call_index=call))
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM tool_invocation").fetchall()  # the snapshot is held
            assert await log.record(make_record(call_index=20))  # frames past the reader's snapshot
            checkpoint = asyncio.create_task(log_retention.checkpoint(log.path))
            # While a checkpoint that waited for the reader would still hold the lock (the writers
            # give a row up after WRITE_BUSY_TIMEOUT_S), rows are written one after another.
            for call in range(21, 31):
                assert await log.record(make_record(call_index=call))
                await asyncio.sleep(log_retention.WRITE_BUSY_TIMEOUT_S / 4)
            assert await checkpoint is False
            assert log.failures == 0 and wal_bytes(log.path) > 0  # the reader kept the WAL
            reader.execute("COMMIT")
            assert await log_retention.checkpoint(log.path) is True
            assert wal_bytes(log.path) == 0
    finally:
        reader.close()
        await log.close()
    assert [r["call_index"] for r in rows(log.path)] == list(range(31))


async def test_a_checkpoint_kept_from_emptying_the_wal_is_retried_after_a_pause_not_after_each_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the WAL's size threshold every commit would start a checkpoint; while a reader holds an
    old snapshot none of them can empty it, so the next one waits CHECKPOINT_RETRY_S."""
    monkeypatch.setattr(log_retention, "CHECKPOINT_WAL_BYTES", 64 * 1024)
    started: list[float] = []
    checkpoint = log_retention.checkpoint

    async def counted(path: Path) -> bool:
        started.append(time.monotonic())
        return await checkpoint(path)

    monkeypatch.setattr(log_retention, "checkpoint", counted)
    log = await InvocationLog.open(tmp_path / "log.sqlite", log_queries=True, synchronous="NORMAL")
    reader = sqlite3.connect(log.path, isolation_level=None, check_same_thread=False)
    try:
        with anyio.fail_after(60):
            assert await log.record(make_record(call_index=0))
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM tool_invocation").fetchall()  # the snapshot is held
            began = time.monotonic()
            for call in range(1, 121):
                assert await log.record(make_record(call_index=call, query="x" * 4000))
                await asyncio.sleep(0.001)  # the background checkpoint runs between calls
            elapsed = time.monotonic() - began
            assert wal_bytes(log.path) >= log_retention.CHECKPOINT_WAL_BYTES  # the reader kept it
    finally:
        reader.close()
        await log.close()
    allowed = 1 + int(elapsed / log_retention.CHECKPOINT_RETRY_S)
    assert 1 <= len(started) <= allowed, f"{len(started)} checkpoints in {elapsed:.2f} s"


async def test_a_server_applies_retention_in_the_background(make_server: Any, data_dir: Path) -> None:
    from mcp import Client

    server = make_server(overrides={"log": {"enabled": True, "max_rows": 2, "maintenance_interval_s": 0.05}})
    async with Client(server, mode="legacy") as client:
        with anyio.fail_after(120):
            for _ in range(6):
                await client.call_tool("reset_session", {})
            while len(rows(data_dir / "log.sqlite")) > 2:
                await anyio.sleep(0.05)
    assert len(rows(data_dir / "log.sqlite")) <= 2
