"""Charts as inline SVG: drawn on the server, no script, no library, nothing fetched.

Every label goes through ``html.escape``; numbers are formatted here, never taken as markup.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 720, 220
_LEFT, _BOTTOM, _TOP = 48, 28, 12
TIER_COLOURS = {
    "PRECISE": "#1b7f3b",
    "HIGHLY_RELEVANT": "#5cb85c",
    "REFERENCE": "#f0ad4e",
    "DEDUPED": "#7a8ca3",
    "NO_MATCH": "#d9534f",
}


def _frame(body: list[str], top: float, label: str) -> str:
    plot_h = HEIGHT - _BOTTOM - _TOP
    axis = [
        f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + plot_h}" stroke="#999"/>',
        f'<line x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{WIDTH}" y2="{_TOP + plot_h}" stroke="#999"/>',
        f'<text x="{_LEFT - 6}" y="{_TOP + 10}" text-anchor="end" font-size="11">{_number(top)}</text>',
        f'<text x="{_LEFT - 6}" y="{_TOP + plot_h}" text-anchor="end" font-size="11">0</text>',
    ]
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{escape(label)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="100%" preserveAspectRatio="xMinYMin meet">'
        f"<title>{escape(label)}</title>{''.join(axis + body)}</svg>"
    )


def _number(value: float) -> str:
    return f"{value:.0f}" if value >= 10 or value == int(value) else f"{value:.1f}"


def _x_labels(labels: Sequence[str], step: float) -> list[str]:
    every = max(1, len(labels) // 8)
    y = HEIGHT - 8
    return [
        f'<text x="{_LEFT + step * (i + 0.5):.1f}" y="{y}" text-anchor="middle" font-size="10">{escape(text)}</text>'
        for i, text in enumerate(labels)
        if i % every == 0
    ]


def stacked_bars(
    labels: Sequence[str], series: Sequence[Mapping[str, int]], colours: Mapping[str, str], label: str
) -> str:
    """One bar per label, stacked by the keys of ``colours`` (in that order)."""
    if not labels:
        return '<p class="empty">No data in this window.</p>'
    top = max((sum(point.values()) for point in series), default=0) or 1
    plot_h = HEIGHT - _BOTTOM - _TOP
    step = (WIDTH - _LEFT) / len(labels)
    width = min(step * 0.8, 36.0)  # one bar of a short window stays a bar, not a block
    body = []
    for i, point in enumerate(series):
        y = float(_TOP + plot_h)
        for key, colour in colours.items():
            count = point.get(key, 0)
            if not count:
                continue
            h = plot_h * count / top
            y -= h
            body.append(
                f'<rect x="{_LEFT + step * (i + 0.5) - width / 2:.1f}" y="{y:.1f}" width="{width:.1f}" '
                f'height="{h:.1f}" fill="{colour}"><title>{escape(labels[i])} {escape(key)}: {count}</title></rect>'
            )
    return _frame(body + _x_labels(labels, step), top, label)


def bars(labels: Sequence[str], values: Sequence[int], label: str, colour: str = "#3b6ea8") -> str:
    """One bar per label."""
    return stacked_bars(labels, [{"n": v} for v in values], {"n": colour}, label)


def lines(
    labels: Sequence[str], series: Mapping[str, Sequence[float]], colours: Mapping[str, str], label: str
) -> str:
    """One polyline per series, with a point per label."""
    if not labels:
        return '<p class="empty">No data in this window.</p>'
    top = max((max(values) for values in series.values() if values), default=0) or 1
    plot_h = HEIGHT - _BOTTOM - _TOP
    step = (WIDTH - _LEFT) / len(labels)
    body = []
    for name, values in series.items():
        points = " ".join(
            f"{_LEFT + step * (i + 0.5):.1f},{_TOP + plot_h - plot_h * v / top:.1f}"
            for i, v in enumerate(values)
        )
        body.append(f'<polyline fill="none" stroke="{colours[name]}" stroke-width="2" points="{points}"/>')
    legend = [
        f'<text x="{WIDTH - 10}" y="{_TOP + 12 + 14 * i}" text-anchor="end" font-size="11" '
        f'fill="{colours[name]}">{escape(name)}</text>'
        for i, name in enumerate(series)
    ]
    return _frame(body + legend + _x_labels(labels, step), top, label)
