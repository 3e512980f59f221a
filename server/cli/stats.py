"""``lookup-knowledge-mcp stats``: the invocation-log summary as text, JSON or a chart.

It only reads ``<data_dir>/log.sqlite`` (never Milvus), so it works beside a running server.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sqlite3
import sys
import time
from datetime import UTC, datetime
from typing import Any

from server.cli.errors import CommandError
from server.config.settings import Settings
from server.log_summary import summarize, tier_thresholds_line
from storage.schema import SchemaVersionError
from storage.stats_queries import LogStats, read_log_stats

logger = logging.getLogger(__name__)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_BAR = "█"
_BAR_WIDTH = 32


class StatsArgumentError(ValueError):
    """A stats option has a value that cannot be used; the message names it."""


def parse_since(text: str, *, now: float | None = None) -> float:
    """``24h``, ``30m``, ``7d``, ``2w``, ``90s`` before now, or an ISO 8601 date/time, as unix seconds."""
    now = time.time() if now is None else now
    match = _DURATION.match(text)
    if match:
        return now - float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise StatsArgumentError(
            f"--since must be a duration like 24h, 30m, 7d or an ISO date, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _bars(counts: dict[str, int], *, indent: str = "  ") -> list[str]:
    if not counts:
        return [f"{indent}(none)"]
    label_width = max(len(label) for label in counts)
    top = max(counts.values()) or 1
    lines = []
    for label, count in counts.items():
        bar = _BAR * max(1 if count else 0, round(_BAR_WIDTH * count / top))
        lines.append(f"{indent}{label:<{label_width}}  {count:>6}  {bar}".rstrip())
    return lines


def _similarity_lines(similarity: dict[str, Any]) -> list[str]:
    if not similarity["bins"]:
        return ["  (no lookup with an L1 similarity)"]
    counts = {f"{b['from']:.3f}-{b['to']:.3f}": b["count"] for b in similarity["bins"]}
    return [*_bars(counts), f"  embedder: {similarity.get('embedder') or 'unknown'}"]


def render_text(summary: dict[str, Any]) -> str:
    """The terminal report: counts, distributions with text bars, rates and latency."""
    window = summary["window"]
    scope = f"since {window['since']}" if window["since"] else "all time"
    if window["session"]:
        scope += f", session {window['session']}"
    calls = summary["calls"]
    lines = [f"Invocation log {summary['log']['path']} ({scope})"]
    if not calls["total"]:
        lines.append("No calls logged in this window.")
        return "\n".join(lines)
    lines.append(f"{calls['total']} calls from {window['first_call']} to {window['last_call']}")
    lines += ["", "Calls per tool", *_bars(calls["by_tool"])]
    lines += ["", "Relevance levels (lookup_knowledge)", *_bars(summary["relevance_levels"])]
    lines += ["", "Dedup reasons (lookup_knowledge)", *_bars(summary["dedup_reasons"])]
    lines += ["", "Top similarity (l1_top_similarity)", *_similarity_lines(summary["top_similarity"])]
    thresholds = tier_thresholds_line(summary.get("tier_thresholds"))
    if thresholds:
        lines += ["", thresholds]
    sessions = summary["sessions"]
    redundant, blocked = summary["redundant_calls"], summary["blocked_calls"]
    rate = f"{redundant['rate']:.1%}" if redundant["rate"] is not None else "n/a"
    reasons = ", ".join(f"{k} {v}" for k, v in blocked["by_reason"].items())
    lines += [
        "",
        f"Sessions: {sessions['count']}; calls per session median {sessions['calls_per_session']['median']}, "
        f"max {sessions['calls_per_session']['max']}; lookups per session median "
        f"{sessions['lookups_per_session']['median']}, max {sessions['lookups_per_session']['max']}",
        f"Redundant-call rate: {rate} ({redundant['count']} of {redundant['lookups']} lookups "
        "returned no document new to the session)",
        f"Blocked calls: {blocked['count']} ({reasons})",
        f"Errors: {summary['errors']}",
    ]
    for tool, latency in summary["latency_ms"].items():
        lines.append(f"Latency {tool}: p50 {latency['p50']:.1f} ms, p95 {latency['p95']:.1f} ms")
    if summary["missed_rows"]:
        lines.append(f"Calls answered but missing from the log (write failures): {summary['missed_rows']}")
    return "\n".join(lines)


def _read_log(settings: Settings, since: float | None, session_key: str | None) -> LogStats:
    """The log's aggregates; a missing or unreadable log is a CommandError naming the file."""
    path = settings.log_path
    if not path.exists():
        # Not "no calls": with no file nothing was ever logged here, most often a wrong --data-dir.
        raise CommandError(
            f"no invocation log at {str(path)!r}: no server has logged calls under this data "
            "directory (check --data-dir; `serve` writes the log while log.enabled is true)"
        )
    try:
        return read_log_stats(path, since=since, session_key=session_key)
    except SchemaVersionError as exc:  # its message names the file already
        raise CommandError(str(exc)) from exc
    except sqlite3.Error as exc:
        raise CommandError(f"cannot read the invocation log {str(path)!r}: {exc}") from exc


def cmd_stats(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    """The ``stats`` command: print the summary (text or --json) and optionally draw --png."""
    try:
        # `is not None`: an empty --since is a value to refuse, not "all time".
        since = parse_since(args.since) if args.since is not None else None
    except StatsArgumentError as exc:
        raise CommandError(str(exc)) from exc
    raw = _read_log(settings, since, args.session)
    summary = summarize(raw, since=since, session_key=args.session)
    if args.json:
        print(json.dumps(summary, ensure_ascii=False, indent=2))
    else:
        print(render_text(summary))
    if args.png is not None:
        from server.cli.stats_chart import ChartError, write_png

        try:
            write_png(summary, args.png)
        except ChartError as exc:
            raise CommandError(str(exc)) from exc
        print(f"chart written to {args.png}", file=sys.stderr)
    return 0
