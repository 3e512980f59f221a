"""The result models that the MCP tool and the CLI return. No raw scores, ever."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

# The vocabulary of every result, defined here once; the rest of the code imports it.


class Tier(StrEnum):
    """The relevance level of a lookup result."""

    PRECISE = "PRECISE"
    HIGHLY_RELEVANT = "HIGHLY_RELEVANT"
    REFERENCE = "REFERENCE"
    DEDUPED = "DEDUPED"
    NO_MATCH = "NO_MATCH"


class WaterLevel(StrEnum):
    """How much of its retrieval budget a session has used."""

    LOW = "LOW"
    MEDIUM = "MEDIUM"
    HIGH = "HIGH"


class NextCall(StrEnum):
    """What the session may do next."""

    ALLOW = "ALLOW"
    TARGETED_ONLY = "TARGETED_ONLY"
    STOP = "STOP"


DedupReason = Literal["doc_retrieved", "domain_retrieved", "circuit_open", "missing_dimension_required"]
# The dedup reasons that refuse a call outright (no retrieval ran), as stats and traces count them.
BLOCKING_REASONS: tuple[DedupReason, ...] = ("circuit_open",)
SessionScope = Literal["explicit", "mcp-session", "connection", "none"]


class DocumentContent(BaseModel):
    doc_key: str = Field(description="Path of the document relative to the knowledge base root.")
    title: str
    domain: str
    content: str = Field(
        description="The whole document when it fits, else the passages that matched; each passage headed "
        "by its 'Title › Section' path."
    )
    sections: list[str] = Field(default_factory=list, description="The sections this content holds.")
    section_count: int = Field(default=1, description="How many passages the whole document has.")
    partial: bool = Field(
        default=False,
        description="True when the document has more than this content; read knowledge://doc/{doc_key} "
        "or call read_knowledge_doc for the rest.",
    )


class AlreadyInContext(BaseModel):
    doc_key: str
    title: str
    sections: list[str] = Field(default_factory=list, description="The sections of it this session holds.")


class Budget(BaseModel):
    calls_used: int = Field(description="lookup_knowledge calls this session has made, this one included.")
    water_level: WaterLevel | None = Field(
        description="How much of its retrieval budget the session has used; null without session memory."
    )
    next_call: NextCall | None = Field(
        description="ALLOW: another lookup on a new topic is fine. TARGETED_ONLY: only with "
        "missing_dimension. STOP: lookup_knowledge is closed for this session; answer now."
    )
    guidance: str = Field(description="What to do next, in plain words.")


class LookupResult(BaseModel):
    found: bool = Field(description="Whether new content is returned.")
    relevance_level: Tier
    completeness_hint: str = Field(description="Whether looking further can help.")
    primary: DocumentContent | None = None
    supplement: list[DocumentContent] = Field(default_factory=list)
    retrieved_domains_this_session: list[str] = Field(default_factory=list)
    dedup_reason: DedupReason | None = None
    already_in_context: list[AlreadyInContext] = Field(
        default_factory=list, description="Documents that matched but this session already has."
    )
    session_scope: SessionScope = "none"
    message: str = ""
    budget: Budget


class DomainInfo(BaseModel):
    domain_id: str
    description: str
    covers: list[str] = Field(description="Document titles and keywords in this domain.")
    document_count: int
    when_to_retrieve: str


class KnowledgeMap(BaseModel):
    domains: list[DomainInfo]
    document_count: int
    empty: bool = Field(default=False, description="True when nothing has been ingested yet.")
    message: str | None = Field(default=None, description="What to do about an empty knowledge base.")


class ResetResult(BaseModel):
    session_scope: SessionScope
    forgotten: bool = Field(description="Whether the session had memory to forget.")
    message: str


class ReadResult(BaseModel):
    """A whole document, or one named section of it, read on purpose."""

    document: DocumentContent | None = Field(
        description="The content; null when everything was already held."
    )
    already_in_context: list[AlreadyInContext] = Field(default_factory=list)
    session_scope: SessionScope = "none"
    message: str = ""


class RetrievalDetails(BaseModel):
    """What the invocation log keeps about one lookup (raw scores stay here, never in the result)."""

    blocked: bool = Field(description="Refused by governance without running retrieval.")
    relevance_level: Tier
    dedup_reason: DedupReason | None = None
    completeness_hint: str = ""
    embedder: str
    l0_titles: list[str] = Field(default_factory=list)
    l0_match_count: int = 0
    l1_top_similarity: float | None = Field(
        default=None, description="Best chunk similarity (offset applied)."
    )
    l1_scores: list[float] = Field(default_factory=list, description="Raw cosines of the dense hits.")
    features: dict[str, float] = Field(default_factory=dict, description="What the tier models read.")
    thresholds: dict[str, float] | None = Field(default=None, description="The tier models' thresholds.")
    retrieved_domains: list[str] = Field(default_factory=list)
    same_domain: bool = False
    content_tokens: int = 0
    passages: dict[str, list[str]] = Field(default_factory=dict, description="doc_key -> sections delivered.")
