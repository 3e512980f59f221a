"""The one settings model: YAML file, then environment overrides, then CLI flags.

Read once at the entry point and passed down; nothing reads the environment at import time.
Environment variables use the prefix ``LOOKUP_KNOWLEDGE_`` and ``__`` between nested names,
e.g. ``LOOKUP_KNOWLEDGE_MILVUS__URI=http://milvus:19530``. An unknown key inside a section, from the
file, the environment or a flag, is an error naming its dotted path (``Section``).

Every setting declares, once, how a running server applies an edit of the config file: ``HOT``,
``RESTART`` or ``CLI`` as ``Annotated`` metadata, on a whole section or on each of its fields.
``reload_rules`` reads them; the hot reload, config.example.yaml and docs/governance.md follow it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from retrieval.governance import GovernanceConfig
from retrieval.relevance import Logistic, TierModel
from retrieval.requests import TOP_K_MAX, TOP_K_MIN, ContentMode, HintLanguage, SupplementMode
from server.host_names import split_host

logger = logging.getLogger(__name__)

ENV_PREFIX = "LOOKUP_KNOWLEDGE_"
# The bearer token for HTTP, read by the CLI (a variable of its own: it is not a settings key).
AUTH_TOKEN_ENV = f"{ENV_PREFIX}AUTH_TOKEN"
# The principal that http.auth_token authenticates.
DEFAULT_PRINCIPAL = "default"
EmbedderName = Literal["e5-small", "bge-m3"]


ReloadRule = Literal["hot", "restart", "cli"]


@dataclass(frozen=True)
class Reload:
    """How a running server applies an edit of a setting; ``Annotated`` metadata read by reload_rules."""

    rule: ReloadRule


# Read on every call: the next call after the file changes sees the edit.
HOT = Reload("hot")
# Read once, when the server starts: the reload keeps the running value and warns.
RESTART = Reload("restart")
# Read only by CLI commands, never by a running server.
CLI = Reload("cli")


def default_data_dir() -> Path:
    """``$XDG_DATA_HOME/lookup-knowledge-mcp``, never the working directory (clients start us anywhere)."""
    xdg = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(xdg) / "lookup-knowledge-mcp"


def token_digest(token: str) -> str:
    """The hex SHA-256 of a bearer token, as http.clients stores it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Section(BaseModel):
    """A part of the settings. An unknown key is an error that names its dotted path, because an
    ignored one leaves its setting at the default without a word: a misspelt ``http.auth_token``
    would leave authentication off."""

    model_config = ConfigDict(extra="forbid")


class MilvusSettings(Section):
    uri: str | None = Field(
        default=None,
        description="Milvus URI. Unset: a Milvus Lite file in the data directory. "
        "http://host:19530 points the same code at a standalone or distributed cluster.",
    )
    token: str | None = Field(default=None, description="Milvus token (user:password or API key), if any.")
    timeout_s: float = Field(default=10.0, gt=0, le=300, description="Bound on connecting to Milvus.")
    collection_prefix: str = Field(
        default="lookup_knowledge",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,100}$",
        description="Collection names are <prefix>_<embedder>_<dim>.",
    )
    sync_interval_s: float = Field(
        default=2.0,
        gt=0,
        le=600,
        description="On a Milvus server: how often each serving replica checks the shared catalog's "
        "generation, so about the longest it answers from before another machine's ingest.",
    )


class EmbedderSettings(Section):
    name: EmbedderName = Field(default="e5-small", description="e5-small (bundled, offline) or bge-m3.")
    model_path: str = Field(
        default="BAAI/bge-m3", min_length=1, description="bge-m3 only: a local model directory or a hub id."
    )
    device: str = Field(default="cpu", description="bge-m3 only: torch device.")
    batch_size: int = Field(default=16, ge=1, le=1024, description="Passages embedded per batch at ingest.")
    query_cache_size: int = Field(
        default=2048, ge=0, le=1_000_000, description="LRU entries of query embeddings (0 disables)."
    )


