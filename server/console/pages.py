"""The console's pages as HTML strings: every value escaped, no script, charts as inline SVG.

The pages hold no absolute path (documents are named by their key in the knowledge base) and,
when ``log.log_queries`` is off, no query text: the callers pass ``show_queries``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from typing import Any
from urllib.parse import urlencode

from retrieval.models import KnowledgeMap
from server.console import svg
from server.gap_report import DocumentOut, GapGroupOut, GapReport
from storage.log_digest import Overview, SessionRow

PREFIX = "/console"
PAGES = (
    ("", "Overview"),
    ("/gaps", "Gaps"),
    ("/documents", "Documents"),
    ("/sessions", "Sessions"),
    ("/map", "Knowledge map"),
)
WINDOWS = ("24h", "7d", "30d", "all")
HIDDEN = "(not logged)"
# The gaps page lists the groups most sessions asked first and each group's latest questions: a
# 100,000-row log made it 2.5 MB with every question of every group, which a browser renders
# slowly and which the serving process must pass on. ``gaps --json`` has every question.
GROUPS_SHOWN = 100
QUESTIONS_SHOWN = 10
FULL_REPORT = "lookup-knowledge-mcp gaps --json"
_STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{background:#1d2f4a;color:#fff;padding:10px 20px;display:flex;gap:18px;align-items:center;flex-wrap:wrap}
header a{color:#cfe0ff;text-decoration:none}header a.on{color:#fff;font-weight:600;border-bottom:2px solid #fff}
main{padding:16px 20px;max-width:1100px}h1{font-size:20px;margin:4px 0 12px}h2{font-size:16px;margin:20px 0 8px}
table{border-collapse:collapse;background:#fff;width:100%;margin:6px 0 14px}
th,td{border:1px solid #dde2ea;padding:4px 8px;text-align:left;vertical-align:top}th{background:#eef1f5}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{background:#fff;border:1px solid #dde2ea;border-radius:6px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:22px}.windows a{margin-right:8px}.note{color:#5a6577}
details{background:#fff;border:1px solid #dde2ea;border-radius:6px;margin:6px 0;padding:6px 10px}
summary{cursor:pointer}.empty{color:#5a6577;font-style:italic}.legend span{margin-right:12px}
.chart{background:#fff;border:1px solid #dde2ea;border-radius:6px;padding:8px;max-width:760px}
"""


def e(value: Any) -> str:
    """Any value as escaped text (quotes too: it may land in an attribute)."""
    return escape("" if value is None else str(value), quote=True)


def when(ts: float | None) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M") if ts is not None else ""


def link(path: str, since: str, **params: str) -> str:
    return e(f"{PREFIX}{path}?{urlencode({'since': since, **params})}")


