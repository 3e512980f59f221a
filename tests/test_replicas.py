"""Replicas on one Milvus server without a shared disk: the catalog lives in the server too.

Serve processes with empty data directories answer what another machine ingested, without
embedding anything; a later ingest reaches them within the sync interval; an ingest from a
second data directory embeds nothing; two concurrent ingests take turns on the lease.
Everything but the lease's own test needs ``--milvus-server`` (docs/scaling.md).
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from server.config.loading import load_settings
from server.container import Runtime, open_runtime
from storage.catalog import CatalogEntry, DocumentRecord, PlannedChunk
from storage.shared_catalog import SharedCatalog, decode, encode
from storage.shared_lease import IngestLease
from storage.vector_store import connect
from tests.helpers import CLI, ROOT, write_knowledge_base
from tests.wire import RawSession, served_http, server_env

pytestmark = pytest.mark.timeout(600)

DOCS = {
    "ops/backups.md": "# Backups\n\nThe nightly backup runs at 02:00 UTC and keeps 14 copies (BKP_NIGHTLY_7).\n",
    "ops/deploys.md": "# Deploys\n\nDeploys freeze on public holidays; ROLLBACK_NOW reverts the last one.\n",
    "ops/oncall.md": "# On-call\n\nThe on-call rota changes on Mondays at 09:00; PAGER_ROTA_3 names the owner.\n",
}
ADDED = ("ops/quotas.md", "# Quotas\n\nQUOTA_LIMIT_88 is raised when a team exceeds its storage quota.\n")
EDITED = (
    "ops/deploys.md",
    "# Deploys\n\nDeploys now freeze on Fridays too; DEPLOY_FREEZE_FRI names the rule.\n",
)
SYNC_S = "0.5"


@pytest.fixture
def server_uri(milvus_server_uri: str | None) -> str:
    if milvus_server_uri is None:
        pytest.skip("the shared catalog lives on a Milvus server: run with --milvus-server")
    return milvus_server_uri


def _runtime(data_dir: Path, embedder: Any) -> Runtime:
    return open_runtime(load_settings(None, data_dir=data_dir), embedder=embedder)


def _ingest_cli(data_dir: Path, kb: Path) -> str:
    done = subprocess.run(
        [*CLI, "ingest", str(kb)],
        env=server_env(data_dir),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _primary(url: str, query: str) -> str | None:
    result = RawSession(url).call_tool("lookup_knowledge", {"query": query})["result"]
    assert not result.get("isError"), result
    found = result["structuredContent"].get("primary")
    return found["doc_key"] if found else None


def _level(url: str, query: str, conversation: str) -> str:
    result = RawSession(url, headers={"X-Session-Id": conversation}).call_tool(
        "lookup_knowledge", {"query": query}
    )
    assert not result["result"].get("isError"), result
    return str(result["result"]["structuredContent"]["relevance_level"])


def _answered_within(urls: list[str], query: str, doc_key: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    waiting = list(urls)
    while waiting:
        waiting = [url for url in waiting if _primary(url, query) != doc_key]
        assert not waiting or time.monotonic() < deadline, (
            f"{doc_key} not answered by {waiting} in {seconds}s"
        )
        time.sleep(0.2)


def test_two_replicas_with_empty_data_dirs_serve_a_third_process_ingest_and_follow_the_next_one(
    server_uri: str, tmp_path: Path
) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    assert _ingest_cli(tmp_path / "ingester", kb).startswith("added 3,")
    replicas = [
        server_env(tmp_path / f"replica-{n}", LOOKUP_KNOWLEDGE_MILVUS__SYNC_INTERVAL_S=SYNC_S) for n in (1, 2)
    ]
    with (
        served_http(replicas[0], tmp_path / "logs-1") as first,
        served_http(replicas[1], tmp_path / "logs-2") as second,
    ):
        urls = [first.url, second.url]
        for url in urls:
            assert _primary(url, "BKP_NIGHTLY_7") == "ops/backups.md"
        # Session memory is per replica (docs/scaling.md: route a conversation to one replica):
        # the replica that answered dedups the repeat, the other one has never seen it.
        levels = [
            _level(url, "BKP_NIGHTLY_7", "conversation-1") for url in (first.url, first.url, second.url)
        ]
        assert levels[1] == "DEDUPED" and "DEDUPED" not in (levels[0], levels[2]), levels
        write_knowledge_base(kb, dict([ADDED, EDITED]))
        assert _ingest_cli(tmp_path / "ingester", kb).startswith("added 1, updated 1,")
        # The stated delay is the sync interval; the bound leaves room for a loaded machine.
        _answered_within(urls, "QUOTA_LIMIT_88", ADDED[0], 30.0)
        _answered_within(urls, "DEPLOY_FREEZE_FRI", EDITED[0], 30.0)
        logs = [first.output(), second.output()]
    for log in logs:
        counts = re.findall(r"passages embedded by this process: (\d+)", log)
        assert len(counts) >= 2 and set(counts) == {"0"}, log[-3000:]  # the start-up pull and the later one


def test_an_ingest_of_the_same_folder_from_a_second_data_dir_embeds_nothing(
    server_uri: str, tmp_path: Path, e5_embedder: Any
) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    reports = []
    for name in ("first", "second"):
        runtime = _runtime(tmp_path / name, e5_embedder)
        try:
            reports.append(runtime.ingestor().run(kb))
        finally:
            runtime.close()
    assert reports[0].embedded == reports[0].chunks >= len(DOCS)
    assert (reports[1].embedded, reports[1].skipped, reports[1].changed) == (0, len(DOCS), False)


def _consistent(runtime: Runtime) -> dict[str, str]:
    """The shared catalog's doc_key -> content hash, checked head by head against the vectors."""
    assert runtime.shared is not None
    heads = runtime.shared.heads()
    records = dict((r.entry.doc_key, r) for r, _ in runtime.shared.records(list(heads.values())))
    assert set(records) == set(heads)
    for doc_key, record in records.items():
        assert runtime.store.chunk_ids(doc_key) == sorted(c.chunk_id for c in record.chunks), doc_key
        assert record.entry.content_hash == heads[doc_key].content_hash
    return {k: h.content_hash for k, h in heads.items()}


