"""The console's overview and sessions pages over a small real log, without a browser: escaping,
headers, hidden queries, the running totals, methods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.testclient import TestClient

from server.config.loading import load_settings
from server.config.settings import Settings
from server.console.app import Console, console_app
from storage.invocation_log import InvocationLog
from storage.log_digest import LogDigest
from storage.log_reads import read_only
from tests.test_invocation_log import make_record

SCRIPT = "<script>alert('x')</script> leave"


async def _no_runtime() -> Any:
    raise AssertionError("the overview and sessions pages need no retrieval stack")


def write_log(path: Path, log_queries: bool = True) -> None:
    async def run() -> None:
        log = await InvocationLog.open(path, log_queries=log_queries)
        try:
            await log.record(make_record(call_index=1))
            await log.record(
                make_record(query=SCRIPT, relevance_level="NO_MATCH", result_doc_keys=[], call_index=2)
            )
            await log.record(make_record(session_key="s2", dedup_reason="circuit_open", next_call="STOP"))
            await log.record(make_record(session_key="s2", error="unknown domain 'x'", relevance_level=None))
        finally:
            await log.close()

    anyio.run(run)


def client(settings: Settings) -> TestClient:
    return TestClient(console_app(Console(settings.log_path, lambda: settings, _no_runtime)))


def test_a_script_query_is_text_and_every_page_forbids_scripts(settings: Settings) -> None:
    write_log(settings.log_path)
    response = client(settings).get("/console/sessions?since=all")
    assert response.status_code == 200
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; leave" in response.text
    assert "<script" not in response.text
    assert "script-src" not in response.headers["content-security-policy"]  # default-src 'none' covers it
    assert response.headers["content-security-policy"].startswith("default-src 'none'")
    assert response.headers["x-content-type-options"] == "nosniff"
    assert str(settings.data_dir) not in response.text


def test_the_overview_counts_calls_lookups_refusals_and_sessions(settings: Settings) -> None:
    write_log(settings.log_path)
    text = client(settings).get("/console?since=all").text
    for ident, value in (("calls", 4), ("lookups", 4), ("sessions", 2), ("blocked", 1), ("refused", 1)):
        assert f'id="{ident}">' in text and f"<b>{value}</b>" in text.split(f'id="{ident}">', 1)[1][:80], (
            ident
        )


def test_with_queries_not_logged_the_sessions_page_shows_no_query_text(tmp_path: Path) -> None:
    settings = load_settings(None, data_dir=tmp_path, log={"log_queries": False})
    write_log(settings.log_path, log_queries=True)  # logged with text before the switch
    text = client(settings).get("/console/sessions?since=all").text
    assert "script" not in text and "ERR_TIMEOUT" not in text and "(not logged)" in text


def test_pages_answer_only_get_and_an_absent_log_is_an_empty_overview(settings: Settings) -> None:
    app = client(settings)
    assert app.post("/console").status_code == 405
    assert app.get("/console?since=all").status_code == 200


def test_the_running_totals_fold_in_only_new_rows(settings: Settings) -> None:
    write_log(settings.log_path)
    digest = LogDigest()

    async def refresh() -> None:
        async with read_only(settings.log_path) as conn:
            await digest.refresh(conn)

    anyio.run(refresh)
    assert digest.overview(None).total_calls == 4 and digest.last_id == 4
    write_log(settings.log_path)
    anyio.run(refresh)
    overview = digest.overview(None)
    assert (
        overview.total_calls == 8
        and overview.sessions == 2
        and overview.p50_ms == pytest.approx(12.5, rel=0.03)
    )
    assert {s.session_key for s in digest.active_sessions(None)} == {"s1", "s2"}
    assert digest.sessions["s2"].stopped_at == 1 and digest.sessions["s2"].blocked == 2


def _gap_group(rank: int, questions: int) -> Any:
    from server.gap_report import GapGroupOut, GapQuestionOut

    asked = [f"2026-11-{1 + n % 28:02d}T10:{n // 28:02d}:00+00:00" for n in range(questions)]
    return GapGroupOut(
        rank=rank, size=questions, sessions=1, examples=[f"topic {rank}"], first_seen=min(asked),
        last_seen=max(asked), reasons={"no_match": questions}, best_tier="NO_MATCH", nearest_document=None,
        questions=[
            GapQuestionOut(question=f"topic {rank} question {n}", session="s", asked_at=at, tier="NO_MATCH",
                           reason="no_match")
            for n, at in enumerate(asked)
        ],
    )  # fmt: skip


def test_the_gaps_page_lists_the_first_groups_and_each_groups_latest_questions() -> None:
    """A long log's report: the page shows GROUPS_SHOWN groups and QUESTIONS_SHOWN questions each,
    the latest, and says where every one of them is; the report itself keeps them all."""
    from server.console import pages
    from server.gap_report import DocumentReport, GapReport

    groups = [_gap_group(1, pages.QUESTIONS_SHOWN + 5)]
    groups += [_gap_group(rank, 2) for rank in range(2, pages.GROUPS_SHOWN + 21)]
    documents = DocumentReport(
        never_delivered=[], most_delivered=[], split_candidates=[], reference_only=[], all=[]
    )
    report = GapReport(
        since=None, generated_at="2026-12-01T00:00:00+00:00", log_queries=True,
        questions=sum(g.size for g in groups), groups=groups, hidden_by_domain={}, documents=documents,
    )  # fmt: skip
    html = pages.gaps_page(report, "all")
    assert html.count("<details ") == pages.GROUPS_SHOWN
    assert f'id="group-{pages.GROUPS_SHOWN}"' in html and f'id="group-{pages.GROUPS_SHOWN + 1}"' not in html
    assert f"{pages.GROUPS_SHOWN} groups most sessions asked, of {len(groups)}" in html
    first = html.split('id="group-1"')[1].split("</details>")[0]
    latest = sorted(groups[0].questions, key=lambda q: q.asked_at, reverse=True)
    assert all(f">{q.question}<" in first for q in latest[: pages.QUESTIONS_SHOWN])
    assert not any(f">{q.question}<" in first for q in latest[pages.QUESTIONS_SHOWN :])
    assert "5 earlier questions" in first and pages.FULL_REPORT in first
    assert "earlier questions" not in html.split('id="group-2"')[1].split("</details>")[0]
