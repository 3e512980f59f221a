"""Targeted follow-ups on the evaluation sets: does a lookup with missing_dimension bring the fact?

Each case is one session: the opening question (``query``), then the same query with a
``missing_dimension`` naming a fact its first result did not carry. A case whose first result
already carried the labelled answer is skipped. Counted: the targeted result delivered the
labelled document, and the labelled answer is in its content.

- ``examples/eval/targeted-followups.jsonl``: 64 cases with short dimensions, as an agent names
  what it lacks;
- ``--whole-questions``: for every answerable question of each set, the next question of its
  domain opens the session and the question itself is the dimension (on another document, and
  on the same document when one exists).

    python scripts/targeted_followups.py [--whole-questions] [--data-dir D]

Each set is ingested under ``D/calibration/<set>``, as ``calibrate`` does (incremental).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from retrieval.requests import LookupRequest  # noqa: E402
from server.cli.calibrate import KB_DIR, QUESTIONS_FILE  # noqa: E402
from server.config.loading import load_settings  # noqa: E402
from server.container import Runtime, lookup_service, open_runtime  # noqa: E402

EVAL = ROOT / "examples" / "eval"


def _squashed(text: str) -> str:
    return "".join(text.lower().split())


def short_cases() -> list[dict[str, Any]]:
    lines = (EVAL / "targeted-followups.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def whole_question_cases(name: str) -> Iterator[dict[str, Any]]:
    lines = (EVAL / name / QUESTIONS_FILE).read_text(encoding="utf-8").splitlines()
    questions = [q for q in map(json.loads, lines) if q.get("doc") and q.get("kind") != "code"]
    for i, wanted in enumerate(questions):
        domain = wanted["doc"].split("/")[0]
        others = [q for q in questions[i + 1 :] + questions[:i] if q["doc"].split("/")[0] == domain]
        for same_doc in (False, True):
            opener = next((q for q in others if (q["doc"] == wanted["doc"]) == same_doc), None)
            if opener is not None and opener["query"] != wanted["query"]:
                yield {
                    "set": name,
                    "query": opener["query"],
                    "missing_dimension": wanted["query"],
                    "doc": wanted["doc"],
                    "answer": wanted["answer"],
                    "same_doc": same_doc,
                }


def _contents(result: Any) -> list[Any]:
    return [d for d in [result.primary, *result.supplement] if d is not None]


async def run(cases: list[dict[str, Any]], data_dir: Path) -> dict[str, Counter[str]]:
    runtimes: dict[str, Runtime] = {}
    figures: dict[str, Counter[str]] = {"other document": Counter(), "same document": Counter()}
    try:
        for n, case in enumerate(cases):
            name = case["set"]
            if name not in runtimes:
                runtimes[name] = open_runtime(load_settings(None, data_dir=data_dir / "calibration" / name))
                report = runtimes[name].ingestor().run(EVAL / name / KB_DIR)
                print(f"{name}: {report.summary()}", file=sys.stderr)
            service = lookup_service(runtimes[name])
            counts = figures["same document" if case["same_doc"] else "other document"]
            answer = _squashed(case["answer"])
            session = {"session_key": f"followup-{n}", "scope": "explicit"}
            first = await service.lookup(LookupRequest(case["query"]), **session)  # type: ignore[arg-type]
            if any(answer in _squashed(d.content) for d in _contents(first.result)):
                counts["answered by the opening lookup"] += 1
                continue
            targeted = LookupRequest(case["query"], missing_dimension=case["missing_dimension"])
            result = (await service.lookup(targeted, **session)).result  # type: ignore[arg-type]
            counts["cases"] += 1
            counts["document delivered"] += any(d.doc_key == case["doc"] for d in _contents(result))
            counts["answer in content"] += any(answer in _squashed(d.content) for d in _contents(result))
            counts[f"tier {result.relevance_level.value}"] += 1
    finally:
        for runtime in runtimes.values():
            runtime.close()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--whole-questions", action="store_true", help="dimensions that are whole questions")
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="where the sets are ingested")
    args = parser.parse_args()
    sets = ("saas-support", "factory-ops", "company-policies", "data-platform")
    cases = [c for s in sets for c in whole_question_cases(s)] if args.whole_questions else short_cases()
    for kind, counts in asyncio.run(run(cases, args.data_dir)).items():
        print(kind + ": " + ", ".join(f"{key} {value}" for key, value in sorted(counts.items())))


if __name__ == "__main__":
    main()
