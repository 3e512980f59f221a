"""Relevance grading from features, the logistic tier model, and completeness hints."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from retrieval.logistic import fit_logistic
from retrieval.models import Tier
from retrieval.relevance import Logistic, TierModel, completeness_hint, grade
from storage.text import detect_language

MODEL = TierModel(
    on_topic=Logistic(weights={"similarity": 20.0}, bias=-4.0, threshold=0.5),  # on topic from 0.2
    top_right=Logistic(weights={"gap": 100.0}, bias=-3.0, threshold=0.5),  # top right from a 0.03 gap
)


@pytest.mark.parametrize(
    ("features", "precise", "expected"),
    [
        ({"similarity": 0.0}, True, Tier.PRECISE),
        ({"similarity": 0.1, "gap": 0.2}, False, Tier.NO_MATCH),
        ({"similarity": 0.3, "gap": 0.01}, False, Tier.REFERENCE),
        ({"similarity": 0.3, "gap": 0.05}, False, Tier.HIGHLY_RELEVANT),
    ],
)
def test_grade_follows_the_models(features: dict[str, float], precise: bool, expected: Tier) -> None:
    assert grade(features, MODEL, precise=precise) is expected


def test_a_logistic_model_rejects_an_unknown_feature() -> None:
    with pytest.raises(ValidationError, match="unknown feature"):
        Logistic(weights={"cosine": 1.0}, bias=0.0, threshold=0.5)


def test_fit_logistic_separates_two_groups_and_keeps_the_raw_scale() -> None:
    rows = [{"similarity": 0.1 + i / 100} for i in range(10)] + [
        {"similarity": 0.4 + i / 100} for i in range(10)
    ]
    labels = [False] * 10 + [True] * 10
    model = fit_logistic(rows, labels, ["similarity"], ridge=0.1)
    assert model.probability({"similarity": 0.05}) < 0.2 < 0.8 < model.probability({"similarity": 0.5})
    with pytest.raises(ValueError, match="both outcomes"):
        fit_logistic(rows[:3], [True] * 3, ["similarity"])


def test_every_tier_has_an_english_and_a_chinese_hint() -> None:
    for tier in Tier:
        assert completeness_hint(tier, "en").isascii()
        assert not completeness_hint(tier, "zh").isascii()
    assert "no more precise document" in completeness_hint(Tier.PRECISE, "en").lower()


def test_language_follows_the_query_script() -> None:
    assert detect_language("ERR_TIMEOUT 是什么") == "zh"
    assert detect_language("what is ERR_TIMEOUT") == "en"


ZONED = MODEL.model_copy(update={"confident": 0.9})  # on topic from 0.2, confident from 0.31


@pytest.mark.parametrize(
    ("similarity", "expected"),
    [(0.15, Tier.NO_MATCH), (0.25, Tier.REFERENCE), (0.35, Tier.HIGHLY_RELEVANT)],
)
def test_on_topic_confidence_has_three_zones(similarity: float, expected: Tier) -> None:
    # The top document is clearly first (gap 0.2) in every case: only on-topic confidence differs.
    assert grade({"similarity": similarity, "gap": 0.2}, ZONED, precise=False) is expected


def test_an_uncertain_on_topic_question_is_at_most_reference_however_clear_its_top_document() -> None:
    assert grade({"similarity": 0.25, "gap": 1.0}, ZONED, precise=False) is Tier.REFERENCE
    assert grade({"similarity": 0.25, "gap": 1.0}, MODEL, precise=False) is Tier.HIGHLY_RELEVANT


def test_weighted_rows_count_as_many() -> None:
    rows = [{"similarity": 0.0}, {"similarity": 1.0}, {"similarity": 0.5}, {"similarity": 0.5}]
    labels = [False, True, True, False]
    even = fit_logistic(rows, labels, ["similarity"], ridge=0.01)
    heavy = fit_logistic(rows, labels, ["similarity"], ridge=0.01, sample_weights=[1, 1, 5, 1])
    assert heavy.probability({"similarity": 0.5}) > even.probability({"similarity": 0.5}) + 0.2
