"""Ingestion into a real Milvus Lite file and SQLite catalog: incremental, idempotent, atomic."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from retrieval.ingest import ForeignRootError
from server.config.loading import load_settings
from server.container import Runtime, open_runtime
from storage.vector_store import MilvusVectorStore, StoreError
from tests.helpers import CLI, ROOT, cli_env, write_knowledge_base

DOCS = {
    "infra/pool.md": "---\ntitle: Connection pool\nkeywords: [HikariCP]\n---\n# Pool\n\nmaximumPoolSize controls the pool size.\n",
    "api/limits.md": "---\ntitle: Rate limits\nkeywords: [429]\n---\n# Limits\n\nClients get 429 when over the limit.\n",
    "errors/timeout.md": "---\ntitle: ERR_TIMEOUT 超时\nkeywords: [ERR_TIMEOUT]\n---\n# 超时\n\n请求超时。\n",
}


@pytest.fixture
def runtime(tmp_path: Path, e5_embedder: Any) -> Iterator[Runtime]:
    rt = open_runtime(load_settings(None, data_dir=tmp_path / "data"), embedder=e5_embedder)
    yield rt
    rt.close()


def _stored(rt: Runtime) -> dict[str, list[str]]:
    return {key: rt.store.chunk_ids(key) for key in [*DOCS, "new/doc.md"] if rt.store.chunk_ids(key)}


def test_ingest_twice_changes_nothing_the_second_time(tmp_path: Path, runtime: Runtime) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    first = runtime.ingestor().run(kb)
    assert sorted(first.added) == sorted(DOCS) and first.chunks == 3 and not first.failed
    second = runtime.ingestor().run(kb)
    assert (second.added, second.updated, second.deleted, second.skipped) == ([], [], [], 3)
    assert second.summary().endswith("(no changes)")
    assert runtime.store.count() == 3


def test_editing_one_file_replaces_only_its_chunks(tmp_path: Path, runtime: Runtime) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    runtime.ingestor().run(kb)
    before = _stored(runtime)
    (kb / "api/limits.md").write_text(
        DOCS["api/limits.md"] + "\n## Retry\n\nRetry after the Retry-After header.\n"
    )
    report = runtime.ingestor().run(kb)
    assert report.updated == ["api/limits.md"] and report.skipped == 2
    after = _stored(runtime)
    assert after["infra/pool.md"] == before["infra/pool.md"]
    assert after["errors/timeout.md"] == before["errors/timeout.md"]
    assert after["api/limits.md"] != before["api/limits.md"]
    assert after["api/limits.md"] == sorted(runtime.catalog.chunk_ids("api/limits.md"))


def test_editing_one_section_embeds_only_that_section(tmp_path: Path, e5_embedder: Any) -> None:
    sections = "".join(
        f"## Part {i}\n\nStep {i}: check the gauge number {i} and write it down.\n\n" for i in range(12)
    )
    kb = write_knowledge_base(tmp_path / "kb", {"ops/runbook.md": "---\ntitle: Runbook\n---\n" + sections})
    settings = load_settings(None, data_dir=tmp_path / "data", chunking={"max_chars": 100})
    rt = open_runtime(settings, embedder=e5_embedder)
    try:
        first = rt.ingestor().run(kb)
        (kb / "ops/runbook.md").write_text(
            "---\ntitle: Runbook\n---\n" + sections.replace("gauge number 7 ", "gauge number 7 twice "),
            encoding="utf-8",
        )
        second = rt.ingestor().run(kb)
        stored = rt.store.chunk_ids("ops/runbook.md")
    finally:
        rt.close()
    assert first.chunks == first.embedded == 12
    assert second.updated == ["ops/runbook.md"] and second.chunks == 12 and second.embedded == 1
    assert len(stored) == 12  # the replaced chunk left the store in the same switch


def test_deleting_a_file_removes_its_chunks_and_catalog_row(tmp_path: Path, runtime: Runtime) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    runtime.ingestor().run(kb)
    (kb / "infra/pool.md").unlink()
    report = runtime.ingestor().run(kb)
    assert report.deleted == ["infra/pool.md"]
    assert runtime.store.chunk_ids("infra/pool.md") == []
    assert "infra/pool.md" not in runtime.catalog.hashes()
    assert runtime.store.count() == 2


def test_bad_files_are_named_and_the_rest_is_ingested(tmp_path: Path, runtime: Runtime) -> None:
    kb = write_knowledge_base(
        tmp_path / "kb",
        {**DOCS, "bad/yaml.md": "---\ntitle: [oops\n---\nx", "bad/blob.md": b"\x00\x01\x02PK"},
    )
    report = runtime.ingestor().run(kb)
    failed = dict(report.failed)
    assert set(failed) == {"bad/yaml.md", "bad/blob.md"}
    assert failed["bad/yaml.md"].startswith("broken YAML front matter")
    assert failed["bad/blob.md"].startswith("binary file")
    assert sorted(report.added) == sorted(DOCS)


@pytest.mark.slow
def test_cli_ingest_exits_non_zero_and_names_bad_files(tmp_path: Path) -> None:
    kb = write_knowledge_base(
        tmp_path / "kb", {**DOCS, "bad/yaml.md": "---\ntitle: [oops\n---\nx", "bad/blob.md": b"\x00\x01"}
    )
    proc = subprocess.run(
        [*CLI, "ingest", str(kb)],
        env=cli_env(tmp_path / "data"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "failed: bad/yaml.md: broken YAML front matter" in proc.stderr
    assert "failed: bad/blob.md: binary file" in proc.stderr
    assert proc.stdout.startswith("added 3, updated 0, deleted 0, skipped 0, failed 2, chunks 3 (3 embedded)")


@pytest.mark.slow
def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*CLI, "ingest", str(tmp_path / "nope")],
        env=cli_env(tmp_path / "data"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "does not exist or is not a directory" in proc.stderr


def test_interrupted_update_never_shows_a_mix_and_is_repaired(tmp_path: Path, runtime: Runtime) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    runtime.ingestor().run(kb)
    old_hash = runtime.catalog.hashes()["api/limits.md"]
    (kb / "api/limits.md").write_text(DOCS["api/limits.md"].replace("429", "429 Too Many Requests"))

    # Crash after the new chunks are upserted but before the catalog switch commits.
    real_commit = runtime.catalog.commit_document

    def crash(doc: Any, chunks: Any) -> None:
        raise KeyboardInterrupt("simulated kill")

    runtime.catalog.commit_document = crash  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        runtime.ingestor().run(kb)
    runtime.catalog.commit_document = real_commit  # type: ignore[method-assign]

    visible = set(runtime.catalog.chunk_ids("api/limits.md"))
    stored = set(runtime.store.chunk_ids("api/limits.md"))
    assert len(stored) == 2 and visible < stored  # both versions exist in Milvus...
    runtime.engine.view()
    evidence = runtime.engine.retrieve("rate limit 429", None)
    hits = {h.chunk_id for h in evidence.dense if h.doc_key == "api/limits.md"}
    assert hits == visible  # ...but only the committed one is visible
    assert runtime.catalog.hashes()["api/limits.md"] == old_hash
    assert runtime.catalog.pending()

    report = runtime.ingestor().run(kb)
    assert report.repaired == 1 and report.updated == ["api/limits.md"]
    assert runtime.store.chunk_ids("api/limits.md") == sorted(runtime.catalog.chunk_ids("api/limits.md"))
    assert runtime.store.count() == 3 and not runtime.catalog.pending()


def test_opening_a_collection_with_another_dimension_is_an_error(tmp_path: Path) -> None:
    uri = str(tmp_path / "m.db")
    store = MilvusVectorStore(uri=uri, token=None, collection="c_test_8", dim=8, timeout_s=10)
    store.ensure_collection()
    store.close()
    other = MilvusVectorStore(uri=uri, token=None, collection="c_test_8", dim=16, timeout_s=10)
    with pytest.raises(StoreError, match="has dimension 8, but the embedder produces 16"):
        other.ensure_collection()
    other.close()


def test_domain_filter_is_an_escaped_literal(tmp_path: Path, runtime: Runtime) -> None:
    runtime.ingestor().run(write_knowledge_base(tmp_path / "kb", DOCS))
    vector = np.ones(runtime.store.dim, dtype=np.float32)
    for hostile in ['" or 1==1 or "', 'api" || domain != "', "\\", '\\" or ""=="']:
        assert runtime.store.search(vector, limit=10, domain=hostile) == []
    assert {h.doc_key for h in runtime.store.search(vector, limit=10, domain="api")} == {"api/limits.md"}


# -- another folder than the one ingested ---------------------------------------------------
OTHER = {"misc/lunch.md": "# Lunch\n\nThe canteen serves lunch from 11:30 to 13:30.\n"}


def test_a_second_knowledge_base_does_not_replace_the_first_unless_asked(
    tmp_path: Path, runtime: Runtime
) -> None:
    first = write_knowledge_base(tmp_path / "kb", DOCS)
    runtime.ingestor().run(first)
    hashes, stored = runtime.catalog.hashes(), _stored(runtime)
    second = write_knowledge_base(tmp_path / "other-kb", OTHER)
    # It used to delete all three documents of the first without a word.
    with pytest.raises(ForeignRootError, match="would delete 3 of that folder's documents"):
        runtime.ingestor().run(second)
    assert runtime.catalog.hashes() == hashes and _stored(runtime) == stored
    assert runtime.store.count() == len(DOCS)
    replaced = runtime.ingestor().run(second, replace=True)
    assert replaced.added == ["misc/lunch.md"] and sorted(replaced.deleted) == sorted(DOCS)
    # The second is now the folder of record: the first would be refused in turn.
    with pytest.raises(ForeignRootError, match="would delete 1 of that folder's documents"):
        runtime.ingestor().run(first)


def test_a_subfolder_of_the_ingested_folder_is_refused_too(tmp_path: Path, runtime: Runtime) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    runtime.ingestor().run(kb)
    # Keys are relative to the folder ingested: under infra/ every one of the three would change.
    with pytest.raises(ForeignRootError, match="would delete 3 of that folder's documents"):
        runtime.ingestor().run(kb / "infra")


def test_a_moved_folder_and_deletions_in_the_same_folder_are_ingested(
    tmp_path: Path, runtime: Runtime
) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    runtime.ingestor().run(kb)
    (kb / "api" / "limits.md").unlink()
    assert runtime.ingestor().run(kb).deleted == ["api/limits.md"]
    moved = kb.rename(tmp_path / "renamed-kb")
    (moved / "errors" / "timeout.md").unlink()
    # The old folder is gone: a move, not a second knowledge base.
    report = runtime.ingestor().run(moved)
    assert report.deleted == ["errors/timeout.md"] and report.skipped == 1 and report.embedded == 0
    # Adding a second folder's documents deletes nothing of the first, so it is not refused.
    extra = write_knowledge_base(tmp_path / "extra", {**OTHER, "infra/pool.md": DOCS["infra/pool.md"]})
    assert runtime.ingestor().run(extra).added == ["misc/lunch.md"]


@pytest.mark.slow
def test_cli_ingest_of_a_second_knowledge_base_stops_with_one_line_until_replace(tmp_path: Path) -> None:
    def ingest(folder: Path, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, "ingest", str(folder), *flags],
            env=cli_env(tmp_path / "data"),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )

    first, second = (
        write_knowledge_base(tmp_path / "kb", DOCS),
        write_knowledge_base(tmp_path / "other-kb", OTHER),
    )
    assert ingest(first).returncode == 0
    refused = ingest(second)
    assert refused.returncode == 2 and refused.stdout == ""
    errors = [line for line in refused.stderr.splitlines() if " INFO " not in line]
    assert errors == [
        f"error: {str(second.resolve())!r} is not the folder this data directory was ingested from "
        f"({str(first.resolve())!r}, "
        "still there): ingesting it would delete 3 of that folder's documents. Use another --data-dir "
        f"for a second knowledge base, or replace that one with `lookup-knowledge-mcp ingest {second.resolve()} "
        "--replace`"
    ]
    replaced = ingest(second, "--replace")
    assert replaced.returncode == 0 and replaced.stdout.startswith("added 1, updated 0, deleted 3")


@pytest.mark.slow
def test_cli_ingest_reports_a_symlink_loop_and_a_fifo_in_one_line_each_and_ingests_the_rest(
    tmp_path: Path,
) -> None:
    kb = write_knowledge_base(tmp_path / "kb", DOCS)
    (kb / "infra/loop.md").symlink_to(kb / "infra/loop.md")
    os.mkfifo(kb / "pipe.md")  # no writer: reading it would block the ingest forever
    proc = subprocess.run(
        [*CLI, "ingest", str(kb)],
        env=cli_env(tmp_path / "data"),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    failed = [line for line in proc.stderr.splitlines() if line.startswith("failed: ")]
    assert sorted(failed) == [
        "failed: infra/loop.md: symlink loop (the link leads back to itself)",
        "failed: pipe.md: not a regular file (a FIFO)",
    ]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stdout.startswith("added 3, updated 0, deleted 0, skipped 0, failed 2")
