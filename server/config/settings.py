"""The one settings model: YAML file, then environment overrides, then CLI flags.

Read once at the entry point and passed down; nothing reads the environment at import time.
Environment variables use the prefix ``LOOKUP_KNOWLEDGE_`` and ``__`` between nested names,
e.g. ``LOOKUP_KNOWLEDGE_MILVUS__URI=http://milvus:19530``. An unknown key inside a section, from the
file, the environment or a flag, is an error naming its dotted path (``Section``).

Every setting declares, once, how a running server applies an edit of the config file: ``HOT``,
``RESTART`` or ``CLI`` as ``Annotated`` metadata (``sections.py``), on a whole section or on each
of its fields. ``reload_rules`` reads them; the hot reload, config.example.yaml and
docs/governance.md follow it. Loading is in ``loading.py``, the wording of errors in ``errors.py``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from retrieval.governance import GovernanceConfig
from retrieval.relevance import TierModel
from server.config.http_settings import HttpSettings
from server.config.sections import (
    ENV_PREFIX,
    HOT,
    RESTART,
    ChunkingSettings,
    ConversionSettings,
    EmbedderSettings,
    LogSettings,
    MemorySettings,
    MilvusSettings,
    RelevanceSettings,
    Reload,
    ReloadRule,
    RerankerSettings,
    RetrievalSettings,
    WatchSettings,
)
from server.config.yaml_source import YamlSource


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/lookup-knowledge-mcp``, never the working directory (clients start us anywhere)."""
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "lookup-knowledge-mcp"


class Settings(BaseSettings):
    """Everything configurable, with the defaults that ``make run`` uses."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    data_dir: Annotated[Path, RESTART] = Field(
        default_factory=default_data_dir, description="Where all state lives."
    )
    milvus: Annotated[MilvusSettings, RESTART] = Field(default_factory=MilvusSettings)
    embedder: Annotated[EmbedderSettings, RESTART] = Field(default_factory=EmbedderSettings)
    reranker: Annotated[RerankerSettings, RESTART] = Field(default_factory=RerankerSettings)
    chunking: Annotated[ChunkingSettings, RESTART] = Field(default_factory=ChunkingSettings)
    conversion: Annotated[ConversionSettings, RESTART] = Field(default_factory=ConversionSettings)
    relevance: Annotated[RelevanceSettings, HOT] = Field(default_factory=RelevanceSettings)
    # retrieval, memory and log mix rules: each of their fields carries its own.
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    governance: Annotated[GovernanceConfig, HOT] = Field(default_factory=GovernanceConfig)
    log: LogSettings = Field(default_factory=LogSettings)
    http: Annotated[HttpSettings, RESTART] = Field(default_factory=HttpSettings)
    watch: Annotated[WatchSettings, RESTART] = Field(default_factory=WatchSettings)

    @model_validator(mode="after")
    def _model_covers_embedder(self) -> Settings:
        if self.embedder.name not in self.relevance.models:
            raise ValueError(
                f"relevance.models has no entry for embedder {self.embedder.name!r}; "
                f"known: {sorted(self.relevance.models)}"
            )
        return self

    @property
    def tier_model(self) -> TierModel:
        """The tier model of the configured embedder."""
        return self.relevance.models[self.embedder.name]

    @property
    def log_path(self) -> Path:
        """The invocation log: read by ``stats`` and knowledge://stats, written by the server."""
        return self.data_dir / "log.sqlite"

    @property
    def milvus_uri(self) -> str:
        """The configured URI, or the Milvus Lite file in the data directory."""
        return self.milvus.uri or str(self.data_dir / "milvus.db")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Precedence: CLI flags (init) > environment > YAML file.
        return (init_settings, env_settings, YamlSource(settings_cls))


def reload_rules(model: type[BaseModel] = Settings) -> dict[str, ReloadRule]:
    """Dotted setting -> its reload rule, at the granularity declared: a section or each of its fields.

    Raises TypeError for a setting that declares no rule, so a new one cannot go unclassified.
    """
    rules: dict[str, ReloadRule] = {}
    for name, field in model.model_fields.items():
        marker = next((m for m in field.metadata if isinstance(m, Reload)), None)
        if marker is not None:
            rules[name] = marker.rule
        elif isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            rules.update({f"{name}.{path}": rule for path, rule in reload_rules(field.annotation).items()})
        else:
            raise TypeError(f"setting {name!r} of {model.__name__} declares no reload rule")
    return rules


def restart_only_paths(model: type[BaseModel] = Settings) -> tuple[str, ...]:
    """The dotted settings whose running value a hot reload keeps (read once, at start)."""
    return tuple(path for path, rule in reload_rules(model).items() if rule == "restart")
