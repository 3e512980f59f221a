"""``lookup-knowledge-mcp gaps``: the questions the knowledge base could not answer, and document usage.

It reads ``<data_dir>/log.sqlite`` (read-only) and opens the retrieval stack for the embedder
and the nearest documents, so it loads the model; it works beside a running server.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
from typing import Any

from server.cli.commands import open_checked
from server.cli.errors import CommandError
from server.cli.stats import StatsArgumentError, parse_since
from server.config.settings import Settings
from server.gap_report import GapReport, GapReporter, RuntimeSources
from storage.schema import SchemaVersionError


def render_text(report: GapReport) -> str:
    """The terminal report: groups by sessions affected, then the document usage lists."""
    scope = f"since {report.since}" if report.since else "all time"
    lines = [f"Knowledge gaps ({scope}): {report.questions} questions the knowledge base could not answer"]
    if report.message:
        lines.append(report.message)
    if report.hidden_by_domain:
        lines += ["", "Questions by domain (text not logged)"]
        lines += [f"  {domain}: {count}" for domain, count in report.hidden_by_domain.items()]
    for group in report.groups:
        nearest = (
            f"{group.nearest_document} (similarity {group.nearest_similarity:.2f})"
            if group.nearest_document and group.nearest_similarity is not None
            else "none"
        )
        lines += [
            "",
            f"{group.rank}. {group.size} questions from {group.sessions} sessions, "
            f"{group.first_seen} to {group.last_seen}",
            *(f"   - {example}" for example in group.examples),
            f"   nearest document: {nearest}; best tier given: {group.best_tier}",
        ]
    docs = report.documents
    lines += ["", f"Documents never delivered: {len(docs.never_delivered)}"]
    lines += [f"  {key}" for key in docs.never_delivered]
    lines += ["Most delivered:"] + [f"  {d.delivered:>5}  {d.doc_key}" for d in docs.most_delivered]
    lines += ["Split candidates (delivered partial, then read further):"]
    lines += [f"  {d.read_further:>5}  {d.doc_key}" for d in docs.split_candidates] or ["  (none)"]
    lines += ["Often REFERENCE, never HIGHLY_RELEVANT:"]
    lines += [f"  {d.reference:>5}  {d.doc_key}" for d in docs.reference_only] or ["  (none)"]
    return "\n".join(lines)


async def build_report(settings: Settings, since: float | None) -> GapReport:
    """Open the stack, build one report, close the stack."""
    runtime = await asyncio.to_thread(open_checked, settings)
    try:
        reporter = GapReporter(RuntimeSources(runtime), settings.log_path)
        return await reporter.report(since, log_queries=settings.log.log_queries)
    finally:
        runtime.close()


async def cmd_gaps(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    """The ``gaps`` command: print the report as text or --json."""
    try:
        since = None if args.since == "all" else parse_since(args.since)
    except StatsArgumentError as exc:
        raise CommandError(str(exc)) from exc
    path = settings.log_path
    if not path.exists():
        raise CommandError(
            f"no invocation log at {str(path)!r}: no server has logged calls under this data directory "
            "(check --data-dir; `serve` writes the log while log.enabled is true)"
        )
    try:
        report = await build_report(settings, since)
    except SchemaVersionError as exc:
        raise CommandError(str(exc)) from exc
    except sqlite3.Error as exc:
        raise CommandError(f"cannot read the invocation log {str(path)!r}: {exc}") from exc
    print(report.model_dump_json(indent=2) if args.json else render_text(report))
    return 0