class RerankerSettings(Section):
    enabled: bool = Field(
        default=False,
        description="Rescore the best candidate chunks of each lookup with a cross-encoder (FlagReranker). "
        "Off by default: it needs the bge-m3 extra and its weights, and costs one forward pass per "
        "candidate on every lookup.",
    )
    model_path: str = Field(
        default="BAAI/bge-reranker-v2-m3",
        min_length=1,
        description="A local cross-encoder directory or a hub id (e.g. bge-reranker-v2-m3).",
    )
    device: str = Field(default="cpu", description="torch device of the reranker.")
    top_n: int = Field(default=8, ge=1, le=64, description="Candidate chunks the reranker scores per lookup.")
    batch_size: int = Field(default=16, ge=1, le=1024, description="Pairs scored per forward pass.")


class ChunkingSettings(Section):
    max_chars: int = Field(default=1200, ge=100, le=20000, description="Largest chunk, in characters.")
    max_tokens: int = Field(
        default=300,
        ge=32,
        le=8192,
        description="Largest chunk in the embedder's tokens, title and heading line included; kept "
        "under the model's window (e5-small: 512) so no chunk is cut when embedded.",
    )


class ConversionSettings(Section):
    timeout_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Longest conversion of one HTML, PDF, Word or PowerPoint file; a file that takes "
        "longer is stopped and reported, and the ingest goes on.",
    )
    memory_mb: int = Field(
        default=1024,
        ge=128,
        le=65536,
        description="Address space of the process that converts files (RLIMIT_AS); a file that needs "
        "more is reported, and the ingest goes on.",
    )
    max_file_mb: float = Field(
        default=25.0,
        gt=0,
        le=4096,
        description="Largest HTML, PDF, Word or PowerPoint file converted; a larger one is reported "
        "without being read further.",
    )


def _default_models() -> dict[str, TierModel]:
    # Fitted by `lookup-knowledge-mcp calibrate` on the nine evaluation knowledge bases under
    # examples/eval (see docs/relevance.md); bge-m3 keeps a conservative hand-set model.
    return {
        "e5-small": TierModel(
            on_topic=Logistic(
                weights={
                    "similarity": 17.7133,
                    "support": -2.3455,
                    "agree": 0.7781,
                    "margin": -3.105,
                    "unseen": -3.9876,
                    "unseen_name": -1.457,
                    "background": -26.8734,
                },
                bias=5.8942,
                threshold=0.0045,
            ),
            top_right=Logistic(
                weights={
                    "margin": -6.1562,
                    "gap": 16.5332,
                    "similarity": 0.1968,
                    "top_coverage": 0.8442,
                    "agree": 0.0063,
                    "top_unseen": -0.5877,
                },
                bias=0.1897,
                threshold=0.9604,
            ),
            confident=0.5259,
            cross_language_offset=0.06,
            lexical_weight=0.3,
            supplement_margin=0.3289,
        ),
        "bge-m3": TierModel(
            on_topic=Logistic(weights={"similarity": 12.0, "coverage": 4.0}, bias=-6.0, threshold=0.2),
            top_right=Logistic(weights={"margin": 30.0, "agree": 1.5}, bias=-1.0, threshold=0.5),
            cross_language_offset=0.0,
            # Hand-set: BGE-M3's own token weights, a third as strong as the dense similarity.
            sparse_weight=0.3,
        ),
    }


class RelevanceSettings(Section):
    models: dict[str, TierModel] = Field(
        default_factory=_default_models,
        description="Per embedder: the logistic models that turn evidence features into tiers, and the "
        "cross-language offset. Written by the calibrate command.",
    )
    hint_language: HintLanguage = Field(
        default="auto", description="Language of hints and guidance; auto follows the query's script."
    )


