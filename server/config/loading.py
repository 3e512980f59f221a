"""Loading the settings: the YAML file, then environment overrides, then CLI flags."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import SettingsError

from server.config.errors import (
    ConfigError,
    describe_unparsable_env,
    describe_validation_error,
    describe_yaml_error,
)
from server.config.sections import ENV_PREFIX
from server.config.settings import Settings
from server.config.yaml_source import yaml_document


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse a config file, raising ConfigError that names the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"config file {str(path)!r} is not UTF-8 text: {exc.reason} at byte {exc.start}"
        ) from exc
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {str(path)!r} is not valid YAML: {describe_yaml_error(exc)}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping, not {type(data).__name__}")
    return data


def config_path_from_env() -> Path | None:
    """``LOOKUP_KNOWLEDGE_CONFIG``, read at the entry point only."""
    value = os.environ.get(f"{ENV_PREFIX}CONFIG")
    return Path(value) if value else None


def unknown_env_sections(environ: Mapping[str, str]) -> list[str]:
    """Nested variables (``PREFIX<SECTION>__<KEY>``) whose section the settings do not define.

    pydantic-settings reads only the variables of known fields, so a misspelt section
    (``LOOKUP_KNOWLEDGE_GOVERNANC__DOMAIN_POLICY``) would be ignored without a word. Variables
    without ``__`` are left alone: some that share the prefix are not settings (``..._CONFIG``).
    """
    sections = set(Settings.model_fields)
    return sorted(
        name
        for name in environ
        if name.upper().startswith(ENV_PREFIX)
        and "__" in name
        and name[len(ENV_PREFIX) :].split("__", 1)[0].lower() not in sections
    )


def load_settings(config_path: Path | None = None, **overrides: Any) -> Settings:
    """Build Settings from a YAML file, the environment and explicit overrides (highest)."""
    unknown = unknown_env_sections(os.environ)
    if unknown:
        known = ", ".join(sorted(Settings.model_fields))
        raise ConfigError(
            f"invalid configuration in environment: {', '.join(unknown)}: no such section ({known})"
        )
    data = read_yaml(config_path) if config_path is not None else {}
    token = yaml_document.set(data)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        source = str(config_path) if config_path else "environment/flags"
        raise ConfigError(describe_validation_error(exc, source)) from exc
    except SettingsError as exc:  # a variable for a list or a mapping that is not JSON
        raise ConfigError(describe_unparsable_env(exc, os.environ)) from exc
    finally:
        yaml_document.reset(token)
