"""Relevance tiers: turn raw L0/L1 evidence into a graded tier the model can act on.

Raw scores never leave this layer except into the invocation log.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field, model_validator


class Tier(StrEnum):
    PRECISE = "PRECISE"
    HIGHLY_RELEVANT = "HIGHLY_RELEVANT"
    REFERENCE = "REFERENCE"
    DEDUPED = "DEDUPED"
    NO_MATCH = "NO_MATCH"


Language = Literal["en", "zh"]


class Thresholds(BaseModel):
    """Cosine-similarity cut-offs for one embedder."""

    model_config = {"frozen": True}

    highly_relevant: float = Field(ge=0.0, le=1.0, description="similarity >= this: HIGHLY_RELEVANT")
    reference: float = Field(ge=0.0, le=1.0, description="similarity >= this: REFERENCE; below: no match")

    @model_validator(mode="after")
    def _ordered(self) -> Thresholds:
        if self.reference > self.highly_relevant:
            raise ValueError(
                f"reference ({self.reference}) must not exceed highly_relevant ({self.highly_relevant})"
            )
        return self


def cosine_to_similarity(cosine: float) -> float:
    """Similarity in [0, 1] from the COSINE metric's score.

    The predecessor computed ``1 - min(d, 2) / 2`` assuming Milvus returned an L2 distance
    bounded by 2. Milvus actually returns the *squared* L2 distance, and on unit vectors
    ``d_sq = 2 - 2*cos``, so that formula equals ``max(cos, 0)``. We search with the COSINE
    metric and clamp the same way, which keeps the predecessor's thresholds meaningful.
    """
    return min(max(cosine, 0.0), 1.0)


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

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")


def detect_language(text: str) -> Language:
    """zh when the text contains CJK ideographs, else en."""
    return "zh" if _CJK.search(text) else "en"


def completeness_hint(tier: Tier, language: Language) -> str:
    """The fallback signal that tells the model whether to stop."""
    return COMPLETENESS_HINTS[tier][language]


def grade(
    *,
    l0_match_count: int,
    best_l0_similarity: float | None,
    top_similarity: float | None,
    thresholds: Thresholds,
) -> Tier:
    """Grade the evidence of one lookup (before dedup) into a tier.

    - PRECISE: exactly one document matched a keyword, title or identifier.
    - HIGHLY_RELEVANT: an L0 hit, or L1 alone, whose similarity reaches ``highly_relevant``.
    - REFERENCE: similarity reaches ``reference`` (several L0 hits count as at least a reference).
    - NO_MATCH: nothing else; no junk is returned.
    """
    if l0_match_count == 1:
        return Tier.PRECISE
    if (
        l0_match_count > 1
        and best_l0_similarity is not None
        and best_l0_similarity >= thresholds.highly_relevant
    ):
        return Tier.HIGHLY_RELEVANT
    if top_similarity is not None and top_similarity >= thresholds.highly_relevant:
        return Tier.HIGHLY_RELEVANT
    if l0_match_count > 1:
        return Tier.REFERENCE
    if top_similarity is not None and top_similarity >= thresholds.reference:
        return Tier.REFERENCE
    return Tier.NO_MATCH
