"""The MCP resources (knowledge:// URIs). Each makes one handler call."""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import Context, MCPServer

from server.protocol.handlers import KnowledgeHandlers

_JSON = "application/json"


def register_resources(mcp: MCPServer[Any], handlers: KnowledgeHandlers) -> None:
    @mcp.resource("knowledge://doc/{+doc_key}{?section}", name="knowledge-doc", mime_type=_JSON)
    async def doc_resource(doc_key: str, ctx: Context, section: str | None = None) -> str:
        """A whole document, or one section of it (?section=...), counted in the session's memory."""
        return await handlers.read_resource(ctx.request_context, doc_key, section)

    @mcp.resource("knowledge://map", name="knowledge-map", mime_type=_JSON)
    async def knowledge_map_resource() -> str:
        """Every domain with domain_id, description, covers, document_count and when_to_retrieve."""
        return (await handlers.knowledge_map()).model_dump_json(indent=2)

    @mcp.resource("knowledge://domain/{domain}", name="knowledge-domain", mime_type=_JSON)
    async def domain_resource(domain: str) -> str:
        """One domain of the knowledge map."""
        return (await handlers.domain(domain)).model_dump_json(indent=2)

    @mcp.resource("knowledge://stats", name="knowledge-stats", mime_type=_JSON)
    async def stats_resource() -> str:
        """The invocation-log summary (calls, tiers, dedup reasons, redundant-call rate, latency)."""
        return await handlers.stats()
