"""config.example.yaml documents every setting with its default, and cannot drift from the model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from server.config.settings import ENV_PREFIX, Settings, load_settings

EXAMPLE = Path(__file__).resolve().parent.parent / "config.example.yaml"


@pytest.fixture(autouse=True)
def _no_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in os.environ:
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


def test_example_config_lists_every_setting_with_its_default(tmp_path: Path) -> None:
    written = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    defaults = Settings(data_dir=tmp_path).model_dump(mode="json")
    # data_dir is commented out in the example: its default depends on $XDG_DATA_HOME.
    defaults.pop("data_dir")
    assert written == defaults


def test_loading_the_example_config_yields_the_default_settings(tmp_path: Path) -> None:
    assert load_settings(EXAMPLE, data_dir=tmp_path) == Settings(data_dir=tmp_path)
