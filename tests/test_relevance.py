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
