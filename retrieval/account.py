"""The account step of a lookup: count the call in its session and decide the next one.

What the plan delivers is recorded in the session's action memory, with its tokens; governance
decides the next call from the tier and the water level the session reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

from retrieval.action_memory import ActionMemory, Delivery
from retrieval.engine import KnowledgeView
from retrieval.governance import Decision, Usage, decide, water_level
from retrieval.models import DocumentContent, NextCall, Tier, WaterLevel
from retrieval.passages import Passage
from retrieval.plan import Plan
from retrieval.requests import LookupCall
from storage.text import CJK


def estimate_tokens(text: str) -> int:
    """Rough LLM token count: one per CJK character, one per four other characters."""
    cjk = len(CJK.findall(text))
    return cjk + (len(text) - cjk + 3) // 4


@dataclass(frozen=True)
class Account:
    """One call as its session counts it: the plan, what it delivers, and what governance decided."""

    plan: Plan
    documents: list[DocumentContent]  # what the plan delivers, the primary first
    tokens: int
    usage: Usage
    decision: Decision | None
    next_call: NextCall | None
    level: WaterLevel | None  # None when the call is not governed
    domains: list[str]  # the session's retrieved domains after the call
    retrieved: bool  # False when a closed session refused the call without retrieval


def account_call(
    call: LookupCall, plan: Plan, documents: list[DocumentContent], memory: ActionMemory, *, retrieved: bool
) -> Account:
    """Decide the next call from the tier and the water level, and record the call in the session."""
    tokens = sum(estimate_tokens(d.content) for d in documents)
    snapshot, session_key = call.snapshot, call.session_key
    if snapshot is None or session_key is None:
        # No session: nothing is recorded, and the call is the whole of its usage.
        domains = sorted({d.domain for d in documents})
        usage = Usage(1, tokens, len(domains))
        return Account(plan, documents, tokens, usage, None, None, None, domains, retrieved)
    config = call.policy.governance
    held = {d.domain for d in snapshot.documents.values()} | {d.domain for d in documents}
    usage = Usage(snapshot.calls + 1, snapshot.tokens + tokens, len(held))
    closed = plan.dedup_reason == "circuit_open"
    # A closed session stays closed: the call is counted and no new decision is made.
    decision = decide(config, _deciding_tier(plan), usage) if config.enabled and not closed else None
    next_call = decision.next_call if decision else (NextCall.STOP if closed else None)
    after = memory.record_call(
        session_key,
        delivered=[delivery(call.view, p) for p in plan.deliver],
        ran_retrieval=retrieved,
        tokens=tokens,
        next_call=next_call.value if next_call else None,
        closes=decision is not None
        and next_call is NextCall.STOP
        and decision.water_level is WaterLevel.HIGH,
        answered=plan.answered if config.enabled else (),
    )
    level = water_level(config, usage) if call.governed else None
    return Account(
        plan, documents, tokens, usage, decision, next_call, level, list(after.retrieved_domains), retrieved
    )


def _deciding_tier(plan: Plan) -> Tier:
    # A domain_retrieved refusal leaves the targeted channel open, like a REFERENCE result.
    return Tier.REFERENCE if plan.dedup_reason == "domain_retrieved" else plan.tier


def delivery(view: KnowledgeView, passage: Passage) -> Delivery:
    """What the session's memory records of one passage sent."""
    entry = view.entries[passage.doc_key]
    return Delivery(passage.doc_key, entry.domain, entry.title, passage.chunk_ids, passage.headings)
