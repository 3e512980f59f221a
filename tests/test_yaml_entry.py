"""Setting one entry of a YAML config file keeps the rest of its text, comments included."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from server.config.yaml_entry import YamlEntryError, set_entry

ROOT = Path(__file__).resolve().parents[1]
MODEL_PATH = ["relevance", "models", "e5-small"]


def _changed_lines(before: str, after: str) -> list[tuple[str, str]]:
    return [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]


def test_replacing_an_entry_of_the_example_config_changes_only_its_lines() -> None:
    text = (ROOT / "config.example.yaml").read_text(encoding="utf-8")
    model = yaml.safe_load(text)["relevance"]["models"]["e5-small"]
    updated = set_entry(text, MODEL_PATH, {**model, "supplement_margin": 0.25})
    assert _changed_lines(text, updated) == [
        (f"      supplement_margin: {model['supplement_margin']}", "      supplement_margin: 0.25")
    ]
    assert (
        yaml.safe_load(updated)["relevance"]["models"]["bge-m3"]
        == yaml.safe_load(text)["relevance"]["models"]["bge-m3"]
    )


def test_a_missing_entry_is_added_under_its_deepest_parent_and_comments_stay() -> None:
    text = "# ours\nrelevance:  # tiers\n  models:\n    bge-m3:\n      lexical_weight: 0.1  # tuned\nlog:\n  enabled: true\n"
    updated = set_entry(text, MODEL_PATH, {"lexical_weight": 0.3})
    assert updated == (
        "# ours\nrelevance:  # tiers\n  models:\n    bge-m3:\n      lexical_weight: 0.1  # tuned\n"
        "    e5-small:\n      lexical_weight: 0.3\nlog:\n  enabled: true\n"
    )


def test_a_file_without_the_section_gets_it_at_the_end() -> None:
    assert set_entry("# nothing yet\n", MODEL_PATH, {"a": 1}) == (
        "# nothing yet\nrelevance:\n  models:\n    e5-small:\n      a: 1"
    )
    assert yaml.safe_load(set_entry("", MODEL_PATH, {"a": 1})) == {
        "relevance": {"models": {"e5-small": {"a": 1}}}
    }


def test_a_flow_style_parent_is_refused_rather_than_rewritten() -> None:
    with pytest.raises(YamlEntryError, match=r"relevance\.models is not a block mapping"):
        set_entry("relevance:\n  models: {bge-m3: {a: 1}}\n", MODEL_PATH, {"a": 2})
