"""How a bad configuration is worded: one line that names the file, the variable or the field."""

from __future__ import annotations

from collections.abc import Mapping

import yaml
from pydantic import ValidationError
from pydantic_settings import SettingsError

from server.config.sections import ENV_PREFIX


class ConfigError(ValueError):
    """The configuration file or an override is invalid; the message names the field."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _mark(mark: yaml.Mark) -> str:
    # PyYAML counts lines and columns from 0; editors, and PyYAML's own messages, from 1.
    return f"line {mark.line + 1}, column {mark.column + 1}"


def describe_yaml_error(exc: yaml.YAMLError) -> str:
    """One line: where the parser stopped and why, and what it was inside (opened where).

    PyYAML's own message spans several lines, with the offending source line and a caret under it.
    """
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None or not exc.problem:
        return _one_line(str(exc))
    described = f"{_mark(exc.problem_mark)}: {_one_line(exc.problem)}"
    if exc.context:
        # For an unclosed bracket the problem is at the end of the file; this says where it opened.
        opened = f" at {_mark(exc.context_mark)}" if exc.context_mark is not None else ""
        described += f" ({_one_line(exc.context)}{opened})"
    return described


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """One line per bad field: ``governance.levels.calls.low_max: Input should be ...``."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"]) or "(root)"
        lines.append(f"{loc}: {err['msg']}")
    return f"invalid configuration in {source}: " + "; ".join(lines)


def describe_unparsable_env(exc: SettingsError, environ: Mapping[str, str]) -> str:
    """Which variable is not JSON, without its value (it may be a secret)."""
    # pydantic-settings names only the section; the JSON error it wraps holds the raw value.
    value = getattr(exc.__cause__, "doc", None)
    names = sorted(n for n, v in environ.items() if n.upper().startswith(ENV_PREFIX) and v == value)
    where = ", ".join(names) if value is not None and names else str(exc)
    return (
        f"invalid configuration in environment: {where}: not valid JSON "
        """(a list or a mapping is written as JSON, such as '["kb.example"]' or '{"calls": 3}')"""
    )
