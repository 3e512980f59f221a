"""The lookup service: retrieval + grading + action memory + governance -> one LookupResult.

Plain Python (no MCP): the MCP tool, the CLI and the replay evaluation all call ``lookup``.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from retrieval.engine import Evidence, KnowledgeEngine, KnowledgeView
from retrieval.governance import (
    Decision,
    GovernanceConfig,
    GuidanceKey,
    NextCall,
    Usage,
    decide,
    guidance_text,
    water_level,
)
from retrieval.models import (
    AlreadyInContext,
    Budget,
    DedupReason,
    DocumentContent,
    LookupResult,
    SessionScope,
)
from retrieval.relevance import Language, Thresholds, Tier, completeness_hint, detect_language, grade
from retrieval.tracker import ActionMemory, MemorySnapshot

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]")


def estimate_tokens(text: str) -> int:
    """Rough LLM token count: one per CJK character, one per four other characters."""
    cjk = len(_CJK.findall(text))
    return cjk + (len(text) - cjk + 3) // 4


class UnknownDomainError(ValueError):
    """The domain argument names no domain of the knowledge base."""


@dataclass(frozen=True)
class LookupRequest:
    query: str
    domain: str | None = None
    top_k: int = 3
    missing_dimension: str | None = None


@dataclass(frozen=True)
class Policy:
    """The hot-reloadable part of the configuration, read fresh for every call."""

    thresholds: Thresholds
    governance: GovernanceConfig
    hint_language: str = "auto"
    primary_max_chars: int = 4000
    supplement_max_chars: int = 1200
    cross_language_offset: float = 0.0


@dataclass
class LookupOutcome:
    """The result for the caller and the raw details for the invocation log."""

    result: LookupResult
    details: dict[str, Any]
    result_doc_keys: list[str]
    ran_retrieval: bool
    call_index: int
    latency_ms: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def _truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


class LookupService:
    """Runs one lookup_knowledge call for one session."""

    def __init__(self, engine: KnowledgeEngine, memory: ActionMemory, policy: Callable[[], Policy]) -> None:
        self.engine = engine
        self.memory = memory
        self._policy = policy

    async def lookup(
        self, request: LookupRequest, *, session_key: str | None, scope: SessionScope
    ) -> LookupOutcome:
        """Answer one call; session_key None means memory is off (no session could be identified)."""
        started = time.perf_counter()
        policy = self._policy()
        language = self._language(policy, request.query)
        view = self.engine.view()
        if request.domain is not None and request.domain not in view.domains:
            known = ", ".join(view.domains) or "(none: the knowledge base is empty)"
            raise UnknownDomainError(f"unknown domain {request.domain!r}; known domains: {known}")
        snapshot = self.memory.snapshot(session_key) if session_key else None
        governed = policy.governance.enabled and snapshot is not None

        refusal = self._refusal(snapshot, request) if governed else None
        if refusal is not None and snapshot is not None and session_key is not None:
            outcome = self._refused(refusal, session_key, scope, policy, language, snapshot)
        else:
            offset = policy.cross_language_offset
            evidence = self.engine.cached_evidence(request.query, request.domain, request.top_k, offset)
            if evidence is None:
                evidence = await asyncio.to_thread(
                    self.engine.retrieve, request.query, request.domain, request.top_k, offset
                )
            outcome = self._answer(evidence, view, request, session_key, scope, policy, language, snapshot)
        outcome.latency_ms = (time.perf_counter() - started) * 1000
        return outcome

    # -- refusals (no retrieval at all) ------------------------------------------------
    @staticmethod
    def _refusal(snapshot: MemorySnapshot | None, request: LookupRequest) -> DedupReason | None:
        if snapshot is None:
            return None
        if snapshot.next_call == NextCall.STOP:
            # The circuit opened on an earlier call; only reset_session or the TTL close it again.
            return "circuit_open"
        if snapshot.next_call == NextCall.TARGETED_ONLY and not (request.missing_dimension or "").strip():
            return "missing_dimension_required"
        return None

    def _refused(
        self,
        reason: DedupReason,
        session_key: str,
        scope: SessionScope,
        policy: Policy,
        language: Language,
        snapshot: MemorySnapshot,
    ) -> LookupOutcome:
        config = policy.governance
        usage = Usage(snapshot.calls + 1, snapshot.tokens, len(snapshot.retrieved_domains))
        level = water_level(config, usage)
        key: GuidanceKey
        if reason == "circuit_open":
            next_call, key = NextCall.STOP, "circuit_open"
        else:
            # Still only targeted lookups, unless this refusal pushed the water level to STOP.
            decision = decide(config, Tier.REFERENCE, usage)
            next_call = decision.next_call
            key = "missing_dimension_required" if next_call is not NextCall.STOP else "stop_budget"
        after = self.memory.record_call(
            session_key, returned=(), ran_retrieval=False, tokens=0, next_call=next_call
        )
        guidance = guidance_text(config, key, language, usage)
        result = LookupResult(
            found=False,
            relevance_level=Tier.DEDUPED.value,
            completeness_hint=completeness_hint(Tier.DEDUPED, language),
            retrieved_domains_this_session=list(after.retrieved_domains),
            dedup_reason=reason,
            session_scope=scope,
            message=guidance,
            budget=Budget(
                calls_used=usage.calls, water_level=level.value, next_call=next_call.value, guidance=guidance
            ),
        )
        details = {
            "blocked": True,
            "relevance_level": Tier.DEDUPED.value,
            "dedup_reason": reason,
            "retrieved_domains": list(after.retrieved_domains),
            "embedder": self.engine.embedder_name,
            "thresholds": policy.thresholds.model_dump(),
        }
        return LookupOutcome(result, details, [], ran_retrieval=False, call_index=usage.calls)

    # -- a real answer ---------------------------------------------------------------
    def _answer(
        self,
        evidence: Evidence,
        view: KnowledgeView,
        request: LookupRequest,
        session_key: str | None,
        scope: SessionScope,
        policy: Policy,
        language: Language,
        snapshot: MemorySnapshot | None,
    ) -> LookupOutcome:
        thresholds = policy.thresholds
        retrieved = snapshot.retrieved_doc_keys if snapshot else frozenset()
        l0 = [k for k in evidence.l0_doc_keys if k in view.entries]
        # Candidates: every L0 match, then L1 documents at or above the reference threshold.
        candidates = list(l0) + [
            k for k, sim in evidence.similarities if sim >= thresholds.reference and k not in l0
        ]
        fresh = [k for k in candidates if k not in retrieved]
        seen = [k for k in candidates if k in retrieved]
        dedup_reason: DedupReason | None = None
        chosen: list[str]

        if len(l0) == 1 and l0[0] in retrieved:
            # The one exact match is already in context: nothing more precise exists.
            tier, chosen = Tier.DEDUPED, []
            dedup_reason = "doc_retrieved"
        elif not candidates:
            tier, chosen = Tier.NO_MATCH, []
        elif not fresh:
            tier, chosen = Tier.DEDUPED, []
            dedup_reason = "doc_retrieved"
        else:
            chosen = self._rank(fresh, l0, evidence)[: request.top_k]
            l0_fresh_sims = [s for k in l0 if k in fresh and (s := evidence.similarity(k)) is not None]
            tier = grade(
                l0_match_count=len(l0),
                best_l0_similarity=max(l0_fresh_sims, default=None),
                top_similarity=max(
                    (s for k in fresh if (s := evidence.similarity(k)) is not None), default=None
                ),
                thresholds=thresholds,
            )
            if tier is Tier.NO_MATCH:
                chosen = []

        config = policy.governance
        governed = config.enabled and snapshot is not None
        same_domain = (
            governed
            and bool(chosen)
            and snapshot is not None
            and view.entries[chosen[0]].domain in snapshot.retrieved_domains
        )
        if same_domain and config.domain_policy == "hard" and not (request.missing_dimension or "").strip():
            # Scheme B: the best hit lands in a domain this session already covered.
            tier, chosen, dedup_reason = Tier.DEDUPED, [], "domain_retrieved"

        documents = [self._content(view, key, i == 0, policy) for i, key in enumerate(chosen)]
        tokens = sum(estimate_tokens(d.content) for d in documents)
        already = [AlreadyInContext(doc_key=k, title=view.entries[k].title) for k in seen]

        decision: Decision | None = None
        if snapshot is not None and session_key is not None:
            domains_after = set(snapshot.retrieved_domains) | {d.domain for d in documents}
            usage = Usage(snapshot.calls + 1, snapshot.tokens + tokens, len(domains_after))
            # A domain_retrieved refusal leaves the targeted channel open (its guidance says so):
            # it is decided like a REFERENCE result, so only a call with missing_dimension follows.
            deciding_tier = Tier.REFERENCE if dedup_reason == "domain_retrieved" else tier
            decision = decide(config, deciding_tier, usage) if config.enabled else None
            after = self.memory.record_call(
                session_key,
                returned=[(d.domain, d.doc_key, d.title) for d in documents],
                ran_retrieval=True,
                tokens=tokens,
                next_call=decision.next_call.value if decision else None,
            )
            retrieved_domains = list(after.retrieved_domains)
            call_index = usage.calls
        else:
            usage = Usage(1, tokens, len({d.domain for d in documents}))
            retrieved_domains = sorted({d.domain for d in documents})
            call_index = 1
        budget = self._budget(config, decision, usage, language, dedup_reason, memory=snapshot is not None)
        hint = completeness_hint(tier, language)
        result = LookupResult(
            found=bool(documents),
            relevance_level=tier.value,
            completeness_hint=hint,
            primary=documents[0] if documents else None,
            supplement=documents[1:],
            retrieved_domains_this_session=retrieved_domains,
            dedup_reason=dedup_reason,
            already_in_context=already,
            session_scope=scope,
            message=self._message(
                tier, documents, already, dedup_reason, budget, session_key is None, same_domain=same_domain
            ),
            budget=budget,
        )
        top = evidence.similarities[0][1] if evidence.similarities else None
        details = {
            "l0_titles": [view.entries[k].title for k in l0],
            "l0_match_count": len(l0),
            "l1_scores": [round(s, 6) for s in evidence.l1_scores],
            "l1_top_score": round(max(evidence.l1_scores), 6) if evidence.l1_scores else None,
            "l1_top_similarity": round(top, 4) if top is not None else None,
            "relevance_level": tier.value,
            "completeness_hint": hint,
            "retrieved_domains": retrieved_domains,
            "dedup_reason": dedup_reason,
            # domain_policy soft: a lookup landing in an already-retrieved domain is only reported.
            "same_domain": same_domain,
            "embedder": self.engine.embedder_name,
            "thresholds": thresholds.model_dump(),
            "content_tokens": tokens,
        }
        return LookupOutcome(
            result, details, [d.doc_key for d in documents], ran_retrieval=True, call_index=call_index
        )

    @staticmethod
    def _rank(fresh: list[str], l0: list[str], evidence: Evidence) -> list[str]:
        """Exact (L0) matches first, then by similarity."""
        sims = dict(evidence.similarities)
        return sorted(fresh, key=lambda k: (k not in l0, -sims.get(k, 0.0), k))

    @staticmethod
    def _content(view: KnowledgeView, key: str, primary: bool, policy: Policy) -> DocumentContent:
        entry = view.entries[key]
        limit = policy.primary_max_chars if primary else policy.supplement_max_chars
        return DocumentContent(
            doc_key=key, title=entry.title, domain=entry.domain, content=_truncate(entry.body, limit)
        )

    @staticmethod
    def _budget(
        config: GovernanceConfig,
        decision: Decision | None,
        usage: Usage,
        language: Language,
        dedup_reason: DedupReason | None,
        *,
        memory: bool,
    ) -> Budget:
        if decision is None:
            text = (
                "governance is off: lookups are not limited"
                if memory
                else "no session memory: dedup and budget are off for this call"
            )
            return Budget(calls_used=usage.calls, water_level=None, next_call=None, guidance=text)
        key: GuidanceKey = decision.guidance_key
        if dedup_reason == "domain_retrieved" and decision.next_call is not NextCall.STOP:
            key = "domain_retrieved"
        return Budget(
            calls_used=usage.calls,
            water_level=decision.water_level.value,
            next_call=decision.next_call.value,
            guidance=guidance_text(config, key, language, usage),
        )

    @staticmethod
    def _message(
        tier: Tier,
        documents: list[DocumentContent],
        already: list[AlreadyInContext],
        dedup_reason: DedupReason | None,
        budget: Budget,
        memory_off: bool,
        *,
        same_domain: bool = False,
    ) -> str:
        parts: list[str] = []
        if documents:
            parts.append(f"{len(documents)} new document(s), tier {tier.value}.")
            if same_domain:
                parts.append(f"The best match is in domain {documents[0].domain!r}, already retrieved.")
        elif dedup_reason == "doc_retrieved":
            parts.append("Every matching document was already returned to this session: use what you have.")
        elif dedup_reason == "domain_retrieved":
            parts.append("The best match is in a domain this session already retrieved.")
        else:
            parts.append("Nothing in the knowledge base matches.")
        if already:
            parts.append(f"{len(already)} matching document(s) already in your context.")
        if memory_off:
            parts.append("No session could be identified, so documents may repeat.")
        parts.append(budget.guidance)
        return " ".join(parts)

    @staticmethod
    def _language(policy: Policy, query: str) -> Language:
        if policy.hint_language in ("en", "zh"):
            return policy.hint_language  # type: ignore[return-value]
        return detect_language(query)

    def reset(self, session_key: str | None) -> bool:
        """Forget a session (reset_session); reopens its circuit."""
        return self.memory.clear(session_key) if session_key else False
