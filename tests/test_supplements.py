"""Which other documents go with an answer: the supplement margin, fitted by calibrate and used by a lookup."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
import yaml
from mcp import Client

from retrieval import calibration
from retrieval.calibration_sets import KnowledgeBase, LabelledQuery
from retrieval.models import Tier
from retrieval.relevance import DEFAULT_SUPPLEMENT_MARGIN
from server.config.loading import load_settings


def _graded(tier: Tier, *scored: tuple[str, float]) -> SimpleNamespace:
    return SimpleNamespace(tier=tier, ranked=[SimpleNamespace(doc_key=k, score=s) for k, s in scored])


def _base(cases: list[tuple[LabelledQuery, SimpleNamespace]]) -> KnowledgeBase:
    queries = [query for query, _ in cases]
    return KnowledgeBase("set", view=None, chunks={}, queries=queries, evidence=[g for _, g in cases])  # type: ignore[arg-type]


def test_the_fitted_margin_covers_every_highly_relevant_answer_ranked_below_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # grade_evidence is replaced by the prepared grading: each "evidence" here is its Graded.
    monkeypatch.setattr(calibration, "grade_evidence", lambda evidence, view, model: evidence)
    cases = [
        (LabelledQuery("q1", "b"), _graded(Tier.HIGHLY_RELEVANT, ("a", 0.90), ("b", 0.85), ("c", 0.5))),
        (LabelledQuery("q2", "c"), _graded(Tier.HIGHLY_RELEVANT, ("a", 0.90), ("b", 0.85), ("c", 0.78))),
        # Not counted: first already right, graded REFERENCE (sends all), beyond top_k, a code, off-topic.
        (LabelledQuery("q3", "a"), _graded(Tier.HIGHLY_RELEVANT, ("a", 0.90), ("b", 0.10))),
        (LabelledQuery("q4", "c"), _graded(Tier.REFERENCE, ("a", 0.90), ("b", 0.5), ("c", 0.1))),
        (
            LabelledQuery("q5", "d"),
            _graded(Tier.HIGHLY_RELEVANT, ("a", 0.9), ("b", 0.8), ("c", 0.7), ("d", 0.0)),
        ),
        (LabelledQuery("q6", "b", kind="code"), _graded(Tier.HIGHLY_RELEVANT, ("a", 0.9), ("b", 0.0))),
        (LabelledQuery("q7", None, kind="offtopic"), _graded(Tier.HIGHLY_RELEVANT, ("a", 0.9), ("b", 0.0))),
    ]
    model: Any = None
    assert calibration._fit_supplement_margin([_base(cases)], model) == pytest.approx(0.1201)
    assert calibration._fit_supplement_margin([_base(cases[2:])], model) == DEFAULT_SUPPLEMENT_MARGIN


def _config(tmp_path: Path, margin: float) -> Path:
    model = load_settings(None, data_dir=tmp_path).tier_model.model_dump()
    model["supplement_margin"] = margin
    path = tmp_path / f"margin-{margin}.yaml"
    path.write_text(yaml.safe_dump({"relevance": {"models": {"e5-small": model}}}), encoding="utf-8")
    return path


async def test_a_highly_relevant_lookup_sends_the_documents_within_the_margin(
    make_server: Any, tmp_path: Path
) -> None:
    query = "how long is a webhook retried"
    sent = {}
    for margin in (0.0, 2.0):
        with anyio.fail_after(120):
            async with Client(make_server(_config(tmp_path, margin)), mode="legacy") as client:
                result = await client.call_tool("lookup_knowledge", {"query": query, "top_k": 3})
        content = result.structured_content
        assert content is not None and content["relevance_level"] == "HIGHLY_RELEVANT", content
        sent[margin] = [content["primary"]["doc_key"], *(d["doc_key"] for d in content["supplement"])]
    assert len(sent[0.0]) == 1
    assert len(sent[2.0]) == 3 and sent[2.0][0] == sent[0.0][0]
