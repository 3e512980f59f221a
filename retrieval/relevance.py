"""Relevance tiers: turn raw L0/L1 evidence into a graded tier the model can act on.

Raw scores never leave this layer except into the invocation log.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, Field, model_validator

from retrieval.models import Tier
from storage.text import Language

FEATURES = (
    "similarity",
    "margin",
    "gap",
    "coverage",
    "support",
    "top_coverage",
    "agree",
    "l0",
    "sparse",
    "rerank",
    "unseen",
    "unseen_name",
    "top_unseen",
    "background",
)


class Logistic(BaseModel):
    """A logistic model over named features, with the decision threshold on its probability."""

    model_config = {"frozen": True, "extra": "forbid"}

    weights: dict[str, float] = Field(description=f"Weight per feature; features: {', '.join(FEATURES)}.")
    bias: float = Field(description="Intercept.")
    threshold: float = Field(ge=0.0, le=1.0, description="Probability at or above which the test passes.")

    @model_validator(mode="after")
    def _known_features(self) -> Logistic:
        unknown = sorted(set(self.weights) - set(FEATURES))
        if unknown:
            raise ValueError(f"unknown feature(s) {', '.join(unknown)}; known: {', '.join(FEATURES)}")
        return self

    def probability(self, features: Mapping[str, float]) -> float:
        z = self.bias + sum(w * features.get(name, 0.0) for name, w in self.weights.items())
        return 1.0 / (1.0 + math.exp(-max(min(z, 60.0), -60.0)))

    def passes(self, features: Mapping[str, float]) -> bool:
        return self.probability(features) >= self.threshold


# Hand-set before the margin was fitted; kept for models that do not fit one (bge-m3's).
DEFAULT_SUPPLEMENT_MARGIN = 0.1


class TierModel(BaseModel):
    """How evidence becomes a tier, for one embedder; fitted by the calibrate command.

    - ``on_topic``: does the knowledge base answer the query at all? Its probability has three
      zones. Below its threshold the result is NO_MATCH; the threshold is set so that answerable
      questions almost never fall below it: a false NO_MATCH loses knowledge, a false REFERENCE
      costs one read. From there up to ``confident`` the question may be one the knowledge base
      does not answer, so the result is at most REFERENCE. At or above ``confident``:
    - ``top_right``: is the top document the answer? At or above: HIGHLY_RELEVANT, else REFERENCE.
    - ``supplement_margin``: how close another document must score to go with a HIGHLY_RELEVANT one.
    """

    model_config = {"frozen": True, "extra": "forbid"}

    on_topic: Logistic
    top_right: Logistic
    confident: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="on_topic probability at or above which a result may be HIGHLY_RELEVANT; between "
        "on_topic's threshold and this the knowledge base may not answer, and the result is at most "
        "REFERENCE (0: every on-topic result may be).",
    )
    cross_language_offset: float = Field(
        default=0.0,
        ge=0.0,
        le=0.2,
        description="Added, for ranking only, to the similarity of a chunk written in the other language "
        "than the query; the tier features read the cosine as measured.",
    )
    lexical_weight: float = Field(
        default=0.15,
        ge=0.0,
        le=2.0,
        description="Weight of the lexical coverage added to the dense similarity in the fused ranking.",
    )
    sparse_weight: float = Field(
        default=0.0,
        ge=0.0,
        le=2.0,
        description="Weight of the BGE-M3 lexical match (token weights from the embedder, 1.0 = as "
        "strong as the query against itself) in the fused ranking; only bge-m3 gives token weights.",
    )
    rerank_weight: float = Field(
        default=0.5,
        ge=0.0,
        le=2.0,
        description="Weight of the reranker's score (0..1) in the fused ranking; used only while "
        "reranker.enabled is true.",
    )
    supplement_margin: float = Field(
        default=DEFAULT_SUPPLEMENT_MARGIN,
        ge=0.0,
        le=2.0,
        description="A HIGHLY_RELEVANT result also sends each other top_k document whose fused score "
        "is within this of the first's (REFERENCE sends all of them, PRECISE none).",
    )


COMPLETENESS_HINTS: dict[Tier, dict[Language, str]] = {
    Tier.PRECISE: {
        "en": "No more precise document exists in the knowledge base; use this result and do not look up again.",
        "zh": "知识库中不存在比上述结果更精准的文档，请直接使用，不要再检索。",
    },
    Tier.HIGHLY_RELEVANT: {
        "en": "Already highly relevant; further lookups are unlikely to find anything better.",
        "zh": "当前结果已高度相关，继续检索不太可能找到更精准的文档。",
    },
    Tier.REFERENCE: {
        "en": "Related reference only; if you need more, name the missing dimension before one targeted lookup.",
        "zh": "当前结果为相关参考，如需更精准信息，请先明确缺少的具体维度，再定向补充检索一次。",
    },
    Tier.DEDUPED: {
        "en": "Every matching document is already in your context; answer from what you have.",
        "zh": "匹配的文档都已在上下文中，请基于已有信息回答。",
    },
    Tier.NO_MATCH: {
        "en": "The knowledge base has nothing relevant; do not rephrase and retry, answer without it.",
        "zh": "知识库中没有相关内容，不要换关键词重试，请在没有该知识的情况下回答。",
    },
}


def completeness_hint(tier: Tier, language: Language) -> str:
    """The fallback signal that tells the model whether to stop."""
    return COMPLETENESS_HINTS[tier][language]


def grade(features: Mapping[str, float], model: TierModel, *, precise: bool) -> Tier:
    """Grade one lookup's evidence (before dedup) into a tier.

    - PRECISE: the query names something that identifies one document (decided by the caller:
      a code only it contains, its exact title, or a keyword no other document contains).
    - NO_MATCH: the on-topic model is confident that nothing answers; no junk is returned.
    - HIGHLY_RELEVANT: the on-topic model is confident the knowledge base answers, and the
      top-document model that the first document does.
    - REFERENCE: everything else, including whatever the models cannot decide.
    """
    if precise:
        return Tier.PRECISE
    on_topic = model.on_topic.probability(features)
    if on_topic < model.on_topic.threshold:
        return Tier.NO_MATCH
    if on_topic < model.confident:
        return Tier.REFERENCE  # related, but the knowledge base may not answer it
    return Tier.HIGHLY_RELEVANT if model.top_right.passes(features) else Tier.REFERENCE
