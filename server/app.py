"""The MCP server: tools, resources and prompts over the lookup service. Handlers stay thin."""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp_types import CallToolResult, TextContent, ToolAnnotations
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import AfterValidator, BeforeValidator, Field

from retrieval.embedders import Embedder, EmbedderError
from retrieval.models import DomainInfo, KnowledgeMap, LookupResult, ReadResult, ResetResult
from retrieval.service import (
    LookupOutcome,
    LookupRequest,
    ReadOutcome,
    UnknownDocumentError,
    UnknownDomainError,
)
from retrieval.tracker import Clock
from server import prompts
from server.config_watch import SettingsHolder
from server.data_dir import empty_knowledge_base_message
from server.http_security import peer_host, principal_of
from server.rendering import render_lookup
from server.request_guard import RequestGuard, accept_logging_level, mark_recorded
from server.resources import AppResources, WarmupError
from server.session import SessionIdentity, SessionKeyError, resolve_session
from server.settings import Settings
from storage.vector_store import MilvusVectorStore

logger = logging.getLogger(__name__)

SERVER_NAME = "lookup-knowledge-mcp"
INSTRUCTIONS = (
    "A team knowledge base. Call lookup_knowledge for facts from it; read relevance_level and budget in "
    "every result, and stop looking up when the result says so. knowledge://map lists the domains."
)


def _no_bad_characters(value: str, field: str) -> str:
    for position, char in enumerate(value):
        code = ord(char)
        if 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"{field} contains a lone surrogate (U+{code:04X}) at position {position}")
        if (code < 0x20 and char not in "\t\n\r") or 0x7F <= code < 0xA0:
            raise ValueError(f"{field} contains control character U+{code:04X} at position {position}")
    return value


_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _no_lone_surrogate(field: str):  # type: ignore[no-untyped-def]
    # Runs before pydantic's str check, whose error for a lone surrogate does not say where it is.
    def check(value: Any) -> Any:
        if isinstance(value, str) and (found := _LONE_SURROGATE.search(value)):
            code = ord(found.group())
            raise ValueError(f"{field} contains a lone surrogate (U+{code:04X}) at position {found.start()}")
        return value

    return check


def _query(value: str) -> str:
    if not value.strip():
        raise ValueError("query must not be blank")
    return _no_bad_characters(value, "query")


def _optional_text(field: str):  # type: ignore[no-untyped-def]
    def check(value: str | None) -> str | None:
        return None if value is None else _no_bad_characters(value, field)

    return check


Query = Annotated[
    str,
    Field(min_length=1, max_length=2000, description="What you need to know, 1-2000 characters."),
    AfterValidator(_query),
    BeforeValidator(_no_lone_surrogate("query")),
]
Domain = Annotated[
    str | None,
    Field(default=None, max_length=128, description="Restrict to one domain of knowledge://map."),
    AfterValidator(_optional_text("domain")),
    BeforeValidator(_no_lone_surrogate("domain")),
]
TopK = Annotated[int, Field(ge=1, le=10, strict=True, description="Documents to return at most (1-10).")]
MissingDimension = Annotated[
    str | None,
    Field(
        default=None,
        max_length=500,
        description="The aspect you still lack after earlier results; required for a targeted lookup.",
    ),
    AfterValidator(_optional_text("missing_dimension")),
    BeforeValidator(_no_lone_surrogate("missing_dimension")),
]
DocKey = Annotated[
    str,
    Field(min_length=1, max_length=2048, description="doc_key of a document, as a lookup result gives it."),
    AfterValidator(_optional_text("doc_key")),
    BeforeValidator(_no_lone_surrogate("doc_key")),
]
SectionName = Annotated[
    str | None,
    Field(
        default=None,
        max_length=500,
        description="A section heading (or part of it) from the result's sections; omit for the whole document.",
    ),
    AfterValidator(_optional_text("section")),
    BeforeValidator(_no_lone_surrogate("section")),
]
PromptLanguage = Literal["en", "zh"]


