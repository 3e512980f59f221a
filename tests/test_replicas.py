"""Replicas on one Milvus server without a shared disk: the catalog lives in the server too.

Serve processes with empty data directories answer what another machine ingested, without
embedding anything; a later ingest reaches them within the stated delay (docs/scaling.md:
``sync_interval_s`` plus one sync's own work); a replica behind on the generation takes an edited
document whole at its next sync; a replica whose Milvus goes away keeps serving its cached
catalog and catches up when Milvus returns; an ingest from a second data directory embeds
nothing; two concurrent ingests take turns on the lease. Everything but the lease's own test
needs ``--milvus-server`` (docs/scaling.md).
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

from retrieval.ingest import IngestReport
from server.config.loading import load_settings
from server.container import Runtime, open_runtime
from storage.catalog_records import CatalogEntry, DocumentRecord, PlannedChunk
from storage.shared_catalog import SharedCatalog, decode, encode
from storage.shared_lease import IngestLease
from storage.vector_store import connect
from tests.helpers import CLI, ROOT, write_knowledge_base
from tests.milvus_target import timed_mirror
from tests.outage import Forwarder
from tests.wire import RawSession, http_lookup, http_primary, served_http, server_env

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
# The delay docs/scaling.md states: a change committed elsewhere is answered within
# sync_interval_s plus one sync's own work, which it bounds at PULL_BOUND_S for a few documents.
SYNC_S = 1.0
PULL_BOUND_S = 10.0
STATED_DELAY_S = SYNC_S + PULL_BOUND_S


@pytest.fixture
def server_uri(milvus_server_uri: str | None) -> str:
    if milvus_server_uri is None:
        pytest.skip("the shared catalog lives on a Milvus server: run with --milvus-server")
    return milvus_server_uri


def _runtime(data_dir: Path, embedder: Any) -> Runtime:
    return open_runtime(load_settings(None, data_dir=data_dir), embedder=embedder)


@pytest.fixture
def commits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The monotonic time of every generation an in-process ingest commits to the shared catalog."""
    times: list[float] = []
    monkeypatch.setattr("server.container.SharedMirror", timed_mirror(times))
    return times


def _ingest(data_dir: Path, kb: Path, embedder: Any) -> IngestReport:
    runtime = _runtime(data_dir, embedder)
    try:
        return runtime.ingestor().run(kb)
    finally:
        runtime.close()


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


def _replica_env(data_dir: Path, **settings: str) -> dict[str, str]:
    return server_env(data_dir, LOOKUP_KNOWLEDGE_MILVUS__SYNC_INTERVAL_S=str(SYNC_S), **settings)


def _read(url: str, doc_key: str) -> str:
    """The whole content of doc_key as this replica serves it, in a session of its own."""
    result = RawSession(url).call_tool("read_knowledge_doc", {"doc_key": doc_key})["result"]
    assert not result.get("isError"), result
    return str(result["structuredContent"]["document"]["content"])


def _level(url: str, query: str, conversation: str) -> str:
    result = RawSession(url, headers={"X-Session-Id": conversation}).call_tool(
        "lookup_knowledge", {"query": query}
    )
    assert not result["result"].get("isError"), result
    return str(result["result"]["structuredContent"]["relevance_level"])


def _answered(
    urls: list[str], query: str, doc_key: str, *, since: float, within: float, may_fail: bool = False
) -> float:
    """Poll until every replica answers query with doc_key; the seconds since ``since`` it took.

    A replica counts as answering when a lookup returned doc_key, at the moment that lookup returned.
    """
    waiting = list(urls)
    while True:
        waiting = [url for url in waiting if http_primary(url, query, may_fail=may_fail) != doc_key]
        elapsed = time.monotonic() - since
        assert elapsed <= within, (
            f"{doc_key} not answered by {waiting or urls} within {within:g}s of the ingest's commit "
            f"(answered at {elapsed:.2f}s)"
        )
        if not waiting:
            return elapsed
        time.sleep(0.1)


def _wait_for_log(served: Any, pattern: str, seconds: float) -> re.Match[str]:
    deadline = time.monotonic() + seconds
    while (found := re.search(pattern, served.output())) is None:
        assert time.monotonic() < deadline, (
            f"no {pattern!r} in the log within {seconds:g}s: {served.output()[-3000:]}"
        )
        time.sleep(0.1)
    return found


def test_two_replicas_with_empty_data_dirs_serve_a_third_process_ingest_and_follow_the_next_one(
    server_uri: str, tmp_path: Path, e5_embedder: Any, commits: list[float]
) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    assert _ingest_cli(tmp_path / "ingester", kb).startswith("added 3,")
    replicas = [_replica_env(tmp_path / f"replica-{n}") for n in (1, 2)]
    with (
        served_http(replicas[0], tmp_path / "logs-1") as first,
        served_http(replicas[1], tmp_path / "logs-2") as second,
    ):
        urls = [first.url, second.url]
        for url in urls:
            assert http_primary(url, "BKP_NIGHTLY_7") == "ops/backups.md"
        # Session memory is per replica (docs/scaling.md: route a conversation to one replica):
        # the replica that answered dedups the repeat, the other one has never seen it.
        levels = [
            _level(url, "BKP_NIGHTLY_7", "conversation-1") for url in (first.url, first.url, second.url)
        ]
        assert levels[1] == "DEDUPED" and "DEDUPED" not in (levels[0], levels[2]), levels
        write_knowledge_base(kb, dict([ADDED, EDITED]))
        report = _ingest(tmp_path / "ingester", kb, e5_embedder)
        assert (report.added, report.updated) == ([ADDED[0]], [EDITED[0]]) and len(commits) == 1
        # Within the stated delay of the commit, measured from it (the lookups' own time included).
        _answered(urls, "QUOTA_LIMIT_88", ADDED[0], since=commits[-1], within=STATED_DELAY_S)
        _answered(urls, "DEPLOY_FREEZE_FRI", EDITED[0], since=commits[-1], within=STATED_DELAY_S)
        logs = [first.output(), second.output()]
    for log in logs:
        counts = re.findall(r"passages embedded by this process: (\d+)", log)
        assert len(counts) >= 2 and set(counts) == {"0"}, log[-3000:]  # the start-up pull and the later one


