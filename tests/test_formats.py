"""HTML, PDF, Word and PowerPoint files, and the Confluence and Notion export examples, end to end.

The files are built at test time (tests/office_files.py), ingested once per module through the
CLI, then read over MCP with the SDK's in-process client: for each format, a question answered
from the passage under its heading path, a code in a table found as PRECISE, and the title and
domain the document got.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import CLI, ROOT, cli_env, write_knowledge_base
from tests.office_files import Outline, docx_bytes, html_bytes, pdf_bytes, pptx_bytes
from tests.wire import blocking_client

CONFLUENCE = ROOT / "examples" / "confluence-export"
NOTION = ROOT / "examples" / "notion-export"
NOTION_ROOT = "Engineering Handbook 7c1e9a2b4d6f48a0b3c5d7e9f1a2b3c4"

TRAVEL = Outline(
    title="Travel policy",
    sections=(
        (
            "Hotels",
            (
                "Employees travelling on company business book hotels through the corporate travel portal. "
                "The nightly rate may not exceed 180 euros in Berlin, Munich and Hamburg, and 140 euros in "
                "every other city. A more expensive hotel needs the written approval of your cost centre "
                "owner before you book it, and the approval is attached to the expense report.",
                "Breakfast is included in the hotel rate where the hotel offers it. Minibar, laundry and "
                "pay television are private expenses and are never reimbursed, whatever the length of the "
                "trip. Cancel unused nights at least 24 hours ahead; late cancellation fees are charged "
                "to your cost centre.",
            ),
        ),
        (
            "Trains and flights",
            (
                "Trips that take less than four hours by train are made by train, in second class. First "
                "class is allowed for trips longer than four hours or when you travel overnight. Flights "
                "inside Germany need the approval of your manager and are booked in economy class only. "
                "Rental cars are the last resort and must be small or compact cars.",
                "Frequent flyer miles earned on business trips may be kept, but they must never decide "
                "which airline or route is booked. Travel insurance is provided by the company for every "
                "trip booked through the portal, so do not buy insurance of your own.",
            ),
        ),
    ),
    table_heading="Expense codes",
    table=(
        ("Code", "Meaning", "Receipt needed"),
        ("TRV_HOTEL_042", "Hotel night within the city cap", "yes"),
        ("TRV_TAXI_007", "Taxi or ride share to the station", "above 25 euros"),
    ),
)
FIRST_WEEK = Outline(
    title="First week guide",
    sections=(
        (
            "First day",
            (
                "On your first day, come to the reception desk B on the third floor of the north building "
                "at 09:30. The receptionist hands you a visitor pass, and your team lead collects you "
                "there. Your permanent badge is printed during the morning once security has your photo; "
                "bring a passport or an identity card, as a driving licence is not accepted.",
                "The morning ends with a tour of the building: the kitchen on every floor, the quiet rooms "
                "on the fourth floor, and the bicycle cellar whose door opens with your badge.",
            ),
        ),
        (
            "Laptop setup",
            (
                "Your laptop is waiting at your desk, already enrolled in device management. Sign in with "
                "the temporary password from your welcome email and change it at once. Install the VPN "
                "client from the self-service portal before you leave the office on your first day, "
                "because the portal cannot be reached from outside without it.",
                "Developers request access to the source code repositories through the access request "
                "form; approval by the team lead usually arrives the same afternoon.",
            ),
        ),
    ),
    bullets=("A passport or identity card", "Your bank details for the payroll form"),
    table_heading="Access request codes",
    table=(
        ("Code", "Access", "Approver"),
        ("ONB_BADGE_311", "Permanent building badge", "Security desk"),
        ("ONB_REPO_204", "Source code repositories", "Team lead"),
    ),
)
OUTAGE = Outline(
    title="Database outage review",
    sections=(
        (
            "Timeline",
            (
                "At 03:12 the primary database in Frankfurt stopped accepting writes after its disk latency "
                "rose above two seconds. Automatic failover promoted the replica at 03:19, and the checkout "
                "service recovered at 03:31 once its connection pool had been recycled by hand. "
                "The outage lasted 19 minutes for writes and 7 minutes for reads.",
            ),
        ),
        (
            "Root cause",
            (
                "A nightly backup job and a schema migration ran at the same time on the primary and "
                "saturated the disk. The backup job had been moved to 03:00 a week earlier without "
                "checking the migration schedule. From now on backups run on the replica only, and "
                "migrations are refused while a backup runs.",
            ),
        ),
    ),
    table_heading="Alert codes seen",
    table=(
        ("Code", "Meaning"),
        ("INC_DB_FAILOVER_9", "Automatic failover to the replica started"),
        ("INC_POOL_STALE_3", "Connection pool holds connections to a demoted primary"),
    ),
)
RELEASES = Outline(
    title="Release process",
    sections=(
        (
            "Freeze window",
            (
                "No release goes to production after Thursday 16:00 until Monday 09:00. The freeze protects "
                "the weekend on-call rotation from changes nobody is around to watch. A change that must "
                "ship during the freeze needs a hotfix ticket approved by the head of engineering.",
            ),
        ),
        (
            "Release notes",
            (
                "Every release carries notes written for customers, not for engineers: what changed, who "
                "is affected and what they have to do. The product manager of the team signs them off "
                "before the release train leaves on Tuesday morning.",
            ),
        ),
    ),
    bullets=("Tag the release", "Announce it in the release channel"),
    table_heading="Hotfix codes",
    table=(
        ("Code", "Meaning"),
        ("REL_HOTFIX_77", "Hotfix approved during the freeze"),
        ("REL_ROLLBACK_12", "Release rolled back after the canary"),
    ),
)

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
def ingested(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """(knowledge base, data directory, the CLI ingest), once for the module; tests only read it."""
    base = tmp_path_factory.mktemp("formats")
    kb = build_knowledge_base(base / "kb")
    return kb, base / "data", ingest(kb, base / "data")


@pytest.fixture
def client(ingested: tuple[Path, Path, Any], e5_embedder: Any) -> Iterator[Any]:
    """A call(name, arguments) and a read(uri) over a fresh in-process MCP session."""
    with blocking_client(ingested[1], e5_embedder) as (portal, mcp):

        def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            result = portal.call(mcp.call_tool, name, arguments)
            assert not result.is_error, result.content
            return dict(result.structured_content)

        def read(uri: str) -> str:
            return str(portal.call(mcp.read_resource, uri).contents[0].text)

        yield call, read


def test_the_cli_ingests_every_format_and_both_exports_and_skips_their_chrome(
    ingested: tuple[Path, Path, subprocess.CompletedProcess[str]],
) -> None:
    kb, data_dir, proc = ingested
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