def app(ctx: Context) -> AppResources:
    """The resources the lifespan yielded."""
    resources: AppResources = ctx.request_context.lifespan_context  # type: ignore[assignment]
    return resources


def session_of(ctx: Context) -> SessionIdentity:
    """Resolve the calling session (see server.session for the order)."""
    try:
        return identify(ctx.request_context, app(ctx))
    except SessionKeyError as exc:
        raise ToolError(str(exc)) from exc


def identify(rc: ServerRequestContext[Any, Any], resources: AppResources) -> SessionIdentity:
    """The session of a request, from what its transport carried (raises SessionKeyError)."""
    request = rc.request
    return resolve_session(
        headers=getattr(request, "headers", None),
        meta=rc.meta,
        query_params=getattr(request, "query_params", None),
        # The SDK exposes the per-connection object only privately; it is stable for the
        # life of a handshake-era connection, which is what "connection scope" needs.
        connection=getattr(rc.session, "_connection", None),
        is_http=request is not None,
        stdio_key=resources.stdio_key,
        handshake=rc.protocol_version not in MODERN_PROTOCOL_VERSIONS,
        principal=principal_of(request),
        peer=peer_host(request),
        allow_remote_keys=resources.settings.http.allow_remote_session_keys,
        trust_mcp_session_id=resources.trust_mcp_session_id,
    )


# The longest value of each logged argument: the limits of the tool's own types.
_LOGGED_ARGUMENTS = {"query": 2000, "domain": 128, "missing_dimension": 500}


