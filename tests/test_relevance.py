"""Relevance grading, similarity normalisation and completeness hints."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from retrieval.relevance import (
    Thresholds,
    Tier,
    completeness_hint,
    cosine_to_similarity,
    detect_language,
    grade,
)

T = Thresholds(highly_relevant=0.75, reference=0.5)


def test_cosine_to_similarity_equals_the_predecessor_formula_on_squared_l2() -> None:
    # On unit vectors Milvus' squared L2 distance is 2 - 2cos; the predecessor's 1 - min(d, 2)/2
    # is then max(cos, 0), which is what we compute from the COSINE metric.
    for cos in (1.0, 0.8085, 0.5, 0.1, 0.0, -0.3, -1.0):
        squared_l2 = 2 - 2 * cos
        predecessor = 1 - min(squared_l2, 2) / 2
        assert math.isclose(cosine_to_similarity(cos), predecessor, abs_tol=1e-12)


@pytest.mark.parametrize(
    ("l0", "best_l0", "top", "expected"),
    [
        (1, None, None, Tier.PRECISE),
        (1, 0.1, 0.1, Tier.PRECISE),
        (2, 0.8, 0.8, Tier.HIGHLY_RELEVANT),
        (2, 0.6, 0.9, Tier.HIGHLY_RELEVANT),
        (2, 0.6, 0.6, Tier.REFERENCE),
        (2, None, None, Tier.REFERENCE),
        (0, None, 0.75, Tier.HIGHLY_RELEVANT),
        (0, None, 0.74, Tier.REFERENCE),
        (0, None, 0.5, Tier.REFERENCE),
        (0, None, 0.49, Tier.NO_MATCH),
        (0, None, None, Tier.NO_MATCH),
    ],
)
def test_grade_follows_the_tier_table(
    l0: int, best_l0: float | None, top: float | None, expected: Tier
) -> None:
    assert grade(l0_match_count=l0, best_l0_similarity=best_l0, top_similarity=top, thresholds=T) is expected


def test_thresholds_reject_reference_above_highly_relevant() -> None:
    with pytest.raises(ValidationError, match="reference"):
        Thresholds(highly_relevant=0.5, reference=0.6)


def test_every_tier_has_an_english_and_a_chinese_hint() -> None:
    for tier in Tier:
        assert completeness_hint(tier, "en").isascii()
        assert not completeness_hint(tier, "zh").isascii()
    assert "no more precise document" in completeness_hint(Tier.PRECISE, "en").lower()


def test_language_follows_the_query_script() -> None:
    assert detect_language("ERR_TIMEOUT 是什么") == "zh"
    assert detect_language("what is ERR_TIMEOUT") == "en"