def layout(title: str, path: str, since: str, body: str) -> str:
    """The whole page: header with the page links and the window choice, then ``body``."""
    nav = "".join(
        f'<a href="{link(p, since)}"{" class=on" if p == path else ""}>{e(name)}</a>' for p, name in PAGES
    )
    windows = " ".join(
        f'<a href="{link(path, w)}">{"<b>" + e(w) + "</b>" if w == since else e(w)}</a>' for w in WINDOWS
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{e(title)} · lookup-knowledge-mcp</title>"
        '<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
        f"<style>{_STYLE}</style></head><body><header><strong>lookup-knowledge-mcp</strong>{nav}</header>"
        f'<main><h1>{e(title)}</h1><p class="windows">Window: {windows}</p>{body}</main></body></html>'
    )


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    numeric: Sequence[int] = (),
    raw: Sequence[int] = (),
    ident: str = "",
) -> str:
    """A table; columns in ``numeric`` align right, cells in ``raw`` are markup built here (already escaped)."""
    head = "".join(f"<th{' class=n' if i in numeric else ''}>{h}</th>" for i, h in enumerate(headers))
    body = "".join(
        "<tr>"
        + "".join(
            f"<td{' class=n' if i in numeric else ''}>{cell if i in raw else e(cell)}</td>"
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return (
        f"<table{f' id={e(ident)}' if ident else ''}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        if body
        else '<p class="empty">None.</p>'
    )


def _card(label: str, value: Any, ident: str) -> str:
    return f'<div class="card" id="{e(ident)}">{e(label)}<b>{e(value)}</b></div>'


def _ms(value: float | None) -> str:
    return f"{value:.1f} ms" if value is not None else "n/a"


def _bucket_label(bucket: int, seconds: int) -> str:
    moment = datetime.fromtimestamp(bucket * seconds, UTC)
    return moment.strftime("%m-%d %H:00" if seconds < 86400 else "%Y-%m-%d")


def overview_page(data: Overview, since: str) -> str:
    """Calls per hour or day, tier mix, latency, refusals and water levels."""
    cards = "".join(
        [
            _card("calls", data.total_calls, "calls"),
            _card("lookups", data.lookups, "lookups"),
            _card("sessions", data.sessions, "sessions"),
            _card("lookup p50", _ms(data.p50_ms), "p50"),
            _card("lookup p95", _ms(data.p95_ms), "p95"),
            _card("blocked calls", data.blocked, "blocked"),
            _card("refused calls (errors)", data.refused, "refused"),
        ]
    )
    buckets = sorted(set(data.calls) | set(data.tiers))
    labels = [_bucket_label(b, data.bucket_seconds) for b in buckets]
    per = "hour" if data.bucket_seconds < 86400 else "day"
    legend = "".join(f'<span style="color:{c}">■ {e(t)}</span>' for t, c in svg.TIER_COLOURS.items())
    latency = {
        "p50": [data.latency.get(b, (0.0, 0.0))[0] for b in buckets],
        "p95": [data.latency.get(b, (0.0, 0.0))[1] for b in buckets],
    }
    water = [(level, count) for level, count in sorted(data.water_levels.items())]
    body = (
        f'<div class="cards">{cards}</div>'
        f'<h2>Calls per {per}</h2><div class="chart">'
        f"{svg.bars(labels, [data.calls.get(b, 0) for b in buckets], f'calls per {per}')}</div>"
        f'<h2>Tier mix per {per}</h2><p class="legend">{legend}</p><div class="chart">'
        f"{svg.stacked_bars(labels, [data.tiers.get(b, {}) for b in buckets], svg.TIER_COLOURS, 'tier mix')}</div>"
        f'<h2>Lookup latency per {per} (ms)</h2><div class="chart">'
        f"{svg.lines(labels, latency, {'p50': '#3b6ea8', 'p95': '#d9534f'}, 'lookup latency')}</div>"
        "<h2>Highest water level reached, per session</h2>"
        f"{table(['water level', 'sessions'], water, numeric=[1])}"
        "<h2>Refused calls (errors) by tool</h2>"
        f"{table(['tool', 'calls'], sorted(data.errors_by_tool.items()), numeric=[1])}"
    )
    return layout("Overview", "", since, body)


def gaps_page(report: GapReport, since: str) -> str:
    """Groups by sessions affected, each expandable to its questions; domain counts when queries are hashed."""
    parts = [
        f'<p id="gap-total">{e(report.questions)} questions the knowledge base could not answer.</p>',
        _made(report),
    ]
    if report.message:
        parts.append(f'<p class="note" id="not-logged">{e(report.message)}</p>')
    if report.hidden_by_domain:
        parts.append("<h2>Questions by domain (text not logged)</h2>")
        parts.append(table(["domain", "questions"], report.hidden_by_domain.items(), numeric=[1]))
    parts.append("<h2>Groups, most sessions first</h2>")
    shown = report.groups[:GROUPS_SHOWN]
    if len(report.groups) > len(shown):
        parts.append(
            f'<p class="note" id="groups-cut">The {len(shown)} groups most sessions asked, of'
            f" {len(report.groups)}; all of them: <code>{e(FULL_REPORT)}</code>.</p>"
        )
    rows = []
    for g in shown:
        nearest = f"{g.nearest_document} ({g.nearest_similarity:.2f})" if g.nearest_document else "none"
        rows.append(
            [
                g.rank,
                g.size,
                g.sessions,
                " · ".join(g.examples),
                when_iso(g.first_seen),
                when_iso(g.last_seen),
                nearest,
                g.best_tier,
            ]
        )
    parts.append(
        table(
            [
                "#",
                "questions",
                "sessions",
                "examples",
                "first seen",
                "last seen",
                "nearest document",
                "best tier",
            ],
            rows,
            numeric=[0, 1, 2],
        )
    )
    parts += [_group_details(g) for g in shown]
    return layout("Knowledge gaps", "/gaps", since, "".join(parts))


def _group_details(g: GapGroupOut) -> str:
    """A group, expandable to its latest QUESTIONS_SHOWN questions."""
    latest = sorted(g.questions, key=lambda q: q.asked_at, reverse=True)[:QUESTIONS_SHOWN]
    questions = table(
        ["asked", "question", "session", "tier", "why"],
        [[when_iso(q.asked_at), q.question, q.session or "", q.tier, q.reason] for q in latest],
    )
    more = len(g.questions) - len(latest)
    if more:
        questions += f'<p class="note">{more} earlier questions: <code>{e(FULL_REPORT)}</code>.</p>'
    return (
        f'<details id="group-{g.rank}"><summary>Group {g.rank}: {e(g.examples[0] if g.examples else "")}'
        f" — {e(g.size)} questions, {e(g.sessions)} sessions</summary>{questions}</details>"
    )


def _made(report: GapReport) -> str:
    return f'<p class="note">Report made {e(when_iso(report.generated_at))} UTC; rebuilt at most once a minute.</p>'


def when_iso(text: str) -> str:
    return text.replace("T", " ").removesuffix("+00:00")[:16]


DOC_COLUMNS = (
    "doc_key",
    "domain",
    "delivered",
    "sessions",
    "precise",
    "highly_relevant",
    "reference",
    "read_further",
)


def documents_page(report: GapReport, since: str, sort: str, descending: bool) -> str:
    """Usage of every document, sortable by any column (links: works without script)."""
    key = sort if sort in DOC_COLUMNS else "delivered"

    def value(doc: DocumentOut) -> tuple[Any, str]:
        field = getattr(doc, key)
        return (field if field is not None else ("" if key in ("doc_key", "domain") else 0), doc.doc_key)

    docs: list[DocumentOut] = sorted(report.documents.all, key=value, reverse=descending)
    headers = [
        f'<a href="{link("/documents", since, sort=c, order="asc" if c == key and descending else "desc")}">'
        f"{e(c.replace('_', ' '))}{' ▼' if c == key and descending else ' ▲' if c == key else ''}</a>"
        for c in DOC_COLUMNS
    ]
    rows = [[getattr(d, c) for c in DOC_COLUMNS] for d in docs]
    lists = report.documents
    body = (
        _made(report)
        + table(headers, rows, numeric=[2, 3, 4, 5, 6, 7], ident="documents")
        + "<h2>Never delivered in this window</h2>"
        + table(["document"], [[k] for k in lists.never_delivered])
        + "<h2>Split candidates: delivered partial, then read further</h2>"
        + table(
            ["document", "read further"],
            [[d.doc_key, d.read_further] for d in lists.split_candidates],
            numeric=[1],
        )
        + "<h2>Often REFERENCE, never HIGHLY_RELEVANT or PRECISE</h2>"
        + table(
            ["document", "as reference"],
            [[d.doc_key, d.reference] for d in lists.reference_only],
            numeric=[1],
        )
    )
    return layout("Documents", "/documents", since, body)


def sessions_page(
    rows: Sequence[SessionRow], calls: dict[str, list[dict[str, Any]]], since: str, show_queries: bool
) -> str:
    """Per session: calls, content delivered, water level, where governance stopped it."""
    summary = table(
        [
            "session",
            "first call",
            "last call",
            "calls",
            "lookups",
            "documents",
            "content tokens",
            "water level",
            "blocked",
            "stopped at lookup",
        ],
        [
            [
                s.session_key,
                when(s.first_ts),
                when(s.last_ts),
                s.calls,
                s.lookups,
                s.documents,
                s.content_tokens,
                s.water_level or "",
                s.blocked,
                s.stopped_at or "",
            ]
            for s in rows
        ],
        numeric=[3, 4, 5, 6, 8, 9],
        ident="sessions",
    )
    parts = [summary]
    for s in rows:
        detail = table(
            ["#", "tool", "query", "tier", "documents", "water", "next"],
            [
                [
                    c["call_index"] or "",
                    c["tool"],
                    (c["query"] or "") if show_queries else HIDDEN,
                    c["tier"] or ("error" if c["error"] else ""),
                    ", ".join(c["docs"]),
                    c["water_level"] or "",
                    c["next_call"] or "",
                ]
                for c in calls.get(s.session_key, [])
            ],
        )
        parts.append(f"<details><summary>{e(s.session_key)} — {e(s.calls)} calls</summary>{detail}</details>")
    return layout("Sessions", "/sessions", since, "".join(parts))


def map_page(knowledge_map: KnowledgeMap, delivered: dict[str, int], since: str) -> str:
    """Domains, what they cover, and how often the window delivered from each."""
    names = [d.domain_id for d in knowledge_map.domains]
    chart = svg.bars(names, [delivered.get(n, 0) for n in names], "deliveries per domain")
    rows = [
        [
            d.domain_id,
            d.document_count,
            delivered.get(d.domain_id, 0),
            d.description,
            ", ".join(d.covers[:12]),
            d.when_to_retrieve,
        ]
        for d in knowledge_map.domains
    ]
    body = (
        f"<p>{e(knowledge_map.document_count)} documents in {e(len(names))} domains.</p>"
        f'<h2>Deliveries per domain</h2><div class="chart">{chart}</div>'
        + table(
            ["domain", "documents", "delivered", "description", "covers", "when to retrieve"],
            rows,
            numeric=[1, 2],
        )
    )
    return layout("Knowledge map", "/map", since, body)


def pending_page(path: str, since: str) -> str:
    """Shown while a window's first gap report is built: reloads itself (a meta refresh, no script)."""
    page = path.removeprefix(PREFIX)
    body = (
        '<p class="note" id="pending">The gap report for this window is being built (the logged questions '
        "are embedded once); this page reloads in a few seconds.</p>"
    )
    html = layout("Building the report", page, since, body)
    return html.replace("<head>", '<head><meta http-equiv="refresh" content="3">', 1)


def busy_page(since: str, retry_s: int) -> str:
    """Shown when too many pages are asked for at once: reloads itself after ``retry_s`` seconds."""
    body = (
        '<p class="note" id="busy">The console is building other pages; this page reloads in a '
        "few seconds.</p>"
    )
    html = layout("Busy", "", since, body)
    return html.replace("<head>", f'<head><meta http-equiv="refresh" content="{int(retry_s)}">', 1)


def message_page(title: str, text: str, since: str) -> str:
    return layout(title, "", since, f'<p class="note">{e(text)}</p>')
