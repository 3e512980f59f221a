"""Results carry the passage that matched; memory is per passage; reading more is on purpose."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from retrieval.passages import best_passage, whole_document
from retrieval.ranking import ChunkScore, RankedDoc
from storage.catalog_records import ChunkRecord

HANDBOOK = "onboarding/operations-handbook.md"
EXPENSE = "How many days after buying something do I have to file an expense claim?"
EXPENSE_ANSWER = "Expense claims must be filed within 30 days of the purchase"
CLOUD = "Who has to approve a new cloud resource that costs more than 500 dollars a month?"
CLOUD_ANSWER = "needs approval from the engineering manager"
POOL = "数据库连接池怎么配置"
POOL_DOC = "infrastructure/hikaricp-pool-config.md"  # 1,550 characters in 4 passages


async def call(client: Client, query: str, session: str = "p") -> dict[str, Any]:
    result = await client.call_tool("lookup_knowledge", {"query": query}, meta={"session_id": session})
    assert not result.is_error, result.content
    return result.structured_content or {}


def all_content(result: dict[str, Any]) -> str:
    documents = ([result["primary"]] if result["primary"] else []) + result["supplement"]
    return "\n".join(d["content"] for d in documents)


async def test_a_question_answered_in_the_last_section_gets_that_section(make_server: Any) -> None:
    async with Client(make_server()) as client:
        result = await call(client, EXPENSE)
    primary = result["primary"]
    assert primary["doc_key"] == HANDBOOK and EXPENSE_ANSWER in primary["content"]
    assert primary["partial"] and primary["section_count"] >= 10
    assert any("Part 12" in s for s in primary["sections"])
    assert "Part 1 " not in primary["content"]  # not the head of the document


async def test_another_section_of_a_delivered_document_is_new_content(make_server: Any) -> None:
    async with Client(make_server()) as client:
        first = await call(client, EXPENSE)
        second = await call(client, CLOUD)
        repeat = await call(client, EXPENSE)
    assert first["found"] and second["found"]
    assert second["primary"]["doc_key"] == HANDBOOK and CLOUD_ANSWER in second["primary"]["content"]
    assert second["relevance_level"] != "DEDUPED"
    assert repeat["relevance_level"] == "DEDUPED"
    (held,) = [d for d in repeat["already_in_context"] if d["doc_key"] == HANDBOOK]
    assert any("Part 12" in s for s in held["sections"]) and any("Part 9" in s for s in held["sections"])


async def test_a_code_only_in_the_body_is_precise_and_brings_its_paragraph(make_server: Any) -> None:
    async with Client(make_server()) as client:
        result = await call(client, "KAFKA_E503_REBALANCE 是什么意思")
    assert result["relevance_level"] == "PRECISE" and result["primary"]["doc_key"] == HANDBOOK
    assert "consumer group rebalancing took longer than 5 minutes" in result["primary"]["content"]


async def test_a_document_that_fits_its_limit_is_sent_whole_and_one_that_does_not_is_not(
    make_server: Any,
) -> None:
    async with Client(make_server()) as client:
        whole = (await call(client, POOL))["primary"]
    async with Client(make_server(overrides={"retrieval": {"primary_max_chars": 1000}})) as client:
        cut = (await call(client, POOL, session="p2"))["primary"]  # memory persists across servers
    assert whole["doc_key"] == cut["doc_key"] == POOL_DOC
    assert not whole["partial"] and whole["section_count"] == 4
    for section in ("为什么使用 HikariCP", "监控与调优"):  # the first section and the last
        assert section in whole["content"]
    assert cut["partial"] and len(cut["content"]) <= 1000 < len(whole["content"])


def test_a_passage_fits_only_when_its_headed_text_is_not_cut() -> None:
    passage = whole_document("d.md", [ChunkRecord("c1", "d.md", 0, "Intro", "x" * 500, "en")])
    whole, cut = passage.shown("Title", 10_000)
    assert whole == "[Title › Intro]\n" + "x" * 500 and not cut
    assert passage.fits("Title", len(whole)) and not passage.fits("Title", len(whole) - 1)
    content, cut = passage.shown("Title", len(whole) - 1)
    assert cut and content.endswith("…") and len(content) == len(whole) - 1


async def test_document_mode_keeps_the_predecessors_head_of_document(make_server: Any) -> None:
    async with Client(make_server(overrides={"retrieval": {"content": "document"}})) as client:
        result = await call(client, EXPENSE)
    assert result["primary"]["doc_key"] == HANDBOOK
    assert result["primary"]["content"].startswith("[Operations Handbook")
    assert "Part 1 " in result["primary"]["content"]


async def _read_resource(client: Client, uri: str) -> dict[str, Any]:
    result = await client.read_resource(uri)
    return json.loads(result.contents[0].text)  # type: ignore[union-attr]


def _logged(data_dir: Path, tool: str) -> list[tuple[str, str]]:
    with sqlite3.connect(data_dir / "log.sqlite") as db:
        return db.execute(
            "SELECT query, result_doc_keys FROM tool_invocation WHERE tool_name = ?", (tool,)
        ).fetchall()


async def test_reading_a_section_counts_in_memory_and_is_logged(make_server: Any, data_dir: Path) -> None:
    async with Client(make_server(), mode="legacy") as client:
        section = await _read_resource(client, f"knowledge://doc/{HANDBOOK}?section=Part%2012")
        lookup = await client.call_tool("lookup_knowledge", {"query": EXPENSE})
        tool = await client.call_tool("read_knowledge_doc", {"doc_key": HANDBOOK})
    assert EXPENSE_ANSWER in section["document"]["content"] and section["document"]["partial"]
    assert lookup.structured_content["relevance_level"] == "DEDUPED"  # type: ignore[index]
    whole = tool.structured_content["document"]  # type: ignore[index]
    assert CLOUD_ANSWER in whole["content"] and EXPENSE_ANSWER not in whole["content"]
    assert [row[0] for row in _logged(data_dir, "knowledge://doc")] == [HANDBOOK]
    assert [json.loads(row[1]) for row in _logged(data_dir, "read_knowledge_doc")] == [[HANDBOOK]]


async def test_reading_an_unknown_document_or_section_is_a_clear_error(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        missing = await client.call_tool("read_knowledge_doc", {"doc_key": "nope.md"})
        no_section = await client.call_tool("read_knowledge_doc", {"doc_key": HANDBOOK, "section": "Part 99"})
    assert missing.is_error and "unknown document 'nope.md'" in missing.content[0].text  # type: ignore[union-attr]
    assert no_section.is_error and "has no section 'Part 99'" in no_section.content[0].text  # type: ignore[union-attr]


@pytest.mark.slow
async def test_the_document_resource_works_over_stdio_and_http(server_env: dict[str, str]) -> None:
    import sys

    from mcp import StdioServerParameters

    from tests.helpers import ROOT, http_server

    uri = f"knowledge://doc/{HANDBOOK}?section=Part%209"
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "server", "serve"], env=server_env, cwd=str(ROOT)
    )
    with anyio.fail_after(120):
        async with Client(params, mode="legacy") as client:
            over_stdio = await _read_resource(client, uri)
    with http_server(server_env) as (port, _proc), anyio.fail_after(120):
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
            over_http = await _read_resource(client, uri)
    for read in (over_stdio, over_http):
        assert CLOUD_ANSWER in read["document"]["content"]


def test_the_same_file_under_two_paths_is_sent_once(
    tmp_path: Path, e5_embedder: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from server.cli.main import main
    from tests.helpers import ingest_into, write_knowledge_base

    backups = "# Nightly backups\n\nThe nightly backup runs at 02:00 UTC and keeps 14 copies.\n"
    kb = write_knowledge_base(
        tmp_path / "kb",
        {
            "ops/backups.md": backups,
            "team-b/backups.md": backups,  # a copy in a second folder (a symlink reads the same)
            "ops/restores.md": "# Restores\n\nA restore from the nightly backup takes about 40 minutes.\n",
        },
    )
    data = tmp_path / "data"
    ingest_into(data, kb, e5_embedder)
    assert main(["lookup", "when does the nightly backup run", "--json", "--data-dir", str(data)]) == 0
    result = json.loads(capsys.readouterr().out)
    sent = [d["doc_key"] for d in [result["primary"], *result["supplement"]]]
    # Both copies used to come back, the second as a supplement with the same text.
    assert sent[0] in {"ops/backups.md", "team-b/backups.md"}
    assert sent[1:] == ["ops/restores.md"], sent


def test_a_second_section_that_matches_as_well_joins_the_best_one() -> None:
    # A long document: the rule in section 1, its exception in section 4, the rest elsewhere.
    chunks = [ChunkRecord(f"c{i}", "d.md", i, f"S{i}", f"text {i} " * 40, "en") for i in range(6)]
    close = (0.50, 0.90, 0.60, 0.55, 0.88, 0.40)  # c1's neighbours are far below it, c4 is close
    assert _chosen(chunks, close, limit=1000) == ("c1", "c4")
    # Not when it matches less closely than a neighbour must, nor when it does not fit.
    assert _chosen(chunks, (0.50, 0.90, 0.60, 0.55, 0.80, 0.40), limit=1000) == ("c1",)
    assert _chosen(chunks, close, limit=500) == ("c1",)
    # A targeted lookup gets one passage: the dimension's best match.
    assert _chosen(chunks, close, limit=1000, next_best=True) == ("c1",)


def _chosen(
    chunks: list[ChunkRecord], fused: tuple[float, ...], *, limit: int, next_best: bool = False
) -> tuple[str, ...]:
    scored = tuple(ChunkScore(c.chunk_id, c.doc_key, f, f, 0.0) for c, f in zip(chunks, fused, strict=True))
    doc = RankedDoc("d.md", max(fused), max(fused), 0.0, scored, False)
    passage = best_passage(doc, chunks, title="T", limit=limit, next_best=next_best)
    assert passage is not None
    return passage.chunk_ids
