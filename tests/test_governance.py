"""The governance policy as plain Python: water levels, the matrix, guidance and config validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from retrieval.governance import (
    GovernanceConfig,
    LevelBounds,
    Usage,
    decide,
    guidance_text,
    water_level,
)
from retrieval.models import NextCall, Tier, WaterLevel
from server.config.errors import ConfigError
from server.config.loading import load_settings

ALLOW, TARGETED, STOP = NextCall.ALLOW, NextCall.TARGETED_ONLY, NextCall.STOP


def calls(n: int) -> Usage:
    return Usage(calls=n, tokens=0, domains=0)


CALLS = GovernanceConfig(water_metric="calls")


@pytest.mark.parametrize(
    ("n", "level"),
    [(1, "LOW"), (3, "LOW"), (4, "MEDIUM"), (7, "MEDIUM"), (8, "HIGH"), (20, "HIGH")],
)
def test_call_count_water_level_is_low_up_to_3_medium_to_7_and_high_from_8(n: int, level: str) -> None:
    assert water_level(CALLS, calls(n)) is WaterLevel(level)


def test_the_default_metric_is_content_tokens_delivered() -> None:
    config = GovernanceConfig()
    assert config.water_metric == "tokens"
    assert water_level(config, Usage(calls=50, tokens=4000, domains=0)) is WaterLevel.LOW
    assert water_level(config, Usage(calls=1, tokens=4001, domains=0)) is WaterLevel.MEDIUM
    assert water_level(config, Usage(calls=1, tokens=12001, domains=0)) is WaterLevel.HIGH


def test_domains_metric_measures_domains_retrieved() -> None:
    config = GovernanceConfig(water_metric="domains")
    assert water_level(config, Usage(calls=50, tokens=0, domains=1)) is WaterLevel.LOW
    assert water_level(config, Usage(calls=1, tokens=0, domains=3)) is WaterLevel.MEDIUM
    assert water_level(config, Usage(calls=1, tokens=0, domains=4)) is WaterLevel.HIGH


DEFAULT_MATRIX = {
    Tier.PRECISE: (ALLOW, ALLOW, STOP),
    Tier.HIGHLY_RELEVANT: (ALLOW, ALLOW, STOP),
    Tier.REFERENCE: (TARGETED, TARGETED, STOP),
    Tier.NO_MATCH: (TARGETED, TARGETED, STOP),  # NO_MATCH is decided as REFERENCE
    Tier.DEDUPED: (STOP, STOP, STOP),
}


@pytest.mark.parametrize("tier", list(DEFAULT_MATRIX))
def test_default_matrix_decides_next_call_per_tier_and_water_level(tier: Tier) -> None:
    got = tuple(decide(CALLS, tier, calls(n)).next_call for n in (2, 5, 9))
    assert got == DEFAULT_MATRIX[tier]


def test_guidance_key_separates_budget_stop_from_dedup_stop() -> None:
    config = CALLS
    assert decide(config, Tier.DEDUPED, calls(1)).guidance_key == "stop_deduped"
    assert decide(config, Tier.DEDUPED, calls(9)).guidance_key == "stop_budget"
    assert decide(config, Tier.PRECISE, calls(9)).guidance_key == "stop_budget"
    assert decide(config, Tier.REFERENCE, calls(1)).guidance_key == "targeted_only"
    assert decide(config, Tier.HIGHLY_RELEVANT, calls(1)).guidance_key == "allow"


def test_configured_matrix_replaces_the_default_decision() -> None:
    matrix = GovernanceConfig().matrix
    matrix[Tier.DEDUPED] = {WaterLevel.LOW: TARGETED, WaterLevel.MEDIUM: STOP, WaterLevel.HIGH: STOP}
    config = GovernanceConfig(matrix=matrix, water_metric="calls")
    assert decide(config, Tier.DEDUPED, calls(1)).next_call is TARGETED


def test_guidance_renders_the_usage_in_english_and_chinese() -> None:
    config = CALLS
    english = guidance_text(config, "allow", "en", calls(2))
    chinese = guidance_text(config, "allow", "zh", calls(2))
    assert english.startswith("2 lookups, water LOW: look up again only for a topic you do not hold")
    assert chinese.startswith("已调用 2 次，水位 LOW")
    assert guidance_text(config, "stop_budget", "en", calls(9)).startswith(
        "budget used up: answer from what you have"
    )


def test_guidance_falls_back_to_english_for_a_language_without_templates() -> None:
    english_only = {"en": GovernanceConfig().guidance["en"]}
    config = GovernanceConfig(guidance=english_only)
    assert guidance_text(config, "circuit_open", "zh", calls(1)).startswith("closed for this session")


# -- validation ---------------------------------------------------------------------


def test_level_bounds_reject_low_max_not_below_medium_max() -> None:
    with pytest.raises(ValidationError, match=r"low_max \(7\) must be below medium_max \(7\)"):
        LevelBounds(low_max=7, medium_max=7)


def _config_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_settings(path, data_dir=tmp_path)
    message = str(info.value)
    assert message.startswith(f"invalid configuration in {path}: ")
    return message


def test_config_with_low_max_above_medium_max_names_the_level_field(tmp_path: Path) -> None:
    message = _config_error(tmp_path, "governance:\n  levels:\n    calls: {low_max: 8, medium_max: 7}\n")
    assert "governance.levels.calls: Value error, low_max (8) must be below medium_max (7)" in message


def test_config_with_an_unknown_decision_names_the_matrix_cell(tmp_path: Path) -> None:
    message = _config_error(
        tmp_path,
        "governance:\n  matrix:\n"
        "    PRECISE: {LOW: MAYBE, MEDIUM: ALLOW, HIGH: STOP}\n"
        "    HIGHLY_RELEVANT: {LOW: ALLOW, MEDIUM: ALLOW, HIGH: STOP}\n"
        "    REFERENCE: {LOW: TARGETED_ONLY, MEDIUM: TARGETED_ONLY, HIGH: STOP}\n"
        "    DEDUPED: {LOW: STOP, MEDIUM: STOP, HIGH: STOP}\n",
    )
    assert "governance.matrix.PRECISE.LOW: Input should be 'ALLOW', 'TARGETED_ONLY' or 'STOP'" in message


def test_config_with_an_incomplete_matrix_names_the_missing_row_and_levels(tmp_path: Path) -> None:
    message = _config_error(tmp_path, "governance:\n  matrix:\n    REFERENCE: {LOW: ALLOW}\n")
    assert "matrix.PRECISE lacks a decision for LOW, MEDIUM, HIGH" in message


def test_config_with_a_no_match_row_is_rejected_because_reference_decides_it() -> None:
    matrix = {**GovernanceConfig().matrix, Tier.NO_MATCH: GovernanceConfig().matrix[Tier.REFERENCE]}
    with pytest.raises(ValidationError, match=r"matrix\.NO_MATCH is not configurable"):
        GovernanceConfig(matrix=matrix)


def test_config_with_a_water_metric_without_bounds_is_rejected(tmp_path: Path) -> None:
    message = _config_error(
        tmp_path,
        "governance:\n  water_metric: tokens\n  levels:\n    calls: {low_max: 3, medium_max: 7}\n",
    )
    assert "levels has no bounds for water_metric 'tokens'" in message


def test_every_guidance_text_leaves_room_in_a_200_character_refusal() -> None:
    for language, texts in GovernanceConfig().guidance.items():
        for key, text in texts.items():
            rendered = text.format(calls_used=99, water_level="MEDIUM")
            assert len(rendered) <= 110, (language, key, len(rendered))


def test_config_with_an_unknown_water_metric_names_the_field(tmp_path: Path) -> None:
    message = _config_error(tmp_path, "governance:\n  water_metric: seconds\n")
    assert "governance.water_metric: Input should be 'calls', 'tokens' or 'domains'" in message


def test_guidance_template_with_an_unknown_placeholder_fails_at_load() -> None:
    texts = {**GovernanceConfig().guidance["en"], "allow": "used {calls} calls"}
    with pytest.raises(ValidationError, match=r"guidance.en.allow is not a valid template \(KeyError"):
        GovernanceConfig(guidance={"en": texts})


def test_guidance_without_english_is_rejected() -> None:
    with pytest.raises(ValidationError, match=r"guidance\.en is required"):
        GovernanceConfig(guidance={"zh": GovernanceConfig().guidance["zh"]})


def test_guidance_language_missing_a_key_names_it() -> None:
    texts = {k: v for k, v in GovernanceConfig().guidance["zh"].items() if k != "circuit_open"}
    with pytest.raises(ValidationError, match=r"guidance\.zh lacks circuit_open"):
        GovernanceConfig(guidance={"en": GovernanceConfig().guidance["en"], "zh": texts})


def test_config_with_an_unknown_domain_policy_names_the_field(tmp_path: Path) -> None:
    message = _config_error(tmp_path, "governance:\n  domain_policy: strict\n")
    assert "governance.domain_policy: Input should be 'soft' or 'hard'" in message


def test_environment_overrides_one_governance_key_and_keeps_the_yaml_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("governance:\n  water_metric: domains\n", encoding="utf-8")
    monkeypatch.setenv("LOOKUP_KNOWLEDGE_GOVERNANCE__DOMAIN_POLICY", "hard")
    settings = load_settings(path, data_dir=tmp_path)
    assert settings.governance.domain_policy == "hard"
    assert settings.governance.water_metric == "domains"