def test_two_concurrent_ingests_take_turns_and_leave_a_consistent_catalog(
    server_uri: str, tmp_path: Path, e5_embedder: Any
) -> None:
    folders = {
        "old": write_knowledge_base(tmp_path / "kb-old", DOCS),
        "new": write_knowledge_base(tmp_path / "kb-new", {**DOCS, **dict([ADDED, EDITED])}),
    }
    finished: list[str] = []
    failures: list[BaseException] = []

    def ingest(name: str) -> None:
        try:
            runtime = _runtime(tmp_path / f"data-{name}", e5_embedder)
            try:
                runtime.ingestor().run(folders[name])
            finally:
                runtime.close()
            finished.append(name)
        except BaseException as exc:  # reported by the test thread below
            failures.append(exc)

    threads = [threading.Thread(target=ingest, args=(name,)) for name in folders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failures and len(finished) == 2, failures
    replica = _runtime(tmp_path / "replica", e5_embedder)
    try:
        shared = _consistent(replica)
        local = replica.catalog.hashes()
    finally:
        replica.close()
    last = _runtime(tmp_path / f"data-{finished[-1]}", e5_embedder)
    try:
        assert shared == local == last.catalog.hashes()  # the later ingest's folder, whole
        assert set(shared) == {
            p.relative_to(folders[finished[-1]]).as_posix() for p in folders[finished[-1]].rglob("*.md")
        }
    finally:
        last.close()


def _long_record() -> DocumentRecord:
    """A document far over VARCHAR's 65,535 bytes: 90k CJK characters (3 bytes each) in one chunk."""
    text = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(90_000))
    entry = CatalogEntry(
        doc_key="长/文档.md",
        content_hash="h" * 64,
        title="长文档",
        domain="长",
        keywords=("关键词",),
        summary="",
        domain_description="",
        when_to_retrieve="",
        body=text,
        chunk_count=1,
        languages=("zh",),
    )
    return DocumentRecord(entry, (PlannedChunk("c" * 40, 0, "章节", text, "zh", {"17": 0.5}),))


def test_a_record_over_the_varchar_limit_is_cut_into_parts_that_fit_and_read_back_whole() -> None:
    record = _long_record()
    version, parts = encode(record)
    assert len(parts) > 1 and all(len(part.encode()) <= 65_535 for part in parts)
    assert decode(parts) == record and encode(decode(parts))[0] == version


def test_a_long_document_published_to_the_server_is_read_back_whole(
    server_uri: str, milvus_prefix: str
) -> None:
    shared = SharedCatalog(connect(server_uri, None, 30), f"{milvus_prefix}_long_catalog")
    try:
        shared.ensure(30)
        record = _long_record()
        version = shared.publish(record, replaces=None)
        heads = shared.heads()
        assert heads[record.entry.doc_key].version == version
        assert list(shared.records(list(heads.values()))) == [(record, version)]
        shared.withdraw(record.entry.doc_key, version=version)
        assert shared.heads() == {}
    finally:
        shared.close()


class _Rows:
    """The lease's rows in memory, each call a little slow, as a server round trip is."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, int]] = {}
        self.lock = threading.Lock()

    def meta(self, row_id: str) -> tuple[str, int] | None:
        time.sleep(0.002)
        with self.lock:
            return self.rows.get(row_id)

    def write_meta(self, row_id: str, data: str, seq: int) -> None:
        time.sleep(0.002)
        with self.lock:
            self.rows[row_id] = (data, seq)

    def delete_meta(self, row_id: str) -> None:
        with self.lock:
            self.rows.pop(row_id, None)


def test_leases_taken_at_once_by_several_ingests_are_held_one_at_a_time() -> None:
    rows = _Rows()
    inside: list[int] = []
    overlaps: list[int] = []

    def work(n: int, lease_of: Callable[[], IngestLease]) -> None:
        lease = lease_of()
        lease.acquire()
        try:
            inside.append(n)
            if len(inside) > 1:
                overlaps.append(n)
            lease.check()
            time.sleep(0.02)
            inside.remove(n)
        finally:
            lease.release()

    threads = [
        threading.Thread(target=work, args=(n, lambda: IngestLease(rows, ttl_s=5.0, settle_s=0.05)))
        for n in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not overlaps and not inside and "m:lease" not in rows.rows


def test_milvus_lite_keeps_its_catalog_to_itself(
    request: pytest.FixtureRequest, milvus_server_uri: str | None, e5_embedder: Any
) -> None:
    if milvus_server_uri is not None:
        pytest.skip("about Milvus Lite")
    settings = request.getfixturevalue("make_settings")()
    runtime = open_runtime(settings, embedder=e5_embedder)
    try:
        assert runtime.shared is None and runtime.ingestor()._mirror is None
        assert runtime.engine.view().entries
    finally:
        runtime.close()
