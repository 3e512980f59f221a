"""The invocation log through real MCP clients, the documented SQL, ``stats`` and knowledge://stats."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from server.cli.errors import CommandError
from server.cli.stats import StatsArgumentError, cmd_stats, parse_since
from server.config.loading import load_settings
from server.log_summary import similarity_bins, summarize
from server.protocol.app import create_server
from storage.invocation_log import InvocationLog
from storage.stats_queries import read_log_stats
from tests.helpers import CLI, ROOT, cli_env, http_server
from tests.test_invocation_log import make_record, rows

PRECISE_QUERY = "ERR_TIMEOUT 是什么"
PRECISE_DOC = "error-codes/err-timeout.md"
# The section may move into the README; the queries are read from wherever it is.
DOCS = (ROOT / "docs" / "observability.md", ROOT / "README.md")
SECTION = "## The three questions, in SQL"
ROW_FIELDS = {
    "l0_titles", "l0_match_count", "l1_scores", "l1_top_similarity", "relevance_level", "features",
    "completeness_hint", "retrieved_domains", "dedup_reason", "embedder", "thresholds", "passages",
}  # fmt: skip


def documented_queries() -> list[str]:
    """The three SQL blocks of the documentation's "three questions" section, verbatim."""
    text = next(t for path in DOCS if path.exists() and SECTION in (t := path.read_text(encoding="utf-8")))
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    queries = re.findall(r"```sql\n(.*?)```", section, flags=re.S)
    assert len(queries) == 3, queries
    return queries


def log_of(resources: Any) -> InvocationLog:
    log = resources.log
    assert log is not None
    return log


def stats_args(**changes: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"since": None, "session": None, "json": False, "png": None, **changes})


async def call(client: Client, tool: str, args: dict[str, Any] | None = None, **kw: Any) -> Any:
    with anyio.fail_after(60):
        return await client.call_tool(tool, args or {}, **kw)


# -- through the MCP server ------------------------------------------------------------------
async def test_a_session_of_calls_writes_one_row_each_with_the_retrieval_details(make_resources: Any) -> None:
    resources = make_resources()
    server = create_server(resources)
    async with Client(server, mode="legacy") as client:
        first = await call(client, "lookup_knowledge", {"query": PRECISE_QUERY})
        again = await call(client, "lookup_knowledge", {"query": PRECISE_QUERY, "domain": "error-codes"})
        await call(client, "list_knowledge_domains")
        failed = await call(client, "lookup_knowledge", {"query": PRECISE_QUERY, "domain": "cooking"})
        await call(client, "reset_session")
        path = log_of(resources).path
    assert first.structured_content["relevance_level"] == "PRECISE" and failed.is_error

    logged = rows(path)
    assert [r["tool_name"] for r in logged] == [
        "lookup_knowledge", "lookup_knowledge", "list_knowledge_domains", "lookup_knowledge", "reset_session",
    ]  # fmt: skip
    assert len({r["session_key"] for r in logged}) == 1 and logged[0]["session_key"]
    assert {r["session_scope"] for r in logged} == {"connection"}

    precise, deduped, domains, error, reset = logged
    assert precise["query"] == PRECISE_QUERY and precise["call_index"] == 1
    assert precise["relevance_level"] == "PRECISE" and precise["dedup_reason"] is None
    content = first.structured_content
    returned = [content["primary"]["doc_key"]] + [d["doc_key"] for d in content["supplement"]]
    assert json.loads(precise["result_doc_keys"]) == returned and returned[0] == PRECISE_DOC
    assert precise["water_level"] == first.structured_content["budget"]["water_level"]
    assert precise["next_call"] == first.structured_content["budget"]["next_call"]
    details = json.loads(precise["retrieval_details"])
    assert set(details) >= ROW_FIELDS
    assert details["l0_match_count"] == 1 and details["embedder"] == "e5-small"
    assert details["l1_top_similarity"] is not None and len(details["l1_scores"]) >= 1
    model = resources.settings.tier_model
    assert details["thresholds"] == {
        "on_topic": model.on_topic.threshold,
        "top_right": model.top_right.threshold,
        "confident": model.confident,
    }
    assert details["passages"] == {PRECISE_DOC: content["primary"]["sections"]}

    assert deduped["relevance_level"] == again.structured_content["relevance_level"] == "DEDUPED"
    assert deduped["dedup_reason"] == "doc_retrieved" and deduped["domain_filter"] == "error-codes"
    assert deduped["call_index"] == 2 and json.loads(deduped["result_doc_keys"]) == []
    assert domains["retrieval_details"] is None and domains["relevance_level"] is None
    assert error["error"].startswith("unknown domain 'cooking'") and error["retrieval_details"] is None
    assert reset["error"] is None and all(r["latency_ms"] > 0 for r in logged)