class RetrievalSettings(Section):
    default_top_k: Annotated[int, CLI] = Field(
        default=3, ge=TOP_K_MIN, le=TOP_K_MAX, description="top_k when the caller gives none."
    )
    content: Annotated[ContentMode, HOT] = Field(
        default="passage",
        description="passage: results carry the sections that matched and memory is kept per section; "
        "document: the predecessor's behaviour, the head of each document and memory per document.",
    )
    supplements: Annotated[SupplementMode, HOT] = Field(
        default="graded",
        description="graded: supplements only as close to the primary as the tier warrants (none for "
        "PRECISE); top_k: always up to top_k documents, as a plain retriever returns them.",
    )
    primary_max_chars: Annotated[int, HOT] = Field(
        default=4000,
        ge=200,
        le=100_000,
        description="Primary content cap; a document that fits within it is sent whole.",
    )
    supplement_max_chars: Annotated[int, HOT] = Field(
        default=1200,
        ge=100,
        le=100_000,
        description="Supplement cap; a document that fits within it is sent whole.",
    )
    read_max_chars: Annotated[int, HOT] = Field(
        default=20_000,
        ge=1000,
        le=1_000_000,
        description="Cap on one read of a whole document (read_knowledge_doc, knowledge://doc/...).",
    )
    max_lookups_in_flight: Annotated[int, HOT] = Field(
        default=64,
        ge=1,
        le=10_000,
        description="Lookups one server process runs at once; past it a lookup is refused at once with a "
        "retryable 'server busy' tool error, so no queue grows and no admitted call waits behind more.",
    )


class MemorySettings(Section):
    ttl_seconds: Annotated[float, HOT] = Field(
        default=1800, gt=0, description="Idle time after which a session is forgotten."
    )
    max_sessions: Annotated[int, HOT] = Field(
        default=10_000, ge=1, description="Sessions kept; least recently used go first."
    )
    # Restart: memory is restored once, at start, so writing follows the value it was restored under.
    persist: Annotated[bool, RESTART] = Field(
        default=True, description="Keep action memory in SQLite so a restart does not hand documents back."
    )


class LogSettings(Section):
    # Restart: the log is opened once, at start.
    enabled: Annotated[bool, RESTART] = Field(
        default=True, description="Write every tool call to the SQLite invocation log."
    )
    # Hot: a privacy switch; turned off in a running server, the next rows store a hash.
    log_queries: Annotated[bool, HOT] = Field(
        default=True, description="Store query text; false stores a hash instead."
    )
    retention_days: Annotated[float | None, HOT] = Field(
        default=90.0,
        gt=0,
        description="Rows older than this are deleted in the background; null keeps every age.",
    )
    max_rows: Annotated[int | None, HOT] = Field(
        default=1_000_000,
        ge=1,
        description="Only the newest rows are kept, this many at most (about 1.4-2.1 GB per million); null: any number.",
    )
    maintenance_interval_s: Annotated[float, HOT] = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="How often the background pass applies retention and checkpoints a WAL that has commits.",
    )


