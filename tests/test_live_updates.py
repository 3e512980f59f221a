"""Live updates: an ingest or a watched folder changes what a running server answers, without a restart."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from server.watch import FolderWatcher, snapshot
from tests.conftest import SAMPLE_KB
from tests.helpers import CLI, ROOT, loop_ticks
from tests.wire import http_primary, served_http, server_env

pytestmark = pytest.mark.slow

NEW_DOC = "infrastructure/zebra-cache.md"
NEW_TEXT = (
    "---\ntitle: Zebra cache eviction\nkeywords: [ZEBRA_EVICT_42]\n---\n# Zebra cache\n\n"
    "ZEBRA_EVICT_42 is the error the zebra cache raises when it evicts a pinned entry.\n"
)
QUERY = "ZEBRA_EVICT_42"


def _found_within(url: str, seconds: float) -> float:
    """Seconds until the new document is the answer; fails after ``seconds``."""
    started = time.monotonic()
    while True:  # each attempt is bounded by the HTTP client's timeout
        if http_primary(url, QUERY) == NEW_DOC:
            return time.monotonic() - started
        assert time.monotonic() - started < seconds, f"{NEW_DOC} not served within {seconds}s"
        time.sleep(0.2)


def _kb_copy(target: Path) -> Path:
    shutil.copytree(SAMPLE_KB, target)
    return target


def test_ingest_while_a_server_serves_is_answered_by_that_server_within_5s(
    data_dir: Path, tmp_path: Path
) -> None:
    env = server_env(data_dir)
    kb = _kb_copy(tmp_path / "kb")
    with served_http(env, tmp_path / "logs") as served:
        assert http_primary(served.url, QUERY) != NEW_DOC  # warm, and not there yet
        (kb / NEW_DOC).write_text(NEW_TEXT, encoding="utf-8")
        ingest = subprocess.run(
            [*CLI, "ingest", str(kb)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert ingest.returncode == 0, ingest.stderr[-3000:]
        assert ingest.stdout.startswith("added 1, updated 0, deleted 0"), ingest.stdout
        _found_within(served.url, 5.0)
        assert served.proc.poll() is None


def test_watched_folder_is_ingested_after_a_write_and_bad_files_are_reported(
    data_dir: Path, tmp_path: Path
) -> None:
    env = server_env(data_dir, LOOKUP_KNOWLEDGE_WATCH__DEBOUNCE_S="0.5")
    kb = _kb_copy(tmp_path / "kb")
    with served_http(env, tmp_path / "logs", extra=["--watch", str(kb)]) as served:
        assert http_primary(served.url, QUERY) != NEW_DOC
        (kb / NEW_DOC).write_text(NEW_TEXT, encoding="utf-8")
        (kb / "broken.md").write_text("---\ntitle: [oops\n---\nx", encoding="utf-8")
        _found_within(served.url, 5.0)
        # The report is logged when the ingest returns, after its flush (~1 s on a Milvus server),
        # which is later than the catalog commit that made the document visible.
        deadline = time.monotonic() + 30
        while "failed 1" not in served.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        output = served.output()
    assert "failed: broken.md: broken YAML front matter" in output, output[-3000:]
    # The two writes may land in one ingest or, when the watcher's first ingest runs between
    # them, in two: either way the new document is added once and the bad file is reported.
    reports = [line for line in output.splitlines() if "server.watch: watch " in line]
    assert sum("added 1," in line for line in reports) == 1, output[-3000:]
    assert any("failed 1," in line for line in reports), output[-3000:]


async def test_a_burst_of_changes_becomes_one_ingest_after_the_quiet_period(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    root.mkdir()
    runs: list[dict[str, Any]] = []

    def ingest() -> Any:
        runs.append(snapshot(root))
        from retrieval.ingest import IngestReport

        return IngestReport()

    watcher = FolderWatcher(root, ingest, poll_s=0.05, debounce_s=0.4)
    with anyio.fail_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(watcher.run)
            while watcher.ingests < 1:  # the ingest at start
                await anyio.sleep(0.02)
            for i in range(5):  # five writes 0.1 s apart: one burst
                (root / f"doc{i}.md").write_text(f"# Doc {i}\n\nbody {i}\n")
                await anyio.sleep(0.1)
            while watcher.ingests < 2:
                await anyio.sleep(0.02)
            await anyio.sleep(0.8)  # no further change: no further ingest
            tg.cancel_scope.cancel()
    assert watcher.ingests == 2
    assert len(runs[1]) == 5


async def test_evidence_retrieved_for_a_view_holds_only_that_views_documents_after_an_ingest(
    make_resources: Any, tmp_path: Path
) -> None:
    """The service grades against the view it took; retrieval must use that view, not a newer one."""
    from mcp import Client

    from server.protocol.app import create_server
    from server.watch import watch_ingest

    resources = make_resources()
    with anyio.fail_after(120):
        async with Client(create_server(resources)) as client:
            await client.call_tool("lookup_knowledge", {"query": "ERR_TIMEOUT"}, meta={"session_id": "v1"})
            engine = resources.service.engine
            before = engine.view()
            kb = _kb_copy(tmp_path / "kb")
            (kb / NEW_DOC).write_text(NEW_TEXT, encoding="utf-8")
            await anyio.to_thread.run_sync(watch_ingest(resources.runtime, kb))

            def docs(evidence: Any) -> set[str]:
                return {h.doc_key for h in (*evidence.l0, *evidence.dense, *evidence.lexical)}

            old = engine.retrieve(QUERY, None, before)
            assert NEW_DOC not in docs(old)
            assert engine.cached_evidence(QUERY, None, before) is old
            current = engine.retrieve(QUERY, None)
            assert engine.view().generation != before.generation
            assert NEW_DOC in docs(current)


async def test_a_lookup_reads_the_catalog_generation_once_and_answers_from_the_view_it_checked(
    make_resources: Any,
) -> None:
    """The handler checks the view (is the knowledge base empty?) and the service answers from it."""
    from mcp import Client

    from server.protocol.app import create_server

    resources = make_resources()
    with anyio.fail_after(120):
        async with Client(create_server(resources)) as client:
            await client.call_tool("lookup_knowledge", {"query": "ERR_TIMEOUT"}, meta={"session_id": "g0"})
            catalog = resources.service.engine._catalog
            reads = 0
            generation = catalog.generation

            def counted() -> int:
                nonlocal reads
                reads += 1
                return generation()

            catalog.generation = counted
            try:
                result = await client.call_tool(
                    "lookup_knowledge", {"query": "rate limit"}, meta={"session_id": "g1"}
                )
            finally:
                del catalog.generation
    assert not result.is_error, result.content
    assert reads == 1


def test_a_view_is_one_committed_state_even_when_an_ingest_commits_while_it_loads(data_dir: Path) -> None:
    """Another process's commit between the view's reads must not mix two generations in it."""
    import contextlib
    import sqlite3

    from retrieval.engine import KnowledgeView
    from storage.catalog import Catalog

    (path,) = (data_dir / "catalog").glob("*.sqlite")
    catalog = Catalog(path)
    try:
        before = KnowledgeView.load(catalog)
        doc = sorted(before.entries)[0]
        read_entries = catalog.entries

        def entries_after_another_commit() -> Any:
            with contextlib.closing(sqlite3.connect(path, isolation_level=None, timeout=10)) as other:
                other.execute("BEGIN IMMEDIATE")
                other.execute("UPDATE documents SET title = 'Renamed meanwhile' WHERE doc_key = ?", (doc,))
                other.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation'")
                other.execute("COMMIT")
            return read_entries()

        catalog.entries = entries_after_another_commit
        try:
            view = KnowledgeView.load(catalog)
        finally:
            del catalog.entries
        # The view is the state it started reading: its generation and its documents agree.
        assert view.generation == before.generation
        assert view.entries[doc].title == before.entries[doc].title
        after = KnowledgeView.load(catalog)
        assert after.generation == before.generation + 1
        assert after.entries[doc].title == "Renamed meanwhile"
    finally:
        catalog.close()


async def test_a_reload_after_an_ingest_runs_off_the_event_loop_and_the_lookup_gets_the_new_view(
    make_resources: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reloading a view takes seconds at 100k chunks: other requests must go on meanwhile."""
    from mcp import Client

    from retrieval.engine import KnowledgeView
    from server.protocol.app import create_server
    from server.watch import watch_ingest

    resources = make_resources()
    with anyio.fail_after(120):
        async with Client(create_server(resources)) as client:
            await client.call_tool("lookup_knowledge", {"query": "ERR_TIMEOUT"}, meta={"session_id": "r0"})
            kb = _kb_copy(tmp_path / "kb")
            (kb / NEW_DOC).write_text(NEW_TEXT, encoding="utf-8")
            await anyio.to_thread.run_sync(watch_ingest(resources.runtime, kb))
            load = KnowledgeView.load

            def slow_load(catalog: Any) -> KnowledgeView:
                time.sleep(1.0)  # as slow as reloading a large knowledge base
                return load(catalog)

            monkeypatch.setattr(KnowledgeView, "load", staticmethod(slow_load))
            async with loop_ticks(0.02) as ticks:
                started = time.perf_counter()
                result = await client.call_tool(
                    "lookup_knowledge", {"query": QUERY}, meta={"session_id": "r1"}
                )
                elapsed = time.perf_counter() - started
    assert result.structured_content is not None, result.content
    # The lookup that found the catalog moved waited for the new view and answered from it...
    assert result.structured_content["primary"]["doc_key"] == NEW_DOC
    assert elapsed >= 1.0
    # ...while the event loop went on serving (at most 50 ticks fit in the 1 s reload).
    assert ticks.count >= 25, f"{ticks.count} ticks in {elapsed:.2f} s"


