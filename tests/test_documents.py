"""Loading, front matter, fallbacks, chunking and bad-file handling of the document loader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from storage.chunking import ChunkingRule, chunk_markdown
from storage.discovery import Candidate, DocumentError, discover, read_source
from storage.documents import load_document
from tests.helpers import write_knowledge_base


def _write(root: Path, rel: str, text: str | bytes) -> Candidate:
    return Candidate(rel, write_knowledge_base(root, {rel: text}) / rel)


def test_front_matter_fields_are_read(tmp_path: Path) -> None:
    doc = load_document(
        _write(
            tmp_path,
            "infra/pool.md",
            "---\ntitle: Pool\ndomain: infrastructure\nkeywords: [HikariCP, 连接池]\nsummary: S\n"
            "domain_description: D\nwhen_to_retrieve: W\n---\n# Heading\n\nBody text.\n",
        ),
        rule=ChunkingRule(max_chars=500),
    )
    assert (doc.title, doc.domain, doc.keywords) == ("Pool", "infrastructure", ("HikariCP", "连接池"))
    assert (doc.summary, doc.domain_description, doc.when_to_retrieve) == ("S", "D", "W")
    assert doc.doc_key == "infra/pool.md"


def test_missing_front_matter_falls_back_to_first_heading_and_top_folder(tmp_path: Path) -> None:
    doc = load_document(
        _write(tmp_path, "onboarding/sub/setup.md", "intro\n\n# Dev setup\n\ntext"),
        rule=ChunkingRule(max_chars=500),
    )
    assert doc.title == "Dev setup"
    assert doc.domain == "onboarding"
    assert doc.keywords == ()


def test_category_is_accepted_as_an_alias_of_domain(tmp_path: Path) -> None:
    doc = load_document(
        _write(tmp_path, "x/a.md", "---\ncategory: api\n---\ntext"), rule=ChunkingRule(max_chars=500)
    )
    assert doc.domain == "api"


def test_txt_file_at_the_root_gets_the_general_domain_and_file_stem_title(tmp_path: Path) -> None:
    doc = load_document(_write(tmp_path, "glossary.txt", "term: meaning"), rule=ChunkingRule(max_chars=500))
    assert (doc.title, doc.domain) == ("glossary", "general")


@pytest.mark.parametrize(
    ("content", "reason_prefix"),
    [
        ("---\ntitle: [unclosed\n---\nbody", "broken YAML front matter"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary file"),
        ("plain".encode("utf-16"), "binary file"),
        (b"caf\xe9 latin-1 text", "not valid UTF-8"),
        ("---\n- a\n- b\n---\nbody", "front matter must be a mapping"),
        ("---\nkeywords: {a: 1}\n---\nbody", "front matter field 'keywords' must be a list"),
        ("   \n\n", "empty document"),
    ],
)
def test_bad_files_raise_document_error_with_reason(
    tmp_path: Path, content: str | bytes, reason_prefix: str
) -> None:
    with pytest.raises(DocumentError) as caught:
        load_document(_write(tmp_path, "bad.md", content), rule=ChunkingRule(max_chars=500))
    assert caught.value.reason.startswith(reason_prefix)
    assert str(caught.value).startswith("bad.md: ")


def test_unreadable_file_is_reported(tmp_path: Path) -> None:
    (tmp_path / "gone.md").symlink_to(tmp_path / "missing-target.md")
    with pytest.raises(DocumentError, match="unreadable"):
        load_document(Candidate("gone.md", tmp_path / "gone.md"), rule=ChunkingRule(max_chars=500))


def test_chunks_follow_headings_and_never_exceed_the_maximum() -> None:
    body = (
        "# T\n\nintro\n\n## A\n\n"
        + ("alpha sentence. " * 80)
        + "\n\n## B\n\nshort b\n\n```\n# not a heading\n```\n"
    )
    chunks = list(chunk_markdown(body, title="T", rule=ChunkingRule(max_chars=300)))
    assert all(len(c.text) <= 300 for c in chunks)
    assert [c.index for c in chunks] == list(range(len(chunks)))
    assert any(c.heading == "A" for c in chunks)
    # A '#' line inside a code fence is code, not a heading.
    assert any("# not a heading" in c.text for c in chunks)
    assert all(c.heading != "not a heading" for c in chunks)


def test_small_sections_merge_into_one_chunk() -> None:
    chunks = list(
        chunk_markdown("# T\n\n## A\n\na\n\n## B\n\nb", title="T", rule=ChunkingRule(max_chars=500))
    )
    assert len(chunks) == 1
    assert "## A" in chunks[0].text and "## B" in chunks[0].text


def test_content_hash_changes_with_content_and_chunk_size(tmp_path: Path) -> None:
    cand = _write(tmp_path, "a.md", "# A\n\ntext")
    first = load_document(cand, rule=ChunkingRule(max_chars=500)).content_hash
    assert load_document(cand, rule=ChunkingRule(max_chars=500)).content_hash == first
    assert load_document(cand, rule=ChunkingRule(max_chars=600)).content_hash != first
    _write(tmp_path, "a.md", "# A\n\ntext changed")
    assert load_document(cand, rule=ChunkingRule(max_chars=500)).content_hash != first


def test_discovery_refuses_symlinks_that_escape_the_root(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("# secret")
    _write(root, "ok.md", "# ok")
    (root / "leak.md").symlink_to(outside / "secret.md")
    (root / "leakdir").symlink_to(outside, target_is_directory=True)
    (root / ".hidden.md").write_text("# hidden")
    found = {c.doc_key: c.refusal for c in discover(root)}
    assert found["ok.md"] is None
    assert found["leak.md"] == "symlink escapes the knowledge base root"
    assert found["leakdir"] == "symlink escapes the knowledge base root"
    assert ".hidden.md" not in found
    assert not any(key.startswith("leakdir/") for key in found)


def test_chunks_carry_their_heading_path() -> None:
    body = "# Runbook\n\n## Deploying\n\nintro\n\n### Rollback\n\nhow to roll back\n"
    chunks = list(chunk_markdown(body, title="Runbook", rule=ChunkingRule(max_chars=30)))
    assert [c.heading for c in chunks][-1] == "Deploying › Rollback"


def test_chunks_stay_within_the_token_limit_of_the_embedder() -> None:
    def count(text: str) -> int:  # one token per character, as for dense Chinese text
        return len(text)

    body = "## 章节\n\n" + "连接池的最大连接数应当按照数据库的承载能力设置。" * 40
    rule = ChunkingRule(max_chars=5000, max_tokens=200, count_tokens=count)
    chunks = list(chunk_markdown(body, title="连接池", rule=rule))
    assert len(chunks) > 3
    assert all(count(f"连接池 › 章节\n{c.text}") <= 200 for c in chunks)
    assert "".join(c.text for c in chunks).count("连接池的最大连接数") == 40


def test_identifiers_are_collected_from_the_body(tmp_path: Path) -> None:
    body = "---\ntitle: Runbook\n---\n## Codes\n\n| code | meaning |\n|---|---|\n| `KAFKA_E503_REBALANCE` | slow |\n"
    doc = load_document(_write(tmp_path, "ops/runbook.md", body), rule=ChunkingRule(max_chars=500))
    assert doc.identifiers == ("KAFKA_E503_REBALANCE",)


def test_a_symlink_loop_and_a_fifo_are_refused_without_blocking(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    _write(root, "ok.md", "# ok")
    (root / "loop.md").symlink_to(root / "loop.md")
    (root / "dangling.md").symlink_to(root / "gone.md")
    os.mkfifo(root / "pipe.md")
    found = {c.doc_key: c.refusal for c in discover(root)}
    assert found == {
        "ok.md": None,
        "loop.md": "symlink loop (the link leads back to itself)",
        "dangling.md": "broken symlink (its target does not exist)",
        "pipe.md": "not a regular file (a FIFO)",
    }


def test_a_file_swapped_for_a_fifo_after_discovery_is_refused_when_read(tmp_path: Path) -> None:
    root = tmp_path / "kb"
    candidate = _write(root, "late.md", "# late")
    (root / "late.md").unlink()
    os.mkfifo(root / "late.md")  # nobody writes it: a blocking open would never return
    with pytest.raises(DocumentError, match="not a regular file \\(a FIFO\\)"):
        read_source(candidate)


def test_short_codes_are_identifiers_only_where_the_document_defines_them(tmp_path: Path) -> None:
    doc = load_document(
        _write(
            tmp_path,
            "privacy/breach.md",
            "---\nkeywords: [breach, PR-A]\n---\n# Breach response\n\n| Class | Who |\n|---|---|\n"
            "| BR-3 | Breach team |\n\nA BR-4 case or an S2 outage is escalated like KFK-4012.\n",
        ),
        rule=ChunkingRule(max_chars=500),
    )
    assert set(doc.identifiers) == {"KFK-4012", "BR-3", "PR-A"}