async def test_the_three_documented_queries_return_the_distributions_of_the_calls(
    make_resources: Any,
) -> None:
    queries = [PRECISE_QUERY, PRECISE_QUERY, "数据库连接池怎么配置", "HikariCP 连接池参数", "如何烤蛋糕"]
    resources = make_resources(overrides={"governance": {"enabled": False}})
    server = create_server(resources)
    answers = []
    async with Client(server, mode="legacy") as client:
        for query in queries:
            answers.append((await call(client, "lookup_knowledge", {"query": query})).structured_content)
        await call(client, "list_knowledge_domains")
        path = log_of(resources).path
    levels, reasons, similarity = documented_queries()

    conn = sqlite3.connect(path)
    try:
        assert dict(conn.execute(levels).fetchall()) == Counter(a["relevance_level"] for a in answers)
        assert dict(conn.execute(reasons).fetchall()) == Counter(a["dedup_reason"] for a in answers)
        by_similarity = conn.execute(similarity).fetchall()
    finally:
        conn.close()
    logged = [json.loads(r["retrieval_details"]) for r in rows(path) if r["tool_name"] == "lookup_knowledge"]
    expected = Counter(d.get("l1_top_similarity") for d in logged)
    assert dict(by_similarity) == expected and sum(expected.values()) == len(queries)
    assert [s for s, _ in by_similarity] == sorted(expected, key=lambda s: (s is not None, s))


async def test_lookups_answer_while_the_log_is_locked_and_the_failure_is_counted(make_resources: Any) -> None:
    resources = make_resources()
    server = create_server(resources)
    async with Client(server, mode="legacy") as client:
        await call(client, "lookup_knowledge", {"query": PRECISE_QUERY})
        log = log_of(resources)
        blocker = sqlite3.connect(log.path, isolation_level=None)
        blocker.execute("BEGIN EXCLUSIVE")
        try:
            answered = await call(client, "lookup_knowledge", {"query": "数据库连接池怎么配置"})
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert not answered.is_error and answered.structured_content["found"] is True
        assert log.failures == 1

        after = await call(client, "lookup_knowledge", {"query": "HikariCP 连接池参数"})
        assert not after.is_error
        stats = json.loads((await client.read_resource("knowledge://stats")).contents[0].text)
    assert stats["log"]["write_failures"] == 1 and "locked" in stats["log"]["last_error"]
    assert stats["missed_rows"] == 1 and stats["calls"]["total"] == 2
    assert [r["call_index"] for r in rows(log.path)] == [1, 3]


async def test_lookups_answer_after_the_log_file_is_deleted_and_land_in_a_new_file(
    make_resources: Any,
) -> None:
    resources = make_resources()
    server = create_server(resources)
    async with Client(server, mode="legacy") as client:
        await call(client, "lookup_knowledge", {"query": PRECISE_QUERY})
        log = log_of(resources)
        log.path.unlink()
        answered = await call(client, "lookup_knowledge", {"query": "数据库连接池怎么配置"})
        assert not answered.is_error and log.reopens == 1 and log.failures == 0
    assert [r["call_index"] for r in rows(log.path)] == [2]


@pytest.mark.slow
async def test_row_count_equals_call_count_across_three_concurrent_sessions(make_resources: Any) -> None:
    resources = make_resources(overrides={"governance": {"enabled": False}})
    server = create_server(resources)
    queries = [PRECISE_QUERY, "数据库连接池怎么配置", "HikariCP 连接池参数", "如何烤蛋糕", "部署流程"]

    async def one_session(client: Client) -> int:
        for query in queries:
            await call(client, "lookup_knowledge", {"query": query})
        await call(client, "list_knowledge_domains")
        await call(client, "reset_session")
        return len(queries) + 2

    async with (
        Client(server, mode="legacy") as a,
        Client(server, mode="legacy") as b,
        Client(server, mode="legacy") as c,
    ):
        with anyio.fail_after(180):
            made = await asyncio.gather(one_session(a), one_session(b), one_session(c))
        path = log_of(resources).path
    logged = rows(path)
    assert len(logged) == sum(made) == 21
    per_session = Counter(r["session_key"] for r in logged)
    assert len(per_session) == 3 and set(per_session.values()) == {7}
    for key in per_session:
        indexes = [
            r["call_index"]
            for r in logged
            if r["session_key"] == key and r["tool_name"] == "lookup_knowledge"
        ]
        assert indexes == [1, 2, 3, 4, 5]


