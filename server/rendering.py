"""Compact, readable text for clients that show only a tool's text content."""

from __future__ import annotations

from retrieval.models import DocumentContent, KnowledgeMap, LookupResult

# A result with no new content costs the agent context all the same: keep its text this short.
TERSE_LIMIT = 200


def _doc(label: str, doc: DocumentContent) -> list[str]:
    more = (
        f" — {len(doc.sections)} of {doc.section_count} passages; more: read_knowledge_doc"
        if doc.partial
        else ""
    )
    return [f"## {label}: {doc.title}  [{doc.domain}] ({doc.doc_key}){more}", doc.content.strip(), ""]


# What a result without content tells the agent, in as few words as will do.
_TERSE_ADVICE = {
    "doc_retrieved": "you already hold this; answer from it.",
    "domain_retrieved": "this domain is already yours; answer, or pass missing_dimension.",
    "missing_dimension_required": "you hold this topic; answer, or pass missing_dimension for more.",
    "circuit_open": "lookups are closed for this session; retrieval skipped. Answer now.",
}


def render_terse(result: LookupResult) -> str:
    """A result without content (DEDUPED, refused, NO_MATCH): what the agent holds and what to do, briefly."""
    if result.relevance_level == "NO_MATCH":
        text = f"NO_MATCH: {result.completeness_hint}"
    else:
        advice = _TERSE_ADVICE.get(result.dedup_reason or "", result.budget.guidance)
        text = f"{result.relevance_level}: {advice}"
        held = "; ".join(
            d.title + (f" §{d.sections[-1]}" if d.sections else "") for d in result.already_in_context
        )
        if held:
            text += f" Held: {held}"
    return text if len(text) <= TERSE_LIMIT else text[: TERSE_LIMIT - 1] + "…"


def render_lookup(result: LookupResult) -> str:
    """The same result as the structured content, as markdown-ish text."""
    if not result.found:
        return render_terse(result)
    lines = [
        f"relevance: {result.relevance_level}" + (f" ({result.dedup_reason})" if result.dedup_reason else "")
    ]
    lines.append(f"completeness: {result.completeness_hint}")
    budget = result.budget
    if budget.next_call:
        lines.append(
            f"budget: {budget.calls_used} calls, water level {budget.water_level}, next: {budget.next_call}"
        )
    lines.append(f"guidance: {budget.guidance}")
    domains = ", ".join(result.retrieved_domains_this_session) or "none"
    lines.append(f"retrieved domains this session: {domains} (session scope: {result.session_scope})")
    if result.already_in_context:
        listed = "; ".join(f"{d.title} ({d.doc_key})" for d in result.already_in_context)
        lines.append(f"already in your context: {listed}")
    lines.append("")
    if result.primary:
        lines += _doc("primary", result.primary)
    for doc in result.supplement:
        lines += _doc("supplement", doc)
    return "\n".join(lines).rstrip() + "\n"


def render_map(knowledge_map: KnowledgeMap) -> str:
    lines = [f"{knowledge_map.document_count} documents in {len(knowledge_map.domains)} domains", ""]
    for domain in knowledge_map.domains:
        lines.append(f"- {domain.domain_id} ({domain.document_count} docs): {domain.description}")
        lines.append(f"  when to retrieve: {domain.when_to_retrieve}")
        lines.append(f"  covers: {', '.join(domain.covers[:12])}")
    return "\n".join(lines) + "\n"