def _loggable(value: Any, limit: int) -> str | None:
    """A string cut to ``limit`` characters, lone surrogates escaped (SQLite stores UTF-8); else None."""
    if not isinstance(value, str):
        return None
    return value[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


def described(resources: AppResources, knowledge_map: KnowledgeMap) -> KnowledgeMap:
    """The map, saying so when the knowledge base is empty."""
    if knowledge_map.document_count:
        return knowledge_map
    return knowledge_map.model_copy(
        update={"empty": True, "message": empty_knowledge_base_message(resources.settings.data_dir)}
    )


class _Call:
    """What one tool call learned, for its log row."""

    def __init__(self) -> None:
        self.identity = SessionIdentity(None, "none")
        self.outcome: LookupOutcome | None = None
        self.read: ReadOutcome | None = None
        self.error: str | None = None


def create_server(
    settings: Settings,
    *,
    config_path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    embedder: Embedder | None = None,
    store: MilvusVectorStore | None = None,
    stdio_key: str | None = None,
    holder: SettingsHolder | None = None,
    clock: Clock = time.monotonic,
) -> MCPServer[AppResources]:
    """Build the server; tests inject an embedder, store or clock; the CLI passes the config for hot reload."""
    holder = holder or SettingsHolder(settings, config_path, overrides or {})
    resources = AppResources(holder, embedder=embedder, store=store, stdio_key=stdio_key, clock=clock)

    @asynccontextmanager
    async def lifespan(_: MCPServer[AppResources]) -> AsyncIterator[AppResources]:
        await resources.acquire()
        try:
            yield resources
        finally:
            await resources.release()

    mcp: MCPServer[AppResources] = MCPServer(
        SERVER_NAME, instructions=INSTRUCTIONS, lifespan=lifespan, log_level="WARNING"
    )
    mcp.resources_state = resources  # type: ignore[attr-defined]  # for tests and the eval command

    async def audit_unhandled(
        rc: ServerRequestContext[Any, Any], name: Any, arguments: Any, error: str | None, latency_ms: float
    ) -> None:
        # A tools/call that no handler logged (refused, invalid arguments, unknown tool): one row,
        # holding only the logged fields, cut to their limits.
        try:
            identity = identify(rc, resources)
        except SessionKeyError:
            identity = SessionIdentity(None, "none")
        given = arguments if isinstance(arguments, dict) else {}
        await resources.record(
            tool_name=_loggable(name, 128) or "(no tool name)",
            session_key=identity.key,
            session_scope=identity.scope,
            arguments={
                field: _loggable(given.get(field), limit) for field, limit in _LOGGED_ARGUMENTS.items()
            },
            latency_ms=latency_ms,
            error=_loggable(error or "the call was not answered", 2000),
        )

    mcp.middleware.append(RequestGuard(mcp, audit=audit_unhandled))
    accept_logging_level(mcp)

    @mcp.tool(
        annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=False, open_world_hint=False),
    )
    async def lookup_knowledge(
        query: Query,
        ctx: Context,
        domain: Domain = None,
        top_k: TopK = 3,
        missing_dimension: MissingDimension = None,
    ) -> Annotated[CallToolResult, LookupResult]:
        """Look up the team knowledge base (markdown docs; Chinese and English).

        Call it when you need facts from the knowledge base. Each result gives:
        - relevance_level: PRECISE (an exact match; nothing more precise exists, stop), HIGHLY_RELEVANT
          (good enough; further lookups rarely help), REFERENCE (background only; a further lookup must be
          targeted: pass missing_dimension), DEDUPED (you already have these documents; answer), NO_MATCH
          (nothing relevant; do not retry with other words).
        - retrieved_domains_this_session and already_in_context: what you already hold. A document is never
          sent twice to the same session, so rephrasing a lookup in the same domain returns DEDUPED.
        - budget.next_call: ALLOW, TARGETED_ONLY (only with missing_dimension) or STOP (lookup_knowledge is
          closed for this session: answer from what you have).
        Stopping with partial information is acceptable; repeating a lookup is not.
        """
        arguments = {"query": query, "domain": domain, "top_k": top_k, "missing_dimension": missing_dimension}
        async with logged_call(ctx, "lookup_knowledge", arguments) as call:
            service = await resources.lookup_service()
            if not service.engine.view().entries:
                # Not NO_MATCH: "nothing relevant" would send the agent on without the knowledge
                # base, when the fix is an ingest the operator has to run.
                raise ToolError(empty_knowledge_base_message(resources.settings.data_dir))
            request = LookupRequest(query, domain, top_k, missing_dimension)
            call.outcome = await service.lookup(
                request, session_key=call.identity.key, scope=call.identity.scope
            )
        result = call.outcome.result
        return CallToolResult(
            content=[TextContent(type="text", text=render_lookup(result))],
            structured_content=result.model_dump(mode="json"),
        )

    async def read_document(ctx: Context, tool_name: str, doc_key: str, section: str | None) -> ReadResult:
        arguments = {"query": doc_key, "missing_dimension": section}
        async with logged_call(ctx, tool_name, arguments) as call:
            service = await resources.lookup_service()
            call.read = await service.read(
                doc_key,
                section,
                session_key=call.identity.key,
                scope=call.identity.scope,
                limit=resources.settings.retrieval.read_max_chars,
            )
        return call.read.result

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=False, open_world_hint=False))
    async def read_knowledge_doc(doc_key: DocKey, ctx: Context, section: SectionName = None) -> ReadResult:
        """Read more of a document on purpose: the whole document, or one named section.

        Call it only when a lookup_knowledge result has partial: true and the section you need is not in
        it; pass a heading from the result's sections, or omit section for the whole document. What this
        session already holds is left out. The same as reading the resource knowledge://doc/{doc_key}.
        """
        return await read_document(ctx, "read_knowledge_doc", doc_key, section)

    @mcp.resource("knowledge://doc/{+doc_key}{?section}", name="knowledge-doc", mime_type="application/json")
    async def doc_resource(doc_key: str, ctx: Context, section: str | None = None) -> str:
        """A whole document, or one section of it (?section=...), counted in the session's memory."""
        try:
            result = await read_document(ctx, "knowledge://doc", doc_key, section or None)
        except ToolError as exc:
            raise ResourceError(str(exc)) from exc
        return result.model_dump_json(indent=2)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
    async def reset_session(ctx: Context) -> ResetResult:
        """Forget what this session has retrieved and reopen lookup_knowledge.

        Call it when you start a new, unrelated task in the same conversation or process.
        """
        async with logged_call(ctx, "reset_session", {}) as call:
            key = call.identity.key
            forgotten = resources.memory.clear(key) if key else False
        message = (
            "session memory cleared; lookup_knowledge is open again"
            if key
            else "no session could be identified, so there was no memory to clear"
        )
        return ResetResult(session_scope=call.identity.scope, forgotten=forgotten, message=message)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False))
    async def list_knowledge_domains(ctx: Context) -> KnowledgeMap:
        """List the knowledge base's domains: what each covers and when to retrieve from it.

        For planning: route each step that needs knowledge to one domain.
        """
        async with logged_call(ctx, "list_knowledge_domains", {}):
            return described(resources, (await resources.lookup_service()).engine.knowledge_map())

    @asynccontextmanager
    async def logged_call(ctx: Context, tool_name: str, arguments: dict[str, Any]) -> AsyncIterator[_Call]:
        """Resolve the session, turn failures into tool errors, and log the call whatever happens."""
        started = time.perf_counter()
        call = _Call()
        try:
            call.identity = session_of(ctx)
            yield call
        except ToolError as exc:
            call.error = str(exc)
            raise
        except (UnknownDomainError, UnknownDocumentError, WarmupError, EmbedderError) as exc:
            call.error = str(exc)
            raise ToolError(call.error) from exc
        except Exception as exc:
            # A store or model failure mid-request: report it as a tool error and keep serving.
            logger.exception("%s failed", tool_name)
            call.error = f"{tool_name} failed: {type(exc).__name__}: {exc}"
            raise ToolError(call.error) from exc
        finally:
            mark_recorded()
            await resources.record(
                tool_name=tool_name,
                session_key=call.identity.key,
                session_scope=call.identity.scope,
                arguments=arguments,
                outcome=call.outcome,
                read=call.read,
                latency_ms=(time.perf_counter() - started) * 1000,
                error=call.error,
            )

    async def _knowledge_map(resources: AppResources) -> KnowledgeMap:
        try:
            service = await resources.lookup_service()
        except WarmupError as exc:
            raise ResourceError(str(exc)) from exc
        return described(resources, service.engine.knowledge_map())

    @mcp.resource("knowledge://map", name="knowledge-map", mime_type="application/json")
    async def knowledge_map_resource() -> str:
        """Every domain with domain_id, description, covers, document_count and when_to_retrieve."""
        return (await _knowledge_map(resources)).model_dump_json(indent=2)

    @mcp.resource("knowledge://domain/{domain}", name="knowledge-domain", mime_type="application/json")
    async def domain_resource(domain: str) -> str:
        """One domain of the knowledge map."""
        knowledge_map = await _knowledge_map(resources)
        found: DomainInfo | None = next((d for d in knowledge_map.domains if d.domain_id == domain), None)
        if found is None:
            known = ", ".join(d.domain_id for d in knowledge_map.domains)
            raise ResourceError(f"unknown domain {domain!r}; known domains: {known}")
        return found.model_dump_json(indent=2)

    @mcp.resource("knowledge://stats", name="knowledge-stats", mime_type="application/json")
    async def stats_resource() -> str:
        """The invocation-log summary (calls, tiers, dedup reasons, redundant-call rate, latency)."""
        from server.stats_command import stats_summary

        return json.dumps(await stats_summary(resources), ensure_ascii=False, indent=2)

    @mcp.prompt()
    def executor_retrieval_rules(language: PromptLanguage = "en") -> str:
        """The four retrieval rules for an executor agent that calls lookup_knowledge."""
        return prompts.executor_rules(language)

    @mcp.prompt()
    async def planner_with_knowledge_map(language: PromptLanguage = "en") -> str:
        """A planner system prompt with the knowledge map injected."""
        return prompts.planner_prompt(await _knowledge_map(resources), language)

    return mcp