async def test_knowledge_stats_serves_the_summary_that_stats_json_prints(
    make_server: Any, make_settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    server = make_server()
    async with Client(server, mode="legacy") as client:
        await call(client, "lookup_knowledge", {"query": PRECISE_QUERY})
        await call(client, "lookup_knowledge", {"query": PRECISE_QUERY})
        resource = json.loads((await client.read_resource("knowledge://stats")).contents[0].text)

    assert cmd_stats(stats_args(json=True), make_settings()) == 0
    printed = json.loads(capsys.readouterr().out)
    writer = {k: resource["log"].pop(k) for k in ("enabled", "write_failures", "reopens", "last_error")}
    assert writer == {"enabled": True, "write_failures": 0, "reopens": 0, "last_error": None}
    # The CLI prints where the log is; the resource does not (issue 14, finding 9).
    assert printed["log"].pop("path") == str(make_settings().data_dir / "log.sqlite")
    assert resource == printed
    assert printed["relevance_levels"] == {"PRECISE": 1, "DEDUPED": 1}
    assert printed["redundant_calls"] == {"count": 1, "lookups": 2, "rate": 0.5}


@pytest.mark.slow
def test_stats_shows_calls_made_over_http_while_the_server_runs(
    server_env: dict[str, str], data_dir: Path
) -> None:
    async def calls(port: int) -> None:
        async with Client(f"http://127.0.0.1:{port}/mcp", mode="legacy") as client:
            await call(client, "lookup_knowledge", {"query": PRECISE_QUERY})
            await call(client, "lookup_knowledge", {"query": PRECISE_QUERY})
            await call(client, "list_knowledge_domains")

    with http_server(server_env) as (port, _):
        anyio.run(calls, port)
        # The server still holds the log open: stats reads beside it.
        out = subprocess.run(
            [*CLI, "stats", "--json"],
            env=cli_env(data_dir),
            cwd=ROOT,
            capture_output=True,
            timeout=60,
            check=True,
        ).stdout
    summary = json.loads(out)
    assert summary["calls"]["by_tool"] == {"lookup_knowledge": 2, "list_knowledge_domains": 1}
    assert summary["relevance_levels"] == {"PRECISE": 1, "DEDUPED": 1}
    assert summary["sessions"]["count"] == 1


# -- the summary over a hand-written log -----------------------------------------------------
@pytest.fixture
async def crafted_log(tmp_path: Path) -> Path:
    """Six calls with known outcomes, timestamps 1000..1005, in two sessions."""
    log = await InvocationLog.open(tmp_path / "log.sqlite", log_queries=True)
    blocked = {"blocked": True, "relevance_level": "DEDUPED", "dedup_reason": "circuit_open"}
    calls = [
        make_record(ts=1000, latency_ms=10, session_key="a"),
        make_record(ts=1001, latency_ms=20, session_key="a", relevance_level="DEDUPED",
                    dedup_reason="doc_retrieved", result_doc_keys=[]),
        make_record(ts=1002, latency_ms=30, session_key="a", relevance_level="DEDUPED",
                    dedup_reason="circuit_open", result_doc_keys=[], retrieval_details=blocked),
        make_record(ts=1003, latency_ms=40, session_key="b", relevance_level=None, result_doc_keys=[],
                    retrieval_details=None, error="lookup failed: StoreError: down"),
        make_record(ts=1004, latency_ms=50, session_key="b", relevance_level="REFERENCE",
                    retrieval_details={"l1_top_similarity": 0.8871, "thresholds": {"reference": 0.886}}),
        make_record(ts=1005, latency_ms=1, session_key="b", tool_name="reset_session", relevance_level=None,
                    result_doc_keys=[], retrieval_details=None),
    ]  # fmt: skip
    for record in calls:
        assert await log.record(record)
    await log.close()
    return log.path


def test_the_summary_counts_redundant_blocked_and_failed_calls(crafted_log: Path) -> None:
    summary = summarize(read_log_stats(crafted_log))
    assert summary["calls"] == {"total": 6, "by_tool": {"lookup_knowledge": 5, "reset_session": 1}}
    assert summary["relevance_levels"] == {"PRECISE": 1, "REFERENCE": 1, "DEDUPED": 2, "none": 1}
    assert summary["dedup_reasons"] == {"none": 3, "doc_retrieved": 1, "circuit_open": 1}
    # doc_retrieved and circuit_open returned nothing new; the failed call is not redundant.
    assert summary["redundant_calls"] == {"count": 2, "lookups": 5, "rate": 0.4}
    assert summary["blocked_calls"] == {
        "count": 1, "by_reason": {"circuit_open": 1}
    }  # fmt: skip
    assert summary["errors"] == 1
    assert summary["sessions"] == {
        "count": 2,
        "calls_per_session": {"median": 3.0, "max": 3},
        "lookups_per_session": {"median": 2.5, "max": 3},
    }
    assert summary["latency_ms"]["lookup_knowledge"] == {"p50": 30.0, "p95": 50.0}
    assert summary["latency_ms"]["all"] == {"p50": 20.0, "p95": 50.0}
    similarity = summary["top_similarity"]
    assert similarity["count"] == 3 and "thresholds" not in similarity
    # The tier models' cut-offs are probabilities: they stand apart from the similarity bins.
    assert summary["tier_thresholds"] == {"reference": 0.886}


def test_stats_filters_by_window_and_session(crafted_log: Path) -> None:
    assert summarize(read_log_stats(crafted_log, since=1003))["calls"]["total"] == 3
    only_a = summarize(read_log_stats(crafted_log, session_key="a"))
    assert only_a["calls"]["total"] == 3 and only_a["sessions"]["count"] == 1


def test_stats_of_a_missing_log_reports_no_calls_and_creates_nothing(tmp_path: Path) -> None:
    summary = summarize(read_log_stats(tmp_path / "log.sqlite"))
    assert summary["calls"]["total"] == 0 and summary["redundant_calls"]["rate"] is None
    assert not (tmp_path / "log.sqlite").exists()


def test_stats_command_prints_bars_and_writes_a_png(
    crafted_log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = load_settings(None, data_dir=crafted_log.parent)
    png = crafted_log.parent / "chart" / "stats.png"
    assert cmd_stats(stats_args(png=png), settings) == 0
    text = capsys.readouterr().out
    assert "Redundant-call rate: 40.0% (2 of 5 lookups" in text
    assert "Blocked calls: 1 (circuit_open 1)" in text
    assert "█" in text and "0.885-0.890  " in text and "<reference" not in text
    assert "Tier models' probability cut-offs (latest lookup): reference 0.886" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_stats_rejects_an_unreadable_since_naming_the_value(tmp_path: Path) -> None:
    settings = load_settings(None, data_dir=tmp_path)
    with pytest.raises(
        CommandError, match=r"^--since must be a duration like 24h, 30m, 7d or an ISO date, got 'soon'"
    ):
        cmd_stats(stats_args(since="soon"), settings)


# -- pure pieces -----------------------------------------------------------------------------
def test_since_accepts_durations_and_iso_dates() -> None:
    assert parse_since("24h", now=100_000) == 100_000 - 86_400
    assert parse_since("30m", now=10_000) == 10_000 - 1800
    assert parse_since("1.5d", now=200_000) == 200_000 - 129_600
    assert parse_since("1970-01-02") == 86_400
    assert parse_since("1970-01-01T01:00:00+01:00") == 0
    with pytest.raises(StatsArgumentError, match=r"^--since must be a duration"):
        parse_since("-3h")


def test_similarity_bins_widen_to_fit_and_keep_empty_bins_inside_the_range() -> None:
    width, bins = similarity_bins({170: 2, 172: 1})  # 0.850-0.855 and 0.860-0.865
    assert width == 0.005 and [(b.start, b.count) for b in bins] == [(0.85, 2), (0.855, 0), (0.86, 1)]
    width, bins = similarity_bins({0: 1, 199: 4})  # the whole 0..1 range
    assert width == 0.05 and len(bins) == 20 and bins[0].count == 1 and bins[-1].count == 4
    assert similarity_bins({}) == (0.005, [])


async def test_knowledge_stats_reveals_no_filesystem_path(make_server: Any, data_dir: Path) -> None:
    server = make_server()
    with anyio.fail_after(120):
        async with Client(server, mode="legacy") as client:
            await call(client, "lookup_knowledge", {"query": PRECISE_QUERY})
            text = (await client.read_resource("knowledge://stats")).contents[0].text
    assert str(data_dir) not in text and "log.sqlite" not in text
    assert "path" not in json.loads(text)["log"]
