"""The figures of docs/relevance.md, generated: held-out tables from ``calibrate --json`` reports,
and the trade-off between near-domain and answerable HIGHLY_RELEVANT.

    lookup-knowledge-mcp calibrate --json SET... > after.json
    python scripts/relevance_report.py table after.json
    python scripts/relevance_report.py tradeoff [--data-dir D] SET...

``table`` prints one markdown row per held-out set and the total. ``tradeoff`` fits, leave one
set out, for each of a few HIGHLY_RELEVANT targets (training precision, share of near-domain
questions allowed) and prints what each gives held out. Each set is ingested under
``D/calibration/<set>``, as ``calibrate`` does (incremental).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from retrieval.calibration import FitMemo, ZoneTargets, leave_one_out
from retrieval.calibration_figures import Figures
from server.cli.calibrate import load_set, shared_embedder
from server.config.loading import load_settings

COLUMNS = (
    ("questions", "questions"),
    ("codes PRECISE", "codes_precise"),
    ("false PRECISE", "false_precise"),
    ("hit@1", "hit_at_1"),
    ("right document delivered", "delivered"),
    ("documents per answer", "documents_per_answer"),
    ("answer in the content", "answer_in_content"),
    ("false NO_MATCH", "false_no_match"),
    ("HR precision", "hr_precision"),
    ("far NO_MATCH", "far_no_match"),
    ("near NO_MATCH", "near_no_match"),
    ("far HR", "far_highly_relevant"),
    ("near HR", "near_highly_relevant"),
)
# (training precision, near-domain share) pairs the trade-off is measured at.
TARGETS = ((0.85, 0.3), (0.9, 0.2), (0.92, 0.1), (0.95, 0.1), (0.95, 0.05), (0.97, 0.0))


def table(report: dict[str, Any], section: str) -> str:
    """A markdown table of one report section (held_out or configured_model), with its total."""
    rows = report[section]
    total = report.get(f"{section}_total")
    lines = [
        "| knowledge base | " + " | ".join(label for label, _ in COLUMNS) + " |",
        "|---" * (len(COLUMNS) + 1) + "|",
    ]
    for name, figures in [*rows.items(), *([("**total**", total)] if total else [])]:
        lines.append(f"| {name} | " + " | ".join(str(figures[key]) for _, key in COLUMNS) + " |")
    return "\n".join(lines)


def tradeoff(sets: list[Path], data_dir: Path | None) -> str:
    """Held-out HIGHLY_RELEVANT figures at each of TARGETS."""
    settings = load_settings(None, **({"data_dir": data_dir} if data_dir else {}))
    embedder = shared_embedder(settings)
    bases = [load_set(s, settings, embedder=embedder, progress=False) for s in sets]
    lines = [
        "| training precision | near HR allowed | HR precision | answerable right HR | near HR | far HR |",
        "|---|---|---|---|---|---|",
    ]
    memo = FitMemo()  # the rankings do not depend on the targets
    for precision, near in TARGETS:
        total = Figures()
        for held in leave_one_out(bases, ZoneTargets(precision=precision, near=near), memo):
            total.add(held.figures)
        answerable = total.all_answerable - total.codes
        lines.append(
            f"| {precision:.2f} | {near:.2f} | {total.highly_relevant_right}/{total.highly_relevant} "
            f"| {total.highly_relevant_right}/{answerable} | {total.near_highly_relevant}/{total.near} "
            f"| {total.far_highly_relevant}/{total.far} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    table_args = commands.add_parser("table", help="markdown tables from a calibrate --json report")
    table_args.add_argument("report", type=Path)
    table_args.add_argument("--section", default="held_out", choices=["held_out", "configured_model"])
    curve_args = commands.add_parser("tradeoff", help="near-domain against answerable HIGHLY_RELEVANT")
    curve_args.add_argument("--data-dir", type=Path)
    curve_args.add_argument("sets", type=Path, nargs="+")
    args = parser.parse_args()
    if args.command == "table":
        print(table(json.loads(args.report.read_text(encoding="utf-8")), args.section))
    else:
        print(tradeoff(args.sets, args.data_dir))


if __name__ == "__main__":
    main()
