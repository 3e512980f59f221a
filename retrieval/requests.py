"""What a lookup asks for, the policy it is answered under, and the call that carries both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from retrieval.governance import GovernanceConfig
from retrieval.relevance import TierModel

if TYPE_CHECKING:
    from retrieval.action_memory import MemorySnapshot
    from retrieval.engine import KnowledgeView
    from retrieval.models import SessionScope

# passage: the matching section of each document; document: whole documents up to the caps.
ContentMode = Literal["passage", "document"]
# graded: supplements only as close as the tier allows; top_k: always up to top_k documents.
SupplementMode = Literal["graded", "top_k"]
HintLanguage = Literal["auto", "en", "zh"]

# How many documents one lookup may return; the MCP tool, the CLI, the traces and the settings
# all take their bounds from here.
TOP_K_MIN, TOP_K_MAX = 1, 10


@dataclass(frozen=True)
class LookupRequest:
    query: str
    domain: str | None = None
    top_k: int = 3
    missing_dimension: str | None = None

    @property
    def dimension(self) -> str:
        return (self.missing_dimension or "").strip()

    @property
    def targeted(self) -> bool:
        return bool(self.dimension)

    @property
    def search_text(self) -> str:
        """What the lookup is ranked by: a targeted lookup's dimension, since its query names the
        topic the session already holds."""
        return self.dimension or self.query

    @property
    def topic_text(self) -> str | None:
        """A targeted lookup's query and dimension together: the topic its dimension must stay in."""
        return f"{self.query}\n{self.dimension}" if self.targeted else None


@dataclass(frozen=True)
class Policy:
    """The hot-reloadable part of the configuration, read fresh for every call."""

    tier_model: TierModel
    governance: GovernanceConfig
    hint_language: HintLanguage = "auto"
    primary_max_chars: int = 4000
    supplement_max_chars: int = 1200
    content: ContentMode = "passage"
    supplements: SupplementMode = "graded"


@dataclass(frozen=True)
class LookupCall:
    """One call as the lookup's steps see it: the request, its policy, its view and its session.

    ``snapshot`` is what the session held before the call; ``session_key`` None means memory is
    off (no session could be identified).
    """

    request: LookupRequest
    policy: Policy
    view: KnowledgeView
    scope: SessionScope
    session_key: str | None
    snapshot: MemorySnapshot | None

    @property
    def governed(self) -> bool:
        """Governance applies: it is enabled and the call has a session to count it in."""
        return self.policy.governance.enabled and self.snapshot is not None
