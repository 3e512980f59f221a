"""A catalog whose collection is gone (another ``milvus.uri``, a dropped collection, a removed
Milvus Lite file) is emptied when the collection is created again: lookups then say the
knowledge base is empty and the next ingest embeds every document. Before, the catalog still
listed them, so every ingest reported "(no changes)" and every lookup NO_MATCH, for good."""

from __future__ import annotations

import logging
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from server.cli.main import main
from server.config.loading import load_settings
from server.container import Runtime, open_runtime
from tests.helpers import ingest_into, write_knowledge_base

pytestmark = pytest.mark.timeout(300)

DOCS = {
    "ops/backups.md": "# Backups\n\nThe nightly backup runs at 02:00 UTC and keeps 14 copies.\n",
    "ops/deploys.md": "# Deploys\n\nDeploys freeze on public holidays; ROLLBACK_NOW reverts the last one.\n",
}
QUERY = "when does the nightly backup run"


def _open(data_dir: Path, embedder: Any) -> Runtime:
    return open_runtime(load_settings(None, data_dir=data_dir), embedder=embedder)


def test_a_dropped_collection_empties_the_catalog_and_the_next_ingest_embeds_everything(
    tmp_path: Path, e5_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    kb, data = write_knowledge_base(tmp_path / "kb", DOCS), tmp_path / "data"
    assert sorted(ingest_into(data, kb, e5_embedder).added) == sorted(DOCS)
    runtime = _open(data, e5_embedder)
    runtime.store._client.drop_collection(runtime.store.collection)
    runtime.close()

    with caplog.at_level(logging.WARNING, logger="server.container"):
        runtime = _open(data, e5_embedder)
    try:
        assert runtime.engine.view().entries == {}
        assert f"catalog listed {len(DOCS)} documents" in caplog.text
        report = runtime.ingestor().run(kb)
        assert sorted(report.added) == sorted(DOCS)
        assert report.embedded == report.chunks >= len(DOCS)
        evidence = runtime.engine.retrieve(QUERY, None)
        assert evidence.dense and evidence.dense[0].doc_key == "ops/backups.md"
    finally:
        runtime.close()


def test_reopening_an_intact_collection_keeps_the_catalog(tmp_path: Path, e5_embedder: Any) -> None:
    kb, data = write_knowledge_base(tmp_path / "kb", DOCS), tmp_path / "data"
    ingest_into(data, kb, e5_embedder)
    runtime = _open(data, e5_embedder)
    try:
        assert sorted(runtime.engine.view().entries) == sorted(DOCS)
        assert runtime.ingestor().run(kb).skipped == len(DOCS)
    finally:
        runtime.close()


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.lite_only
@pytest.mark.parametrize("change", ["another milvus.uri", "the Lite file removed"])
def test_a_milvus_without_the_vectors_makes_lookup_say_empty_and_ingest_embed_again(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    e5_embedder: Any,
    change: str,
) -> None:
    kb, data = write_knowledge_base(tmp_path / "kb", DOCS), tmp_path / "data"
    ingest_into(data, kb, e5_embedder)
    if change == "another milvus.uri":
        (tmp_path / "other").mkdir()
        monkeypatch.setenv("LOOKUP_KNOWLEDGE_MILVUS__URI", str(tmp_path / "other" / "milvus.db"))
    else:
        shutil.rmtree(data / "milvus.db")
    flags = ("--data-dir", str(data))

    with caplog.at_level(logging.WARNING, logger="server.container"):
        code, out, err = _cli(capsys, "lookup", QUERY, *flags)
    assert code == 2 and out == "" and err.startswith("error: the knowledge base is empty")
    assert f"the catalog listed {len(DOCS)} documents" in caplog.text

    code, out, _ = _cli(capsys, "ingest", str(kb), *flags)
    assert code == 0 and out.startswith(f"added {len(DOCS)}, updated 0")
    chunks = re.search(r"chunks (\d+) \((\d+) embedded\)", out)
    assert chunks and chunks[1] == chunks[2] and int(chunks[1]) >= len(DOCS)

    code, out, _ = _cli(capsys, "lookup", QUERY, "--json", *flags)
    assert code == 0 and '"doc_key": "ops/backups.md"' in out
