"""``stats --png``: the summary as a four-panel chart (matplotlib, Agg, imported only here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from server.log_summary import tier_thresholds_line

_LEVEL_COLOURS = {
    "PRECISE": "#1a7f37",
    "HIGHLY_RELEVANT": "#4c9a2a",
    "REFERENCE": "#d4a72c",
    "DEDUPED": "#8c959f",
    "NO_MATCH": "#cf222e",
}


class ChartError(RuntimeError):
    """The chart cannot be drawn or written."""


def write_png(summary: dict[str, Any], path: Path) -> None:
    """Draw tiers, dedup reasons, the top-similarity histogram and the headline figures."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ChartError("stats --png needs matplotlib: pip install 'lookup-knowledge-mcp[charts]'") from exc

    # A bare Figure with the Agg canvas: no pyplot, no global backend switch.
    figure = Figure(figsize=(12, 8), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    levels, reasons, similarity, headline = figure.subplots(2, 2).flat

    tiers = summary["relevance_levels"]
    levels.bar(list(tiers), list(tiers.values()), color=[_LEVEL_COLOURS.get(t, "#57606a") for t in tiers])
    levels.set_title("Relevance levels (lookup_knowledge)")
    levels.set_ylabel("calls")
    levels.tick_params(axis="x", labelrotation=20)

    dedup = summary["dedup_reasons"]
    reasons.barh(list(dedup), list(dedup.values()), color="#0969da")
    reasons.invert_yaxis()
    reasons.set_title("Dedup reasons (lookup_knowledge)")
    reasons.set_xlabel("calls")

    _similarity(similarity, summary["top_similarity"])

    headline.axis("off")
    headline.set_title("Headline figures")
    headline.text(0.0, 1.0, _headline(summary), va="top", family="monospace", fontsize=9, wrap=True)

    window = summary["window"]
    scope = f"since {window['since']}" if window["since"] else "all time"
    if window["session"]:
        scope += f", session {window['session']}"
    figure.suptitle(f"lookup-knowledge-mcp invocation log: {summary['calls']['total']} calls ({scope})")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, format="png")
    except OSError as exc:
        raise ChartError(f"cannot write chart to {str(path)!r}: {exc.strerror or exc}") from exc


def _similarity(axes: Any, similarity: dict[str, Any]) -> None:
    axes.set_title("Top similarity per lookup (l1_top_similarity)")
    axes.set_xlabel(f"cosine similarity ({similarity.get('embedder') or 'unknown embedder'})")
    axes.set_ylabel("lookups")
    bins = similarity["bins"]
    if not bins:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
        return
    width = similarity["bin_width"]
    axes.bar(
        [b["from"] for b in bins],
        [b["count"] for b in bins],
        width=width,
        align="edge",
        color="#8250df",
        edgecolor="white",
    )


def _headline(summary: dict[str, Any]) -> str:
    redundant, blocked, sessions = summary["redundant_calls"], summary["blocked_calls"], summary["sessions"]
    rate = f"{redundant['rate']:.1%}" if redundant["rate"] is not None else "n/a"
    lines = [f"{tool:<24}{count:>6} calls" for tool, count in summary["calls"]["by_tool"].items()]
    lines += [
        "",
        f"redundant-call rate   {rate} ({redundant['count']}/{redundant['lookups']})",
        f"blocked calls         {blocked['count']}",
        f"errors                {summary['errors']}",
        f"sessions              {sessions['count']}",
        f"calls/session         median {sessions['calls_per_session']['median']}, "
        f"max {sessions['calls_per_session']['max']}",
    ]
    # One line per tool: the panel has room for about 20 lines at this size.
    lines += ["", "latency (p50 / p95)"]
    width = max(map(len, summary["latency_ms"]), default=0) + 2
    lines += [
        f"  {tool:<{width}}{t['p50']:.1f} / {t['p95']:.1f} ms" for tool, t in summary["latency_ms"].items()
    ]
    thresholds = tier_thresholds_line(summary.get("tier_thresholds"))
    return "\n".join([*lines, "", thresholds] if thresholds else lines)
