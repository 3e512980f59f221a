"""The plan step of a lookup: what the call delivers, given what the session already holds.

Action memory and governance applied to the graded candidates: a held topic is not served again,
a new topic always is; the passages to send (``retrieval.passages``) and the held documents the
result names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from retrieval.action_memory import HeldView, MemorySnapshot
from retrieval.engine import KnowledgeView
from retrieval.grade import Graded
from retrieval.models import DedupReason, DocumentContent, Tier
from retrieval.passages import Passage, best_passage, whole_document
from retrieval.ranking import RankedDoc
from storage.catalog_records import CatalogEntry, ChunkRecord

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
