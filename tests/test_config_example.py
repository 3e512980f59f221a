"""config.example.yaml and the docs state every setting's default and reload rule, and cannot drift from the model."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from server.config.loading import load_settings
from server.config.settings import Settings, reload_rules

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config.example.yaml"
GOVERNANCE_DOC = ROOT / "docs" / "governance.md"
# A YAML key, the commented-out top-level data_dir line, and the [rule] that opens a comment.
_KEY = re.compile(r"^(?P<indent> *)(?P<name>[A-Za-z_][\w-]*):(?: |$)")
_COMMENTED_KEY = re.compile(r"^# (?P<indent>)(?P<name>[a-z_]+): \S")
_MARK = re.compile(r"^ *# \[(?P<rule>[a-z]+)\] ", re.MULTILINE)

pytestmark = pytest.mark.usefixtures("no_environment_overrides")


def test_example_config_lists_every_setting_with_its_default(tmp_path: Path) -> None:
    written = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    defaults = Settings(data_dir=tmp_path).model_dump(mode="json")
    # data_dir is commented out in the example: its default depends on $XDG_DATA_HOME.
    defaults.pop("data_dir")
    assert written == defaults


def test_loading_the_example_config_yields_the_default_settings(tmp_path: Path) -> None:
    assert load_settings(EXAMPLE, data_dir=tmp_path) == Settings(data_dir=tmp_path)


def marked_keys(text: str) -> dict[str, str]:
    """Dotted key -> the [rule] opening the comment block right above that key."""
    marks: dict[str, str] = {}
    parents: list[tuple[int, str]] = []
    block: list[str] = []
    for line in text.splitlines():
        key = _KEY.match(line) or _COMMENTED_KEY.match(line)
        if key is None:
            block = [*block, line] if line.lstrip().startswith("#") else []
            continue
        indent = len(key["indent"])
        parents = [(depth, name) for depth, name in parents if depth < indent]
        parents.append((indent, key["name"]))
        mark = _MARK.match(block[0]) if block else None
        if mark is not None:
            marks[".".join(name for _, name in parents)] = mark["rule"]
        block = []
    return marks


def test_the_example_marks_every_setting_with_the_models_reload_rule() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    marks = marked_keys(text)
    # A mark anywhere but at the head of the comment right above a key would go unchecked.
    assert len(marks) == len(_MARK.findall(text))
    assert marks == reload_rules()


def test_the_reload_table_in_the_docs_matches_the_models_reload_rules() -> None:
    text = GOVERNANCE_DOC.read_text(encoding="utf-8")
    section = text.split("### What reloads", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| (\w+) \|", section, flags=re.MULTILINE)
    assert len(rows) == len(dict(rows)), "a setting has two rows"
    assert dict(rows) == reload_rules()