class HttpClient(Section):
    """One principal of the HTTP transports: a name and the SHA-256 of its bearer token."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="The principal's name; explicit session keys are kept apart per name.",
    )
    token_sha256: str = Field(
        pattern=r"^[0-9a-fA-F]{64}$",
        description="Hex SHA-256 of the client's bearer token (e.g. `printf %s TOKEN | sha256sum`).",
    )


# What a configured bearer token may be (an HTTP header value a request can carry back exactly).
_BEARER_TOKEN = re.compile(r"[\x21-\x7e]+")
BEARER_TOKEN_RULE = (
    "a bearer token is one or more visible ASCII characters, without spaces; "
    "to serve without one, leave it out rather than empty"
)


class HttpSettings(Section):
    host: str = Field(default="127.0.0.1", description="Bind address for HTTP transports.")
    port: int = Field(default=8765, ge=1, le=65535, description="Port for HTTP transports.")
    auth_token: str | None = Field(
        default=None,
        description="When set, HTTP requests may authenticate with 'Authorization: Bearer <token>' "
        f"as the principal named 'default' (env {AUTH_TOKEN_ENV}, --auth-token-file).",
    )
    clients: list[HttpClient] = Field(
        default_factory=list,
        description="Named HTTP clients, each with its own token (stored as a SHA-256 hex digest). "
        "When any client or auth_token is set, every HTTP request needs one of the tokens.",
    )
    allow_remote_session_keys: bool = Field(
        default=False,
        description="Without auth, honour explicit session keys (X-Session-Id, _meta.session_id) from "
        "non-loopback HTTP peers too. Off: such keys are refused, since anyone could name them.",
    )
    max_body_bytes: int = Field(default=1_000_000, ge=1024, description="Largest accepted request body.")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Extra Host values allowed by DNS-rebinding protection."
    )

    @field_validator("auth_token")
    @classmethod
    def _token_is_usable(cls, token: str | None) -> str | None:
        # An empty token used to mean "no authentication": `auth_token: ""`, or a variable set from
        # an unset shell variable, served openly when a token was meant. Surrounding whitespace
        # could never match, since a request's token is read without it.
        if token is not None and not _BEARER_TOKEN.fullmatch(token):
            raise ValueError(BEARER_TOKEN_RULE)
        return token

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_can_match(cls, hosts: list[str]) -> list[str]:
        # Checked with the Host header's own parser: a value it cannot read would never match.
        malformed = [host for host in hosts if split_host(host)[0] is None]
        if malformed:
            shown = ", ".join(repr(host) for host in malformed)
            raise ValueError(f"not a host name or host:port (such as kb.example or kb.example:8443): {shown}")
        return hosts

    @model_validator(mode="after")
    def _principals_are_distinct(self) -> HttpSettings:
        names = [client.name for client in self.clients]
        digests = [client.token_sha256.lower() for client in self.clients]
        if self.auth_token:
            names.append(DEFAULT_PRINCIPAL)
            digests.append(token_digest(self.auth_token))
        for label, values in (("name", names), ("token", digests)):
            repeated = sorted({value for value in values if values.count(value) > 1})
            if repeated:
                shown = repeated if label == "name" else f"{len(repeated)} token(s)"
                raise ValueError(
                    f"http.clients: each client needs its own {label}; repeated: {shown} "
                    f"(http.auth_token is the client named {DEFAULT_PRINCIPAL!r})"
                )
        return self

    def principals(self) -> dict[str, str]:
        """Token SHA-256 hex digest -> principal name, for every configured client."""
        found = {client.token_sha256.lower(): client.name for client in self.clients}
        if self.auth_token:
            found[token_digest(self.auth_token)] = DEFAULT_PRINCIPAL
        return found


class WatchSettings(Section):
    directory: Path | None = Field(
        default=None,
        description="serve --watch: a knowledge base folder kept in sync with the index while serving "
        "(ingested at start and after every burst of changes).",
    )
    poll_interval_s: float = Field(
        default=0.5, gt=0, le=60, description="How often the watched folder's modification times are read."
    )
    debounce_s: float = Field(
        default=1.0,
        ge=0,
        le=600,
        description="Quiet time after the last change before the folder is ingested.",
    )


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
        return (init_settings, env_settings, _YamlSource(settings_cls))


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


# The YAML document being loaded; set only for the duration of one load_settings call.
_yaml_data: ContextVar[dict[str, Any]] = ContextVar("_yaml_data", default={})  # noqa: B039


class _YamlSource(PydanticBaseSettingsSource):
    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return _yaml_data.get().get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_yaml_data.get())


class ConfigError(ValueError):
    """The configuration file or an override is invalid; the message names the field."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _mark(mark: yaml.Mark) -> str:
    # PyYAML counts lines and columns from 0; editors, and PyYAML's own messages, from 1.
    return f"line {mark.line + 1}, column {mark.column + 1}"


def _describe_yaml_error(exc: yaml.YAMLError) -> str:
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
        raise ConfigError(
            f"config file {str(path)!r} is not valid YAML: {_describe_yaml_error(exc)}"
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must hold a mapping, not {type(data).__name__}")
    return data


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
    token = _yaml_data.set(data)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        source = str(config_path) if config_path else "environment/flags"
        raise ConfigError(describe_validation_error(exc, source)) from exc
    except SettingsError as exc:  # a variable for a list or a mapping that is not JSON
        raise ConfigError(describe_unparsable_env(exc, os.environ)) from exc
    finally:
        _yaml_data.reset(token)