async def test_watching_another_knowledge_base_logs_the_refusal_and_keeps_the_index(
    data_dir: Path, e5_embedder: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from server.config.loading import load_settings
    from server.container import open_runtime
    from server.watch import watch_ingest

    other = tmp_path / "other-kb"
    other.mkdir()
    (other / "lunch.md").write_text("# Lunch\n\nThe canteen opens at 11:30.\n", encoding="utf-8")
    runtime = open_runtime(load_settings(None, data_dir=data_dir), embedder=e5_embedder)
    try:
        before = runtime.catalog.hashes()
        watcher = FolderWatcher(other, watch_ingest(runtime, other), poll_s=0.05, debounce_s=0.2)
        with anyio.fail_after(120), caplog.at_level("ERROR", logger="server.watch"):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watcher.run)
                while "is not the folder this data directory was ingested from" not in caplog.text:
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
        assert watcher.ingests == 0
        assert runtime.catalog.hashes() == before and len(before) > 1
    finally:
        runtime.close()


def test_the_watcher_stamps_a_symlink_loop_and_a_fifo_instead_of_stopping(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# a", encoding="utf-8")
    (tmp_path / "loop.md").symlink_to(tmp_path / "loop.md")
    os.mkfifo(tmp_path / "pipe.md")
    assert set(snapshot(tmp_path)) == {str(tmp_path / n) for n in ("a.md", "loop.md", "pipe.md")}
