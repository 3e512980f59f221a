"""HTML, PDF, Word and PowerPoint files, and the Confluence and Notion export examples, end to end.

The files are built at test time (tests/office_files.py), ingested once per module in process
(the CLI's own ingest of them is a slow test), then read over MCP with the SDK's in-process client: for each format, a question answered
from the passage under its heading path, a code in a table found as PRECISE, and the title and
domain the document got.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from retrieval.ingest import Ingestor
from server.config.loading import load_settings
from server.container import chunking_rule, conversion_limits, open_runtime
from server.watch import FolderWatcher, watch_ingest
from storage.convert.worker import ConversionWorker
from tests.helpers import CLI, ROOT, cli_env, ingest_into, write_knowledge_base
from tests.office_files import (
    FIRST_WEEK,
    OUTAGE,
    RELEASES,
    TRAVEL,
    docx_bytes,
    html_bytes,
    pdf_bytes,
    pptx_bytes,
)
from tests.wire import blocking_client

CONFLUENCE = ROOT / "examples" / "confluence-export"
NOTION = ROOT / "examples" / "notion-export"
NOTION_ROOT = "Engineering Handbook 7c1e9a2b4d6f48a0b3c5d7e9f1a2b3c4"

BUILDERS = {
    "policies/travel.pdf": (pdf_bytes, TRAVEL),
    "onboarding/first-week.docx": (docx_bytes, FIRST_WEEK),
    "incidents/db-outage-review.pptx": (pptx_bytes, OUTAGE),
    "engineering/release-process.html": (html_bytes, RELEASES),
}
# Per format: the document, its title and domain, a code from its table, and a question answered
# under one heading path, with words of the answer.
CASES = [
    pytest.param(
        "policies/travel.pdf",
        "Travel policy",
        "policies",
        "TRV_HOTEL_042",
        "How much may a hotel night in Berlin cost?",
        "Hotels",
        "180 euros",
        id="pdf",
    ),
    pytest.param(
        "onboarding/first-week.docx",
        "First week guide",
        "onboarding",
        "ONB_BADGE_311",
        "Where do I go on my first day at the office?",
        "First day",
        "reception desk B",
        id="docx",
    ),
    pytest.param(
        "incidents/db-outage-review.pptx",
        "Database outage review",
        "incidents",
        "INC_DB_FAILOVER_9",
        "What caused the database outage?",
        "Root cause",
        "backup job",
        id="pptx",
    ),
    pytest.param(
        "engineering/release-process.html",
        "Release process",
        "engineering",
        "REL_HOTFIX_77",
        "When does the release freeze start?",
        "Freeze window",
        "Thursday 16:00",
        id="html",
    ),
]


def build_knowledge_base(root: Path) -> Path:
    """The four formats, a markdown file, and both export examples side by side, as a team would."""
    files: dict[str, str | bytes] = {key: build(outline) for key, (build, outline) in BUILDERS.items()}
    files["notes/readme.md"] = "# Notes\n\nThe knowledge base also holds plain markdown.\n"
    write_knowledge_base(root, files)
    shutil.copytree(CONFLUENCE, root, dirs_exist_ok=True)
    shutil.copytree(NOTION, root, dirs_exist_ok=True)
    return root


def ingest(kb: Path, data_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "ingest", str(kb)],
        env={**cli_env(data_dir), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def ingested(tmp_path_factory: pytest.TempPathFactory, e5_embedder: Any) -> Path:
    """The data directory holding the knowledge base, ingested once for the module; tests only read it."""
    base = tmp_path_factory.mktemp("formats")
    # The CLI's ingest runs the same Ingestor; its own test below starts it as a subprocess.
    ingest_into(base / "data", build_knowledge_base(base / "kb"), e5_embedder)
    return base / "data"


@pytest.fixture
def client(ingested: Path, e5_embedder: Any) -> Iterator[Any]:
    """A call(name, arguments) and a read(uri) over a fresh in-process MCP session."""
    with blocking_client(ingested, e5_embedder) as (portal, mcp):

        def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            result = portal.call(mcp.call_tool, name, arguments)
            assert not result.is_error, result.content
            return dict(result.structured_content)

        def read(uri: str) -> str:
            return str(portal.call(mcp.read_resource, uri).contents[0].text)

        yield call, read


@pytest.mark.slow
def test_the_cli_ingests_every_format_and_both_exports_and_skips_their_chrome(tmp_path: Path) -> None:
    kb, data_dir = build_knowledge_base(tmp_path / "kb"), tmp_path / "data"
    proc = ingest(kb, data_dir)
    assert proc.returncode == 0, proc.stderr
    # 4 converted files, 1 markdown, 3 Confluence pages (not index.html, not the attachment), 4 Notion pages.
    assert proc.stdout.startswith("added 12, updated 0, deleted 0, skipped 0, failed 0")
    again = ingest(kb, data_dir)
    assert again.returncode == 0 and again.stdout.rstrip().endswith("(no changes)")


@pytest.mark.parametrize(("doc_key", "title", "domain", "code", "question", "heading", "answer"), CASES)
def test_a_code_in_a_converted_table_is_found_as_precise_with_its_title_and_domain(
    client: Any, doc_key: str, title: str, domain: str, code: str, question: str, heading: str, answer: str
) -> None:
    call, _ = client
    result = call("lookup_knowledge", {"query": code})
    assert result["relevance_level"] == "PRECISE"
    primary = result["primary"]
    assert (primary["doc_key"], primary["title"], primary["domain"]) == (doc_key, title, domain)
    assert code in primary["content"]


@pytest.mark.parametrize(("doc_key", "title", "domain", "code", "question", "heading", "answer"), CASES)
def test_a_question_is_answered_from_the_passage_under_its_heading_path(
    client: Any, doc_key: str, title: str, domain: str, code: str, question: str, heading: str, answer: str
) -> None:
    call, _ = client
    result = call("lookup_knowledge", {"query": question})
    primary = result["primary"]
    assert result["found"] and primary["doc_key"] == doc_key and primary["sections"]
    # The answer sits in the section under its heading, which the converted markdown kept.
    section = re.search(rf"^#+ {re.escape(heading)}\n(.*?)(?=^#|\Z)", primary["content"], re.M | re.S)
    assert section is not None and answer in section.group(1)


def test_reading_a_converted_document_gives_its_markdown_under_its_original_path(client: Any) -> None:
    call, read = client
    document = call("read_knowledge_doc", {"doc_key": "policies/travel.pdf"})["document"]
    assert document["title"] == "Travel policy"
    content = document["content"]
    assert "## Hotels" in content and "| TRV_HOTEL_042 | Hotel night within the city cap | yes |" in content
    assert "ACME Corp - internal use only" not in content and "Page 2" not in content  # running chrome
    page = json.loads(read("knowledge://doc/engineering/release-process.html"))["document"]["content"]
    for dropped in (
        "analytics",
        "Sitemap",
        "Careers",
        "Intranet home",
        "Copyright",
        "cafeteria",
        "font-family",
    ):
        assert dropped not in page
    assert "```bash\nrelease-tool status --all\n```" in page and "- Tag the release" in page


def test_the_confluence_export_gets_its_space_as_domain_and_no_index_or_attachment(client: Any) -> None:
    call, _ = client
    result = call("lookup_knowledge", {"query": "RB_LOCKED_423"})
    assert result["relevance_level"] == "PRECISE"
    primary = result["primary"]
    assert (primary["doc_key"], primary["title"], primary["domain"]) == (
        "OPS/Deploy-runbook_65540.html",
        "Deploy runbook",
        "Platform Operations",
    )
    assert "Document generated by Confluence" not in primary["content"]
    assert "Attachments:" not in primary["content"] and "Created by" not in primary["content"]
    answer = call("lookup_knowledge", {"query": "只读副本延迟太高怎么办"})
    assert answer["found"] and answer["primary"]["doc_key"] == "OPS/Incident-codes_65541.html"
    domains = [d["domain_id"] for d in call("list_knowledge_domains", {})["domains"]]
    assert {"Platform Operations", "Engineering Handbook", "policies"} <= set(domains)
    for absent in ("OPS/index.html", "OPS/attachments/65540/rollback-notes-2019.txt"):
        with pytest.raises(AssertionError):
            call("read_knowledge_doc", {"doc_key": absent})


def test_the_notion_export_loses_its_ids_and_keeps_links_as_text(client: Any) -> None:
    call, _ = client
    result = call("lookup_knowledge", {"query": "ONCALL_SEV2_PAGE"})
    assert result["relevance_level"] == "PRECISE"
    primary = result["primary"]
    assert primary["doc_key"] == f"{NOTION_ROOT}/On-call rotation 9f8e7d6c5b4a49382716a5b4c3d2e1f0.md"
    assert (primary["title"], primary["domain"]) == ("On-call rotation", "Engineering Handbook")
    assert "Read the\nBilling API page before your first shift" in primary["content"]
    assert "%20" not in primary["content"]
    answer = call("lookup_knowledge", {"query": "What happens when the card processor times out?"})
    assert (
        answer["primary"]["title"] == "Billing API" and answer["primary"]["domain"] == "Engineering Handbook"
    )


class _CountingWorker(ConversionWorker):
    """The real bounded worker, counting the files it converts."""

    converted: list[str]

    def convert(self, raw: bytes, suffix: str) -> Any:
        self.converted.append(suffix)
        return super().convert(raw, suffix)


def test_converted_files_are_incremental_by_hash_and_unchanged_ones_are_not_converted_again(
    tmp_path: Path, e5_embedder: Any
) -> None:
    kb = write_knowledge_base(
        tmp_path / "kb",
        {"policies/travel.pdf": pdf_bytes(TRAVEL), "onboarding/week.docx": docx_bytes(FIRST_WEEK)},
    )
    runtime = open_runtime(load_settings(None, data_dir=tmp_path / "data"), embedder=e5_embedder)
    worker = _CountingWorker(conversion_limits(runtime.settings))
    worker.converted = []
    try:
        ingestor = Ingestor(
            runtime.catalog,
            runtime.store,
            e5_embedder,
            rule=chunking_rule(runtime.settings, e5_embedder),
            converter=worker,
        )
        first = ingestor.run(kb)
        assert sorted(first.added) == ["onboarding/week.docx", "policies/travel.pdf"]
        assert (ingestor.run(kb).skipped, sorted(worker.converted)) == (2, [".docx", ".pdf"])
        changed = replace(TRAVEL, sections=(TRAVEL.sections[0], ("Trains", ("Always take the train.",))))
        (kb / "policies/travel.pdf").write_bytes(pdf_bytes(changed))
        third = ingestor.run(kb)
        assert (third.updated, third.skipped, worker.converted[2:]) == (["policies/travel.pdf"], 1, [".pdf"])
        bodies = {entry.doc_key: entry.body for entry in runtime.catalog.entries()}
        assert "Always take the train." in bodies["policies/travel.pdf"]
    finally:
        runtime.close()


async def test_serve_watch_ingests_a_new_word_document(tmp_path: Path, e5_embedder: Any) -> None:
    kb = write_knowledge_base(tmp_path / "kb", {"notes/readme.md": "# Notes\n\nPlain markdown.\n"})
    runtime = open_runtime(load_settings(None, data_dir=tmp_path / "data"), embedder=e5_embedder)
    try:
        watcher = FolderWatcher(kb, watch_ingest(runtime, kb), poll_s=0.05, debounce_s=0.2)
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                tg.start_soon(watcher.run)
                while watcher.ingests < 1:
                    await anyio.sleep(0.05)
                (kb / "onboarding").mkdir()
                (kb / "onboarding/week.docx").write_bytes(docx_bytes(FIRST_WEEK))
                while "onboarding/week.docx" not in runtime.catalog.hashes():
                    await anyio.sleep(0.05)
                tg.cancel_scope.cancel()
    finally:
        runtime.close()
