"""The knowledge-gap report: the selection and grouping on their own, then ``gaps`` on a log of real lookups."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest
from mcp import Client

from retrieval.gaps import group_gaps, select_gaps
from server.cli.main import main
from server.config.loading import load_settings
from server.protocol.app import app_resources, create_server
from storage.log_reads import LookupRow, ReadRow
from tests.test_invocation_log import rows

# A question the sample knowledge base (software engineering) does not answer, in three wordings.
UNANSWERED = [
    "How do I bake sourdough bread at home?",
    "What is the recipe for homemade sourdough bread?",
    "Steps to make sourdough bread",
]
ANSWERED = "ERR_TIMEOUT 是什么"
SCRIPT_QUERY = "<script>alert('x')</script> parental leave rules"


# -- the pure selection and grouping -----------------------------------------------------------
def lookup(id: int, query: str, tier: str, session: str | None = "s1", **kw: Any) -> LookupRow:
    fields: dict[str, Any] = {"domain": None, "missing_dimension": None, "dedup_reason": None, "doc_keys": ()}
    return LookupRow(
        id=id, ts=1000.0 + id, session_key=session, query=query, relevance_level=tier, **(fields | kw)
    )


def unit(*values: float) -> np.ndarray:
    vector = np.array(values, dtype=np.float32)
    return vector / np.linalg.norm(vector)


VECTORS = {
    "bread": unit(1, 0, 0),
    "bread again": unit(0.9, 0.1, 0),
    "pool": unit(0, 1, 0),
    "leave": unit(0, 0, 1),
}


def test_a_no_match_and_its_deduped_rephrasing_count_but_an_answered_rephrasing_does_not() -> None:
    lookups = [
        lookup(1, "bread", "NO_MATCH"),
        lookup(2, "bread again", "DEDUPED"),
        lookup(3, "bread again", "HIGHLY_RELEVANT", session="s2"),
        lookup(4, "pool", "PRECISE"),
    ]
    gaps = select_gaps(lookups, [], VECTORS)
    assert [(q.row.id, q.reason) for q in gaps] == [(1, "no_match"), (2, "rephrasing")]


def test_a_reference_counts_only_when_followed_by_a_lookup_on_the_same_topic() -> None:
    lookups = [
        lookup(1, "bread", "REFERENCE"),
        lookup(2, "bread again", "REFERENCE"),
        lookup(3, "pool", "REFERENCE", session="s2"),
        lookup(4, "leave", "REFERENCE", session="s2", missing_dimension="how many days"),
        lookup(5, "leave", "REFERENCE", session="s3"),
        lookup(6, "pool", "REFERENCE", session="s4"),
        lookup(7, "sha256:00", "DEDUPED", session="s4", dedup_reason="domain_retrieved"),
    ]
    reasons = {q.row.id: q.reason for q in select_gaps(lookups, [], VECTORS)}
    assert reasons == {
        1: "reference_followed",
        2: "rephrasing",
        3: "reference_followed",
        6: "reference_followed",
    }


def test_a_lookup_whose_session_read_more_of_its_document_counts() -> None:
    lookups = [
        lookup(1, "pool", "HIGHLY_RELEVANT", doc_keys=("infra/pool.md",)),
        lookup(2, "leave", "PRECISE"),
    ]
    reads = [ReadRow(ts=1005.0, session_key="s1", doc_keys=("infra/pool.md",))]
    assert [(q.row.id, q.reason) for q in select_gaps(lookups, reads, VECTORS)] == [(1, "read_further")]


def test_groups_hold_similar_questions_and_rank_by_sessions() -> None:
    lookups = [
        lookup(1, "pool", "NO_MATCH"),
        lookup(2, "pool", "NO_MATCH"),
        lookup(3, "bread", "NO_MATCH", session="s2"),
        lookup(4, "bread again", "NO_MATCH", session="s3"),
        lookup(5, "sha256:0123456789abcdef", "NO_MATCH", session="s4"),
    ]
    groups = group_gaps(select_gaps(lookups, [], VECTORS), VECTORS)
    assert [(len(g.questions), g.sessions) for g in groups] == [(2, 2), (2, 1)]
    assert groups[0].examples() == ["bread", "bread again"] and groups[1].examples() == ["pool"]


# -- `gaps` on a log made by real lookups ------------------------------------------------------
async def _ask(server: Any, queries: list[str]) -> list[str]:
    tiers = []
    async with Client(server, mode="legacy") as client:
        for query in queries:
            with anyio.fail_after(60):
                result = await client.call_tool("lookup_knowledge", {"query": query})
            tiers.append(result.structured_content["relevance_level"])
    return tiers


def two_sessions(data_dir: Path, e5_embedder: Any, *, log_queries: bool) -> Path:
    """Two sessions of real lookups, each asking the unanswered question in its three wordings."""
    settings = load_settings(None, data_dir=data_dir, log={"log_queries": log_queries})
    server = create_server(app_resources(settings, embedder=e5_embedder))

    async def run() -> None:
        first = await _ask(server, [ANSWERED, *UNANSWERED])
        second = await _ask(server, [*UNANSWERED, SCRIPT_QUERY])
        assert first[0] == "PRECISE"
        assert not {"PRECISE", "HIGHLY_RELEVANT"} & {*first[1:], *second[:3]}, (first, second)

    anyio.run(run)
    return data_dir


@pytest.fixture(scope="module")
def logged(
    tmp_path_factory: pytest.TempPathFactory, sample_template: Path, e5_embedder: Any
) -> Iterator[Path]:
    """A data directory whose log holds two sessions of real lookups (module-wide: read-only)."""
    data_dir = tmp_path_factory.mktemp("gaps") / "data"
    shutil.copytree(sample_template, data_dir)
    yield two_sessions(data_dir, e5_embedder, log_queries=True)


@pytest.fixture(scope="module")
def hashed(
    tmp_path_factory: pytest.TempPathFactory, sample_template: Path, e5_embedder: Any
) -> Iterator[Path]:
    """The same lookups, logged with log.log_queries off (hashes instead of text)."""
    data_dir = tmp_path_factory.mktemp("gaps-hashed") / "data"
    shutil.copytree(sample_template, data_dir)
    yield two_sessions(data_dir, e5_embedder, log_queries=False)


def run_gaps(data_dir: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> str:
    capsys.readouterr()
    assert main(["gaps", "--data-dir", str(data_dir), "--since", "all", *flags]) == 0
    return capsys.readouterr().out


def test_gaps_json_puts_the_three_rephrasings_of_two_sessions_in_one_group_ranked_first(
    logged: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOOKUP_KNOWLEDGE_LOG__LOG_QUERIES", raising=False)
    report = json.loads(run_gaps(logged, capsys, "--json"))
    first = report["groups"][0]
    assert first["rank"] == 1 and first["sessions"] == 2 and first["size"] == 6
    assert sorted(first["examples"]) == sorted(UNANSWERED)
    assert sorted(q["question"] for q in first["questions"]) == sorted(UNANSWERED * 2)
    logged_rows = rows(
        logged / "log.sqlite", "SELECT ts, query FROM tool_invocation WHERE query LIKE '%sourdough%'"
    )
    assert len(logged_rows) == 6
    assert first["nearest_document"] and not first["nearest_document"].startswith("/")
    assert all(not group["examples"] or ANSWERED not in group["examples"] for group in report["groups"])
    assert report["documents"]["most_delivered"][0]["delivered"] >= 1
    assert len(report["documents"]["never_delivered"]) >= 1


def test_gaps_text_names_the_group_with_its_sessions_and_examples(
    logged: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = run_gaps(logged, capsys)
    assert "1. 6 questions from 2 sessions" in text
    assert all(f"   - {question}" in text for question in UNANSWERED)
    assert "nearest document:" in text and "Documents never delivered:" in text


def test_with_queries_not_logged_gaps_gives_counts_by_domain_and_no_text(
    hashed: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOKUP_KNOWLEDGE_LOG__LOG_QUERIES", "false")
    out = run_gaps(hashed, capsys, "--json")
    report = json.loads(out)
    assert report["groups"] == [] and report["log_queries"] is False
    assert report["message"].startswith("queries are not logged")
    # Each session's first wording, followed by a lookup DEDUPED on the same domain, counts.
    assert sum(report["hidden_by_domain"].values()) == report["questions"] >= 2
    assert "sourdough" not in out and "sha256:" not in out
    text = run_gaps(hashed, capsys)
    assert "counts by domain only" in text and "sha256:" not in text


def test_gaps_refuses_a_bad_window_and_a_missing_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["gaps", "--data-dir", str(tmp_path), "--since", "soon"]) == 2
    assert "--since must be a duration" in capsys.readouterr().err
    assert main(["gaps", "--data-dir", str(tmp_path)]) == 2
    assert "no invocation log at" in capsys.readouterr().err
