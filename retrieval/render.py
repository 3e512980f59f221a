"""The render step of a lookup: the result the agent reads, and the details the log keeps."""

from __future__ import annotations

from retrieval.account import Account
from retrieval.action_memory import MemorySnapshot
from retrieval.engine import KnowledgeView
from retrieval.governance import GuidanceKey, guidance_text
from retrieval.grade import Graded
from retrieval.models import (
    AlreadyInContext,
    Budget,
    DocumentContent,
    LookupResult,
    NextCall,
    RetrievalDetails,
    Tier,
)
from retrieval.plan import Plan
from retrieval.relevance import completeness_hint
from retrieval.requests import LookupCall, Policy
from storage.text import Language, detect_language


def render_result(call: LookupCall, account: Account) -> LookupResult:
    """The result the agent reads."""
    plan, documents, snapshot = account.plan, account.documents, call.snapshot
    already = [_already(call.view, snapshot, key) for key in plan.already if snapshot is not None]
    language = _language(call.policy, call.request.query)
    budget = _budget(call, account, language)
    return LookupResult(
        found=bool(documents),
        relevance_level=plan.tier,
        completeness_hint=completeness_hint(plan.tier, language),
        primary=documents[0] if documents else None,
        supplement=documents[1:],
        retrieved_domains_this_session=account.domains,
        dedup_reason=plan.dedup_reason,
        already_in_context=already,
        session_scope=call.scope,
        message=_message(plan, documents, already, budget, call.view, memory_off=call.session_key is None),
        budget=budget,
    )


def _language(policy: Policy, query: str) -> Language:
    if policy.hint_language == "en":
        return "en"
    if policy.hint_language == "zh":
        return "zh"
    return detect_language(query)


def _already(view: KnowledgeView, snapshot: MemorySnapshot | None, key: str) -> AlreadyInContext:
    held = snapshot.documents[key] if snapshot else None
    title = view.entries[key].title if key in view.entries else (held.title if held else key)
    return AlreadyInContext(doc_key=key, title=title, sections=list(held.headings) if held else [])


def _budget(call: LookupCall, account: Account, language: Language) -> Budget:
    plan, usage, decision = account.plan, account.usage, account.decision
    if not call.governed:
        text = (
            "governance is off: lookups are not limited"
            if call.session_key is not None
            else "no session memory: dedup and budget are off for this call"
        )
        return Budget(calls_used=usage.calls, water_level=None, next_call=None, guidance=text)
    key: GuidanceKey
    if plan.dedup_reason == "circuit_open":
        key = "circuit_open"
    elif decision is None:
        key = "allow"
    elif plan.dedup_reason == "domain_retrieved" and decision.next_call is not NextCall.STOP:
        key = "domain_retrieved"
    elif plan.dedup_reason == "missing_dimension_required" and decision.next_call is not NextCall.STOP:
        key = "missing_dimension_required"
    else:
        key = decision.guidance_key
    return Budget(
        calls_used=usage.calls,
        water_level=account.level,
        next_call=account.next_call,
        guidance=guidance_text(call.policy.governance, key, language, usage),
    )


def _message(
    plan: Plan,
    documents: list[DocumentContent],
    already: list[AlreadyInContext],
    budget: Budget,
    view: KnowledgeView,
    *,
    memory_off: bool,
) -> str:
    parts: list[str] = []
    if documents:
        parts.append(f"{len(documents)} new passage(s), tier {plan.tier.value}.")
        if plan.tier is Tier.REFERENCE:
            # REFERENCE covers questions the knowledge base may not answer: say so plainly.
            parts.append(
                "These documents are related to the question but may not answer it: check that "
                "they do before relying on them."
            )
        if any(d.partial for d in documents):
            parts.append("Partial documents: read knowledge://doc/{doc_key} or read_knowledge_doc for more.")
    elif plan.dedup_reason == "circuit_open":
        parts.append("Retrieval skipped: lookup_knowledge is closed for this session.")
    elif plan.held_match is not None:
        doc_key, heading = plan.held_match
        title = view.entries[doc_key].title if doc_key in view.entries else doc_key
        where = f"'{title}', section '{heading}'" if heading else f"'{title}'"
        parts.append(f"You already hold the passage that best matches this dimension: {where} ({doc_key}).")
    elif plan.dedup_reason is not None:
        parts.append("You already hold what matches.")
    else:
        parts.append("Nothing in the knowledge base matches.")
    if already:
        parts.append(f"{len(already)} matching document(s) already in your context.")
    if memory_off:
        parts.append("No session could be identified, so documents may repeat.")
    # The guidance also stands alone in the budget, where it starts in lower case.
    parts.append(budget.guidance[:1].upper() + budget.guidance[1:])
    return " ".join(parts)


def retrieval_details(
    call: LookupCall, graded: Graded | None, account: Account, result: LookupResult, embedder: str
) -> RetrievalDetails:
    """What the invocation log keeps of one lookup: the features, thresholds and passages behind its result."""
    model, plan = call.policy.tier_model, account.plan
    return RetrievalDetails(
        blocked=not account.retrieved,
        relevance_level=result.relevance_level,
        dedup_reason=result.dedup_reason,
        completeness_hint=result.completeness_hint,
        embedder=embedder,
        l0_titles=graded.l0_titles if graded else [],
        l0_match_count=len(graded.l0_docs) if graded else 0,
        l1_top_similarity=round(graded.features["similarity"], 4) if graded else None,
        l1_scores=[round(s, 6) for s in graded.cosines] if graded else [],
        features={k: round(v, 4) for k, v in graded.features.items()} if graded else {},
        thresholds={
            "on_topic": model.on_topic.threshold,
            "confident": model.confident,
            "top_right": model.top_right.threshold,
        },
        retrieved_domains=result.retrieved_domains_this_session,
        same_domain=plan.same_domain,
        content_tokens=account.tokens,
        passages={p.doc_key: list(p.headings) for p in plan.deliver},
    )
