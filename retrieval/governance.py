"""Governance: the tier x water-level matrix that decides whether the session may look up again.

The water level is how much of its retrieval budget a session has used, by a configurable
metric. The decision is enforced by the lookup service (a STOP closes the circuit), not only
advised in the prompt: the predecessor's agents ignored prompt rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from pydantic import BaseModel, Field, model_validator

from retrieval.models import NextCall, Tier, WaterLevel
from storage.text import Language

WaterMetric = Literal["calls", "tokens", "domains"]
GuidanceKey = Literal[
    "allow",
    "targeted_only",
    "stop_budget",
    "stop_deduped",
    "circuit_open",
    "missing_dimension_required",
    "domain_retrieved",
]
_DECIDING_TIERS = (Tier.PRECISE, Tier.HIGHLY_RELEVANT, Tier.REFERENCE, Tier.DEDUPED)


class LevelBounds(BaseModel):
    """LOW while usage <= low_max, MEDIUM while <= medium_max, HIGH beyond."""

    model_config = {"frozen": True, "extra": "forbid"}

    low_max: int = Field(ge=0)
    medium_max: int = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> LevelBounds:
        if self.low_max >= self.medium_max:
            raise ValueError(f"low_max ({self.low_max}) must be below medium_max ({self.medium_max})")
        return self

    def level(self, usage: int) -> WaterLevel:
        if usage <= self.low_max:
            return WaterLevel.LOW
        if usage <= self.medium_max:
            return WaterLevel.MEDIUM
        return WaterLevel.HIGH


def _default_levels() -> dict[WaterMetric, LevelBounds]:
    return {
        "calls": LevelBounds(low_max=3, medium_max=7),
        "tokens": LevelBounds(low_max=4000, medium_max=12000),
        "domains": LevelBounds(low_max=1, medium_max=3),
    }


def _default_matrix() -> dict[Tier, dict[WaterLevel, NextCall]]:
    allow, targeted, stop = NextCall.ALLOW, NextCall.TARGETED_ONLY, NextCall.STOP
    return {
        Tier.PRECISE: {WaterLevel.LOW: allow, WaterLevel.MEDIUM: allow, WaterLevel.HIGH: stop},
        Tier.HIGHLY_RELEVANT: {WaterLevel.LOW: allow, WaterLevel.MEDIUM: allow, WaterLevel.HIGH: stop},
        Tier.REFERENCE: {WaterLevel.LOW: targeted, WaterLevel.MEDIUM: targeted, WaterLevel.HIGH: stop},
        Tier.DEDUPED: {WaterLevel.LOW: stop, WaterLevel.MEDIUM: stop, WaterLevel.HIGH: stop},
    }


def _default_guidance() -> dict[Language, dict[GuidanceKey, str]]:
    return {
        "en": {
            "allow": "{calls_used} lookups, water {water_level}: look up again only for a topic you do not hold.",
            "targeted_only": "for more on this topic pass missing_dimension; other topics stay open.",
            "stop_budget": "budget used up: answer from what you have; lookup_knowledge is closed for this session.",
            "stop_deduped": "you hold this already: answer from it. Only a topic you do not hold is looked up.",
            "circuit_open": "closed for this session, retrieval skipped: answer from what you have.",
            "missing_dimension_required": "you hold this topic: answer from it, or pass missing_dimension.",
            "domain_retrieved": "this domain is already retrieved: answer, or pass missing_dimension.",
        },
        "zh": {
            "allow": "已调用 {calls_used} 次，水位 {water_level}：只为尚未掌握的主题再检索。",
            "targeted_only": "如需本主题更多内容，请用 missing_dimension 说明缺少什么；其他主题仍可检索。",
            "stop_budget": "预算已用尽：请基于已有信息回答，本会话的 lookup_knowledge 已关闭。",
            "stop_deduped": "该内容已在上下文中：请直接使用。只有尚未掌握的主题才会再检索。",
            "circuit_open": "本会话已关闭检索（未执行检索）：请基于已有信息回答。",
            "missing_dimension_required": "该主题已在上下文中：请直接回答，或用 missing_dimension 定向补充。",
            "domain_retrieved": "该域已检索过：请直接回答，或用 missing_dimension 定向补充。",
        },
    }


class GovernanceConfig(BaseModel):
    """The decision matrix, water levels, guidance templates and domain policy."""

    # A misspelt key must be an error, not a setting silently left at its default.
    model_config = {"extra": "forbid"}

    enabled: bool = Field(default=True, description="false: never refuse (a stateless retriever).")
    water_metric: WaterMetric = Field(
        default="tokens",
        description="What the water level measures: content tokens delivered (default), calls, or domains. "
        "Tokens measure the context the agent actually spent; refused calls cost almost none.",
    )
    levels: dict[WaterMetric, LevelBounds] = Field(
        default_factory=_default_levels,
        description="Bounds per metric: LOW <= low_max < MEDIUM <= medium_max < HIGH.",
    )
    matrix: dict[Tier, dict[WaterLevel, NextCall]] = Field(
        default_factory=_default_matrix,
        description="tier x water level -> next_call. NO_MATCH uses REFERENCE.",
    )
    domain_policy: Literal["soft", "hard"] = Field(
        default="soft",
        description="hard: a lookup landing in an already-retrieved domain is refused unless "
        "missing_dimension is given; soft: only reported.",
    )
    guidance: dict[Language, dict[GuidanceKey, str]] = Field(
        default_factory=_default_guidance, description="Circuit-breaker texts; {calls_used}, {water_level}."
    )

    @model_validator(mode="after")
    def _complete(self) -> GovernanceConfig:
        if self.water_metric not in self.levels:
            raise ValueError(f"levels has no bounds for water_metric {self.water_metric!r}")
        if Tier.NO_MATCH in self.matrix:
            # decide() reads NO_MATCH from the REFERENCE row; a NO_MATCH row would be ignored silently.
            raise ValueError("matrix.NO_MATCH is not configurable: NO_MATCH is decided by the REFERENCE row")
        for tier in _DECIDING_TIERS:
            row = self.matrix.get(tier)
            missing = [level.value for level in WaterLevel if row is None or level not in row]
            if missing:
                raise ValueError(f"matrix.{tier.value} lacks a decision for {', '.join(missing)}")
        if "en" not in self.guidance:
            raise ValueError("guidance.en is required: it is the fallback for every language")
        for language, texts in self.guidance.items():
            missing_keys = sorted(set(get_args(GuidanceKey)) - set(texts))
            if missing_keys:
                raise ValueError(f"guidance.{language} lacks {', '.join(missing_keys)}")
            for key, template in texts.items():
                # Render once now, so a bad placeholder fails at load, not on every lookup.
                try:
                    template.format(calls_used=0, water_level=WaterLevel.LOW.value)
                except (KeyError, IndexError, ValueError) as exc:
                    raise ValueError(
                        f"guidance.{language}.{key} is not a valid template ({type(exc).__name__}: {exc}); "
                        "the placeholders are {calls_used} and {water_level}"
                    ) from exc
        return self


@dataclass(frozen=True)
class Usage:
    """How much a session has used, counting the current call."""

    calls: int
    tokens: int
    domains: int


@dataclass(frozen=True)
class Decision:
    water_level: WaterLevel
    next_call: NextCall
    guidance_key: GuidanceKey


def water_level(config: GovernanceConfig, usage: Usage) -> WaterLevel:
    value = {"calls": usage.calls, "tokens": usage.tokens, "domains": usage.domains}[config.water_metric]
    return config.levels[config.water_metric].level(value)


def decide(config: GovernanceConfig, tier: Tier, usage: Usage) -> Decision:
    """Look up next_call for a result of this tier at this water level."""
    level = water_level(config, usage)
    deciding_tier = Tier.REFERENCE if tier is Tier.NO_MATCH else tier
    next_call = config.matrix[deciding_tier][level]
    if next_call is NextCall.STOP:
        key: GuidanceKey = (
            "stop_deduped" if tier is Tier.DEDUPED and level is not WaterLevel.HIGH else "stop_budget"
        )
    elif next_call is NextCall.TARGETED_ONLY:
        key = "targeted_only"
    else:
        key = "allow"
    return Decision(level, next_call, key)


def guidance_text(config: GovernanceConfig, key: GuidanceKey, language: Language, usage: Usage) -> str:
    """Render a guidance template for the session's usage."""
    template = config.guidance.get(language) or config.guidance["en"]
    return template[key].format(calls_used=usage.calls, water_level=water_level(config, usage).value)
