"""The settings source that reads the YAML document ``load_settings`` is loading."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

from pydantic_settings import PydanticBaseSettingsSource

# The YAML document being loaded; set only for the duration of one load_settings call.
yaml_document: ContextVar[dict[str, Any]] = ContextVar("yaml_document", default={})  # noqa: B039


class YamlSource(PydanticBaseSettingsSource):
    """The lowest-precedence source of the settings: the YAML document being loaded."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return yaml_document.get().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(yaml_document.get())
