"""The pure steps of one lookup: grade the evidence, plan what to deliver, render the result.

- grade: rank the documents, compute the features, decide the tier (``Graded``);
- plan: apply action memory and governance to the graded candidates (``Plan``);
- render: the ``LookupResult`` the agent reads.

The service (``retrieval.service``) runs them in order and accounts the call in between.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from retrieval.engine import Evidence, KnowledgeView
from retrieval.governance import Decision, GovernanceConfig, GuidanceKey, Usage, guidance_text
from retrieval.models import (
    AlreadyInContext,
    Budget,
    DedupReason,
    DocumentContent,
    LookupResult,
    NextCall,
    SessionScope,
    Tier,
    WaterLevel,
)
from retrieval.passages import Passage, best_passage, whole_document
from retrieval.precise import at_most_reference, precise_doc
from retrieval.ranking import RankedDoc, features, rank
from retrieval.relevance import TierModel, completeness_hint, grade
from retrieval.tracker import HeldView, MemorySnapshot
from storage.catalog import CatalogEntry, ChunkRecord
from storage.text import Language

if TYPE_CHECKING:
    from retrieval.requests import LookupRequest, Policy

# An uncertain answer shows its alternatives: every top_k document within this of the first
# (fused scores lie within it). A HIGHLY_RELEVANT one takes the model's fitted supplement_margin.
_REFERENCE_MARGIN = 1.0
# Another section of a held document is new content only when the held sections match the
# question less than this share of how well the new one does. Above it, the question is a
# rephrasing of the topic the session holds (on the shipped traces, rephrasings scored the held
# section at 0.69-0.97 of the new one; a question about another part of a handbook at 0.22).
_HELD_SHARE = 0.5


@dataclass(frozen=True)
class Graded:
    """The ranked candidates of one query and their tier, before memory and governance."""

    tier: Tier
    ranked: tuple[RankedDoc, ...]
    precise: str | None
    features: dict[str, float]
    codes: dict[str, tuple[str, ...]]  # doc_key -> the codes the query named in it
    l0_docs: tuple[str, ...]
    l0_titles: list[str]
    cosines: tuple[float, ...]


def grade_evidence(evidence: Evidence, view: KnowledgeView, model: TierModel) -> Graded:
    """Rank, compute features and grade; NO_MATCH keeps no candidates."""
    ranked = [
        d
        for d in rank(
            evidence,
            model.cross_language_offset,
            model.lexical_weight,
            model.sparse_weight,
            model.rerank_weight,
        )
        if d.doc_key in view.entries
    ]
    feats = features(evidence, ranked)
    precise = precise_doc(evidence, ranked, feats, model, view.entries)
    # Nothing ranked is NO_MATCH whatever the model says of all-zero features (a zero background
    # score reads as far from the background, which the on-topic model counts for the question).
    tier = grade(feats, model, precise=precise is not None) if ranked else Tier.NO_MATCH
    tier = at_most_reference(tier, evidence)
    if precise is not None:
        ranked.sort(key=lambda d: d.doc_key != precise)
    codes: dict[str, list[str]] = {}
    for hit in evidence.l0:
        if hit.kind == "code":
            codes.setdefault(hit.doc_key, []).append(hit.term)
    l0_docs = tuple(sorted({h.doc_key for h in evidence.l0 if h.doc_key in view.entries}))
    return Graded(
        tier=tier,
        ranked=tuple(ranked),
        precise=precise,
        features=feats,
        codes={k: tuple(v) for k, v in codes.items()},
        l0_docs=l0_docs,
        l0_titles=[view.entries[k].title for k in l0_docs],
        cosines=tuple(h.cosine for h in evidence.dense),
    )


@dataclass(frozen=True)
class Plan:
    """What one call delivers, which held documents it names, and why it may deliver nothing."""

    tier: Tier
    deliver: tuple[Passage, ...]
    already: tuple[str, ...]
    dedup_reason: DedupReason | None = None
    same_domain: bool = False
    answered: tuple[str, ...] = ()  # held documents a refused repeat shows to be answered
    # The held document and section that best match a targeted lookup refused as DEDUPED.
    held_match: tuple[str, str] | None = None

    @property
    def deciding_tier(self) -> Tier:
        # A domain_retrieved refusal leaves the targeted channel open, like a REFERENCE result.
        return Tier.REFERENCE if self.dedup_reason == "domain_retrieved" else self.tier

    @classmethod
    def closed(cls, graded: Graded | None, snapshot: MemorySnapshot, top_k: int, view: KnowledgeView) -> Plan:
        candidates = graded.ranked[:top_k] if graded is not None else ()
        already = _already_held(candidates, _holders(candidates, snapshot.documents, view))
        return cls(Tier.DEDUPED, (), already, "circuit_open")

    def documents(self, view: KnowledgeView, policy: Policy) -> list[DocumentContent]:
        return [
            document_content(
                passage,
                view.entries[passage.doc_key],
                policy.primary_max_chars if position == 0 else policy.supplement_max_chars,
            )
            for position, passage in enumerate(self.deliver)
        ]


def document_content(passage: Passage, entry: CatalogEntry, limit: int) -> DocumentContent:
    """What a result carries of one passage: its text cut at ``limit``, partial if more exists."""
    content, cut = passage.shown(entry.title, limit)
    return DocumentContent(
        doc_key=passage.doc_key,
        title=entry.title,
        domain=entry.domain,
        content=content,
        sections=list(passage.headings),
        section_count=passage.total,
        partial=passage.partial or cut,
    )


def plan_answer(
    graded: Graded,
    request: LookupRequest,
    snapshot: MemorySnapshot | None,
    view: KnowledgeView,
    chunks_of: Callable[[str], list[ChunkRecord]],
    policy: Policy,
    *,
    governed: bool,
) -> Plan:
    """Apply action memory and governance: a held topic is not served again, a new topic always is."""
    if graded.tier is Tier.NO_MATCH or not graded.ranked:  # NO_MATCH keeps its ranking for the log only
        return Plan(Tier.NO_MATCH, (), ())
    candidates = graded.ranked[: request.top_k]
    top = candidates[0]
    documents = snapshot.documents if snapshot else {}
    holders = _holders(candidates, documents, view)
    held = _held_with_copies(holders, documents, chunks_of)
    held_domains = set(snapshot.retrieved_domains) if snapshot else set()
    already = _already_held(candidates, holders)
    tier = graded.tier

    def passage_of(doc: RankedDoc) -> Passage | None:
        return _passage(doc, graded, request, held, view, chunks_of, policy, policy.primary_max_chars)

    primary = passage_of(top)
    if request.targeted and primary is not None:
        match = _held_match(top, held, primary, chunks_of)
        if match is not None:
            # The dimension's best match is a passage the session holds: the next passage of the
            # document is about something else. Name the held one rather than send another.
            return Plan(Tier.DEDUPED, (), already, "doc_retrieved", held_match=match)
    next_unheld = _first_unheld(candidates[1:], passage_of) if primary is None and request.targeted else None
    if next_unheld is not None:
        # The session holds all of the best match: the missing dimension may be in the next one.
        # The tier graded the held document, so the next one is only offered as a reference.
        (top, primary), tier = next_unheld, Tier.REFERENCE
    domain = view.entries[top.doc_key].domain
    rephrased = not request.targeted and _held_answers(top, held, primary)
    if primary is None or rephrased:
        # The best match is content the session holds: a repeat or a rephrasing. Its topic is
        # answered: from now on, another section of the document needs a targeted lookup.
        answered = holders.get(top.doc_key, (top.doc_key,))
        return Plan(Tier.DEDUPED, (), already, "doc_retrieved", answered=answered)
    hard = governed and policy.governance.domain_policy == "hard"
    if hard and domain in held_domains and not request.targeted:
        # Scheme B: with a hard domain policy the topic is the domain.
        return Plan(Tier.DEDUPED, (), already, "domain_retrieved", same_domain=True)
    holding = held.get(top.doc_key)
    if governed and holding is not None and holding.closed and not request.targeted:
        # Another section of a document whose topic a repeat showed to be answered.
        return Plan(Tier.DEDUPED, (), already, "missing_dimension_required")
    deliver = [primary]
    if top.doc_key not in held and not request.targeted:
        # A targeted lookup asks for one missing dimension: one document or passage, no supplements.
        deliver += _supplements(graded, candidates, held, view, chunks_of, request, policy)
    same_domain = domain in held_domains
    return Plan(tier, tuple(deliver), already, None, same_domain=same_domain)


def _holders(
    candidates: Sequence[RankedDoc], documents: Mapping[str, HeldView], view: KnowledgeView
) -> dict[str, tuple[str, ...]]:
    """For each candidate, the held documents with its bytes: itself, and any copy of it.

    A copy in a second folder (or a symlink) is the same text under another path: a domain filter
    naming only the copy's folder must not send the text again.
    """
    by_hash: dict[str, list[str]] = {}
    for key in documents:
        if key in view.entries:
            by_hash.setdefault(view.entries[key].content_hash, []).append(key)
    holders = {}
    for doc in candidates:
        keys = by_hash.get(view.entries[doc.doc_key].content_hash, [])
        if keys:
            holders[doc.doc_key] = tuple(sorted(keys, key=lambda k: k != doc.doc_key))
    return holders


def _held_with_copies(
    holders: Mapping[str, tuple[str, ...]],
    documents: Mapping[str, HeldView],
    chunks_of: Callable[[str], list[ChunkRecord]],
) -> dict[str, HeldView]:
    """What the session holds, where a candidate also holds the parts its copies were sent in.

    Copies have the same chunking, so a part is the same chunk index in each.
    """
    held = dict(documents)
    for key, keys in holders.items():
        if keys == (key,):
            continue
        parts = {c.index for k in keys for c in chunks_of(k) if c.chunk_id in documents[k].chunks}
        first = documents[keys[0]]
        held[key] = replace(
            first,
            chunks=frozenset(c.chunk_id for c in chunks_of(key) if c.index in parts),
            closed=any(documents[k].closed for k in keys),
        )
    return held


def _first_unheld(
    candidates: Sequence[RankedDoc], passage_of: Callable[[RankedDoc], Passage | None]
) -> tuple[RankedDoc, Passage] | None:
    """The best-ranked candidate with a passage the session lacks, and that passage."""
    for doc in candidates:
        passage = passage_of(doc)
        if passage is not None:
            return doc, passage
    return None


def _held_answers(doc: RankedDoc, held: Mapping[str, HeldView], passage: Passage | None) -> bool:
    """Whether a passage the session holds matches the query about as well as the new one.

    Then the question is a rephrasing of a topic the session has, not a question about another
    section: another section is new content only when it clearly matches better.
    """
    holding = held.get(doc.doc_key)
    if holding is None or passage is None:
        return False
    scores = {c.chunk_id: c.fused for c in doc.chunks}
    held_best = max((scores[c] for c in holding.chunks if c in scores), default=None)
    new_best = max((scores.get(c, float("-inf")) for c in passage.chunk_ids), default=float("-inf"))
    return held_best is not None and held_best >= _HELD_SHARE * new_best


def _held_match(
    doc: RankedDoc,
    held: Mapping[str, HeldView],
    passage: Passage,
    chunks_of: Callable[[str], list[ChunkRecord]],
) -> tuple[str, str] | None:
    """The held document and section matching a targeted lookup at least as well as ``passage``.

    A new passage is sent only when it matches the missing dimension better than anything held.
    """
    holding = held.get(doc.doc_key)
    if holding is None:
        return None
    new_ids = set(passage.chunk_ids)
    held_scores = [c for c in doc.chunks if c.chunk_id in holding.chunks]
    new_best = max((c.fused for c in doc.chunks if c.chunk_id in new_ids), default=float("-inf"))
    best = max(held_scores, key=lambda c: c.fused, default=None)
    if best is None or best.fused < new_best:
        return None
    heading = next((c.heading for c in chunks_of(doc.doc_key) if c.chunk_id == best.chunk_id), "")
    return doc.doc_key, heading


def _passage(
    doc: RankedDoc,
    graded: Graded,
    request: LookupRequest,
    held: Mapping[str, HeldView],
    view: KnowledgeView,
    chunks_of: Callable[[str], list[ChunkRecord]],
    policy: Policy,
    limit: int,
) -> Passage | None:
    holding = held.get(doc.doc_key)
    skip = holding.chunks if holding is not None else frozenset()
    chunks = chunks_of(doc.doc_key)
    if policy.content == "document":
        passage = whole_document(doc.doc_key, chunks, skip=skip)
        return passage if passage.chunks and not (skip and not request.targeted) else None
    return best_passage(
        doc,
        chunks,
        title=view.entries[doc.doc_key].title,
        limit=limit,
        codes=graded.codes.get(doc.doc_key, ()),
        skip=skip,
        next_best=request.targeted,
    )


def _supplements(
    graded: Graded,
    candidates: Sequence[RankedDoc],
    held: Mapping[str, HeldView],
    view: KnowledgeView,
    chunks_of: Callable[[str], list[ChunkRecord]],
    request: LookupRequest,
    policy: Policy,
) -> list[Passage]:
    margin = _supplement_margin(graded.tier, policy)
    if margin is None:
        return []  # PRECISE: nothing more precise exists, the one document is the answer
    floor = candidates[0].score - margin
    # The same file under another path (a symlink, a copy in a second folder) ranks right next to
    # the original: one copy of the text is what the session needs.
    sent = {view.entries[key].content_hash for key in (candidates[0].doc_key, *held) if key in view.entries}
    out = []
    for doc in candidates[1:]:
        digest = view.entries[doc.doc_key].content_hash
        if doc.doc_key in held or doc.score < floor or digest in sent:
            continue
        passage = _passage(doc, graded, request, held, view, chunks_of, policy, policy.supplement_max_chars)
        if passage is not None:
            out.append(passage)
            sent.add(digest)
    return out


def _supplement_margin(tier: Tier, policy: Policy) -> float | None:
    if policy.supplements == "top_k" or tier is Tier.REFERENCE:
        return _REFERENCE_MARGIN
    if tier is Tier.HIGHLY_RELEVANT:
        return policy.tier_model.supplement_margin
    return None


def _already_held(candidates: Sequence[RankedDoc], holders: Mapping[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The held documents the candidates name (a copy names its held twin), best-ranked first."""
    return tuple(dict.fromkeys(key for doc in candidates for key in holders.get(doc.doc_key, ())))


