"""The lookup service: runs one lookup's steps in order, one session at a time.

evidence (``retrieval.engine``) -> grade (``retrieval.grade``) -> plan (``retrieval.plan``) ->
account (``retrieval.account``) -> render (``retrieval.render``): the service calls each step in
turn and passes its value to the next; no step calls back into the service or an earlier step.

Plain Python (no MCP): the MCP tool, the CLI and the replay evaluation all call ``lookup``.
The lookups of one session run one after another (a per-session lock), so parallel calls see
the same memory, dedup and budget as if they had been made in sequence; other sessions stay
concurrent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from retrieval.account import account_call, delivery, estimate_tokens
from retrieval.action_memory import ActionMemory, MemorySnapshot
from retrieval.engine import Evidence, KnowledgeEngine, KnowledgeView
from retrieval.grade import GradeCache, Graded
from retrieval.models import AlreadyInContext, LookupResult, ReadResult, RetrievalDetails, SessionScope
from retrieval.passages import Passage, section, whole_document
from retrieval.plan import Plan, document_content, plan_answer
from retrieval.render import render_result, retrieval_details
from retrieval.requests import LookupCall, LookupRequest, Policy


class UnknownDomainError(ValueError):
    """The domain argument names no domain of the knowledge base."""


class UnknownDocumentError(ValueError):
    """The doc_key or section names nothing in the knowledge base."""


class EmptyKnowledgeBaseError(RuntimeError):
    """A lookup on a knowledge base nothing was ingested into; the message names the fix.

    Not NO_MATCH: "nothing relevant" would send the agent on without the knowledge base, or read
    as such when the data directory is mistyped, when the fix is an ingest someone has to run.
    """


@dataclass
class LookupOutcome:
    """The result for the caller and the details for the invocation log."""

    result: LookupResult
    details: RetrievalDetails
    result_doc_keys: list[str]
    call_index: int
    latency_ms: float = 0.0


class LookupService:
    """Runs one lookup_knowledge call for one session."""

    def __init__(
        self,
        engine: KnowledgeEngine,
        memory: ActionMemory,
        policy: Callable[[], Policy],
        *,
        empty_message: str,
        on_view: Callable[[int], None] | None = None,
    ) -> None:
        """``empty_message`` is what a lookup on an empty knowledge base raises; ``on_view`` is
        called with the generation of each view a lookup runs on (the server settles its heap)."""
        self.engine = engine
        self.memory = memory
        self._policy = policy
        self._empty_message = empty_message
        self._on_view = on_view
        self._grades = GradeCache()

    async def view(self) -> KnowledgeView:
        """The current snapshot; a reload after an ingest runs off the event loop."""
        current = self.engine.current_view()
        return current if current is not None else await asyncio.to_thread(self.engine.view)

    async def lookup(
        self, request: LookupRequest, *, session_key: str | None, scope: SessionScope
    ) -> LookupOutcome:
        """Answer one call; session_key None means memory is off (no session could be identified).

        One call reads the catalog's generation once, and answers from the view it checked.
        """
        started = time.perf_counter()
        view = await self.view()
        if not view.entries:
            raise EmptyKnowledgeBaseError(self._empty_message)
        if self._on_view is not None:
            self._on_view(view.generation)
        if session_key is None:
            outcome = await self._lookup(request, None, scope, view)
        else:
            async with self.memory.session_lock(session_key):
                outcome = await self._lookup(request, session_key, scope, view)
        outcome.latency_ms = (time.perf_counter() - started) * 1000
        return outcome

    async def _lookup(
        self, request: LookupRequest, session_key: str | None, scope: SessionScope, view: KnowledgeView
    ) -> LookupOutcome:
        """The steps in order: evidence, grade, plan, account, render."""
        policy = self._policy()
        if request.domain is not None and request.domain not in view.domains:
            known = ", ".join(view.domains) or "(none: the knowledge base is empty)"
            raise UnknownDomainError(f"unknown domain {request.domain!r}; known domains: {known}")
        snapshot = self.memory.snapshot(session_key) if session_key else None
        call = LookupCall(request, policy, view, scope, session_key, snapshot)
        closed = snapshot is not None and call.governed and snapshot.closed
        graded, plan = (
            self._refused(call, snapshot) if snapshot is not None and closed else await self._planned(call)
        )
        account = account_call(call, plan, plan.documents(view, policy), self.memory, retrieved=not closed)
        result = render_result(call, account)
        details = retrieval_details(call, graded, account, result, self.engine.embedder_name)
        return LookupOutcome(result, details, [d.doc_key for d in account.documents], account.usage.calls)

    def _refused(self, call: LookupCall, snapshot: MemorySnapshot) -> tuple[Graded | None, Plan]:
        """HIGH water closed the session: no retrieval; name what it holds if the query is known."""
        request, view = call.request, call.view
        evidence = self.engine.cached_evidence(request.search_text, request.domain, view)
        graded = self._grades.grade(evidence, view, call.policy.tier_model) if evidence else None
        return graded, Plan.closed(graded, snapshot, request.top_k, view)

    async def _planned(self, call: LookupCall) -> tuple[Graded, Plan]:
        """Retrieve, grade and plan; a targeted lookup makes two searches (its dimension, and its topic)."""
        request, view, policy = call.request, call.view, call.policy
        evidence = await self._evidence(request.search_text, request, view)
        topic = (
            None if request.topic_text is None else await self._evidence(request.topic_text, request, view)
        )
        graded = self._grades.grade_lookup(evidence, topic, view, policy.tier_model)
        plan = plan_answer(
            graded, request, call.snapshot, view, self.engine.chunks_of, policy, governed=call.governed
        )
        return graded, plan

    async def _evidence(self, text: str, request: LookupRequest, view: KnowledgeView) -> Evidence:
        """An identical earlier query's evidence, else a retrieval off the event loop."""
        cached = self.engine.cached_evidence(text, request.domain, view)
        if cached is not None:
            return cached
        return await asyncio.to_thread(self.engine.retrieve, text, request.domain, view)

    async def read(
        self,
        doc_key: str,
        section_name: str | None,
        *,
        session_key: str | None,
        scope: SessionScope,
        limit: int,
    ) -> ReadOutcome:
        """A whole document or one named section, on purpose; what the session holds is not sent again."""
        view = await self.view()
        entry = view.entries.get(doc_key)
        if entry is None:
            raise UnknownDocumentError(f"unknown document {doc_key!r}; knowledge://map lists the domains")
        chunks = await asyncio.to_thread(self.engine.chunks_of, doc_key)
        outside: set[str] = set()
        if section_name is not None:
            found = section(doc_key, chunks, section_name)
            if found is None:
                names = ", ".join(dict.fromkeys(c.heading for c in chunks if c.heading))
                raise UnknownDocumentError(f"{doc_key!r} has no section {section_name!r}; sections: {names}")
            outside = {c.chunk_id for c in chunks} - set(found.chunk_ids)
        if session_key is None:
            return _read_outcome(view, whole_document(doc_key, chunks, skip=outside), None, scope, limit)
        async with self.memory.session_lock(session_key):
            snapshot = self.memory.snapshot(session_key)
            held = snapshot.documents.get(doc_key)
            passage = whole_document(doc_key, chunks, skip=outside | (held.chunks if held else set()))
            outcome = _read_outcome(view, passage, snapshot, scope, limit)
            if outcome.result.document is not None:
                delivered = delivery(view, passage)
                tokens = estimate_tokens(outcome.result.document.content)
                after = self.memory.record_call(
                    session_key,
                    delivered=[delivered],
                    ran_retrieval=False,
                    tokens=tokens,
                    next_call=snapshot.next_call,
                )
                outcome.call_index = after.calls
        return outcome


@dataclass
class ReadOutcome:
    result: ReadResult
    result_doc_keys: list[str]
    call_index: int | None = None


def _read_outcome(
    view: KnowledgeView, passage: Passage, snapshot: MemorySnapshot | None, scope: SessionScope, limit: int
) -> ReadOutcome:
    entry = view.entries[passage.doc_key]
    held = snapshot.documents.get(passage.doc_key) if snapshot else None
    already = (
        [AlreadyInContext(doc_key=passage.doc_key, title=entry.title, sections=list(held.headings))]
        if held
        else []
    )
    if not passage.chunks:
        message = "You already hold all of it: answer from what you have (reset_session forgets it)."
        return ReadOutcome(
            ReadResult(document=None, already_in_context=already, session_scope=scope, message=message), []
        )
    document = document_content(passage, entry, limit)
    message = f"{len(passage.chunks)} of {passage.total} passage(s)" + (
        "; held passages are left out" if held else ""
    )
    return ReadOutcome(
        ReadResult(document=document, already_in_context=already, session_scope=scope, message=message),
        [passage.doc_key],
    )