RUNBOOK = "ops/runbook.md"


def _runbook(version: str) -> str:
    """A document of several sections (so several chunks), every one naming its version."""
    sections = "".join(
        f"## Step {n}\n\nStep {n} of the restore runbook: RUNBOOK_{version}_{n} names the owner of this step, "
        f"who checks the snapshot and signs the change log before the next step begins.\n\n"
        for n in (1, 2, 3)
    )
    return f"# Restore runbook\n\n{sections}"


def _version_of(content: str) -> str:
    """Which version a served content is, asserting it is that version whole (never a mix of two)."""
    found: set[tuple[str, str]] = set(re.findall(r"RUNBOOK_(OLD|NEW)_(\d)", content))
    versions = {v for v, _ in found}
    assert len(versions) == 1 and found == {(v, n) for v in versions for n in "123"}, content
    return versions.pop()


def test_a_replica_behind_on_the_generation_takes_an_edited_document_whole_at_its_next_sync(
    server_uri: str, tmp_path: Path, e5_embedder: Any, commits: list[float]
) -> None:
    kb = write_knowledge_base(tmp_path / "kb", {**DOCS, RUNBOOK: _runbook("OLD")})
    _ingest(tmp_path / "ingester", kb, e5_embedder)
    with served_http(_replica_env(tmp_path / "replica"), tmp_path / "logs") as replica:
        assert _version_of(_read(replica.url, RUNBOOK)) == "OLD"
        write_knowledge_base(kb, {RUNBOOK: _runbook("NEW")})
        assert _ingest(tmp_path / "ingester", kb, e5_embedder).updated == [RUNBOOK]
        seen: list[str] = []
        while not seen or seen[-1] == "OLD":
            # Behind, it serves the old version whole; after its next sync, the new one whole.
            seen.append(_version_of(_read(replica.url, RUNBOOK)))
            assert time.monotonic() - commits[-1] <= STATED_DELAY_S, seen
        assert http_primary(replica.url, "RUNBOOK_NEW_2") == RUNBOOK
        assert all(_version_of(_read(replica.url, RUNBOOK)) == "NEW" for _ in range(3))  # and stays there
        _wait_for_log(
            replica, r"took 1 documents \(\d+ chunks\), dropped 0, .*embedded by this process: 0", 5
        )


def test_a_replica_whose_milvus_goes_away_keeps_serving_its_catalog_and_catches_up_when_it_returns(
    server_uri: str, tmp_path: Path, e5_embedder: Any
) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    _ingest(tmp_path / "ingester", kb, e5_embedder)
    milvus = Forwarder(server_uri)  # the replica's only way to the server, cut and restored below
    milvus.up()
    try:
        env = _replica_env(tmp_path / "replica", LOOKUP_KNOWLEDGE_MILVUS__URI=milvus.uri)
        with served_http(env, tmp_path / "logs") as replica:
            assert http_primary(replica.url, "BKP_NIGHTLY_7") == "ops/backups.md"
            milvus.down()
            write_knowledge_base(kb, dict([EDITED]))
            assert _ingest(tmp_path / "ingester", kb, e5_embedder).updated == [EDITED[0]]
            _wait_for_log(
                replica, r"cannot read the shared catalog \(.*\); serving generation \d+ until it answers", 30
            )
            # A lookup it answered before is answered again from its evidence cache; any other
            # fails with an error result that names Milvus; documents and the process stay.
            assert http_primary(replica.url, "BKP_NIGHTLY_7") == "ops/backups.md"
            failed = http_lookup(replica.url, "PAGER_ROTA_3")
            message = failed["content"][0]["text"] if failed.get("isError") else ""
            assert message.startswith(
                "Error executing tool lookup_knowledge: lookup_knowledge failed: MilvusException"
            )
            assert "server unavailable" in message, failed
            assert "BKP_NIGHTLY_7" in _read(replica.url, "ops/backups.md")
            assert "public holidays" in _read(replica.url, EDITED[0])  # the cached generation
            assert replica.proc.poll() is None
            milvus.up()
            returned = time.monotonic()
            # Its Milvus client reconnects, and its next sync takes what was committed meanwhile.
            _answered([replica.url], "DEPLOY_FREEZE_FRI", EDITED[0], since=returned, within=30, may_fail=True)
            _wait_for_log(replica, "the shared catalog answers again", 5)
            assert replica.proc.poll() is None
    finally:
        milvus.down()


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
