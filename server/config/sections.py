"""The sections of the settings model, and how a running server applies an edit of each setting.

Every setting declares, once, how a running server applies an edit of the config file: ``HOT``,
``RESTART`` or ``CLI`` as ``Annotated`` metadata, on a whole section or on each of its fields.
``server.config.settings.reload_rules`` reads them. The HTTP section is in ``http_settings.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from retrieval.relevance import Logistic, TierModel
from retrieval.requests import TOP_K_MAX, TOP_K_MIN, ContentMode, HintLanguage, SupplementMode

# Every environment variable of the settings starts with it (then ``__`` between nested names).
ENV_PREFIX = "LOOKUP_KNOWLEDGE_"
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