def render_result(
    plan: Plan,
    documents: list[DocumentContent],
    view: KnowledgeView,
    snapshot: MemorySnapshot | None,
    *,
    scope: SessionScope,
    language: Language,
    config: GovernanceConfig,
    usage: Usage,
    decision: Decision | None,
    next_call: NextCall | None,
    level: WaterLevel | None,
    domains: list[str],
    memory: bool,
    governed: bool,
) -> LookupResult:
    """The result the agent reads."""
    already = [_already(view, snapshot, key) for key in plan.already if snapshot is not None]
    budget = _budget(
        plan, config, usage, decision, next_call, level, language, memory=memory, governed=governed
    )
    return LookupResult(
        found=bool(documents),
        relevance_level=plan.tier,
        completeness_hint=completeness_hint(plan.tier, language),
        primary=documents[0] if documents else None,
        supplement=documents[1:],
        retrieved_domains_this_session=domains,
        dedup_reason=plan.dedup_reason,
        already_in_context=already,
        session_scope=scope,
        message=_message(plan, documents, already, budget, view, memory_off=not memory),
        budget=budget,
    )


def _already(view: KnowledgeView, snapshot: MemorySnapshot | None, key: str) -> AlreadyInContext:
    held = snapshot.documents[key] if snapshot else None
    title = view.entries[key].title if key in view.entries else (held.title if held else key)
    return AlreadyInContext(doc_key=key, title=title, sections=list(held.headings) if held else [])


def _budget(
    plan: Plan,
    config: GovernanceConfig,
    usage: Usage,
    decision: Decision | None,
    next_call: NextCall | None,
    level: WaterLevel | None,
    language: Language,
    *,
    memory: bool,
    governed: bool,
) -> Budget:
    if not governed:
        text = (
            "governance is off: lookups are not limited"
            if memory
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
        water_level=level,
        next_call=next_call,
        guidance=guidance_text(config, key, language, usage),
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
