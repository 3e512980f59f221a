"""The MCP tools: their names, argument types, annotations and descriptions. Each makes one handler call."""

from __future__ import annotations

from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, ToolAnnotations

from retrieval.models import KnowledgeMap, LookupResult, ReadResult, ResetResult
from retrieval.requests import LookupRequest
from server.inputs import DocKey, Domain, MissingDimension, Query, SectionName, TopK
from server.protocol.handlers import KnowledgeHandlers
from server.protocol.output_schema import published
from server.protocol.sdk import registered_tools

_READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=False, open_world_hint=False)


def register_tools(mcp: MCPServer[Any], handlers: KnowledgeHandlers) -> None:
    @mcp.tool(annotations=_READ_ONLY)
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
        request = LookupRequest(query, domain, top_k, missing_dimension)
        return await handlers.lookup(ctx.request_context, request)

    @mcp.tool(annotations=_READ_ONLY)
    async def read_knowledge_doc(doc_key: DocKey, ctx: Context, section: SectionName = None) -> ReadResult:
        """Read more of a document on purpose: the whole document, or one named section.

        Call it only when a lookup_knowledge result has partial: true and the section you need is not in
        it; pass a heading from the result's sections, or omit section for the whole document. What this
        session already holds is left out. The same as reading the resource knowledge://doc/{doc_key}.
        """
        return await handlers.read(ctx.request_context, "read_knowledge_doc", doc_key, section)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True))
    async def reset_session(ctx: Context) -> ResetResult:
        """Forget what this session has retrieved and reopen lookup_knowledge.

        Call it when you start a new, unrelated task in the same conversation or process.
        """
        return await handlers.reset(ctx.request_context)

    @mcp.tool(annotations=ToolAnnotations(read_only_hint=True, idempotent_hint=True, open_world_hint=False))
    async def list_knowledge_domains(ctx: Context) -> KnowledgeMap:
        """List the knowledge base's domains: what each covers and when to retrieve from it.

        For planning: route each step that needs knowledge to one domain.
        """
        return await handlers.list_domains(ctx.request_context)

    for tool in registered_tools(mcp):
        if tool.fn_metadata.output_schema is not None:
            tool.fn_metadata.output_schema = published(tool.fn_metadata.output_schema)
