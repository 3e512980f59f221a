"""Refuse malformed requests before they reach a handler: unknown tool arguments, oversized ``_meta``.

The SDK builds each tool's argument model with extra fields allowed, so a misspelt argument
(``topk`` for ``top_k``) would be silently dropped and the call would run with the default.
This middleware turns it into an ``isError`` result that names the argument, like any other
argument validation failure, so the caller can correct itself.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, EmptyResult, SetLevelRequestParams, TextContent
from mcp_types.jsonrpc import INVALID_PARAMS

logger = logging.getLogger(__name__)

# A session id and a few protocol keys fit in well under 1 KiB; 16 KiB leaves room for clients
# that carry tracing context, and keeps one request from inflating the log and the memory.
MAX_META_BYTES = 16 * 1024


class RequestGuard:
    """Server middleware: ``_meta`` size limit on every request, unknown-argument check on tools/call."""

    def __init__(self, server: MCPServer[Any], *, max_meta_bytes: int = MAX_META_BYTES) -> None:
        self._server = server
        self.max_meta_bytes = max_meta_bytes

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params
        if ctx.request_id is None or not isinstance(params, Mapping):
            return await call_next(ctx)
        meta = params.get("_meta")
        if meta is not None:
            size = len(json.dumps(meta, default=str).encode())
            if size > self.max_meta_bytes:
                raise MCPError(
                    INVALID_PARAMS,
                    f"_meta is too large: {size} bytes; the limit is {self.max_meta_bytes} bytes",
                )
        if ctx.method == "tools/call":
            refusal = await self._unknown_arguments(params)
            if refusal is not None:
                logger.info("refused tools/call: %s", refusal)
                return CallToolResult(content=[TextContent(type="text", text=refusal)], is_error=True)
        return await call_next(ctx)

    async def _unknown_arguments(self, params: Mapping[str, Any]) -> str | None:
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, Mapping) or not arguments:
            return None  # the SDK's own validation reports these
        tool = next((t for t in await self._server.list_tools() if t.name == name), None)
        if tool is None or tool.input_schema.get("additionalProperties") is True:
            return None
        accepted = set(tool.input_schema.get("properties", {}))
        unknown = sorted(str(key) for key in arguments if key not in accepted)
        if not unknown:
            return None
        listed = ", ".join(repr(key[:64]) for key in unknown[:10])
        # The same prefix as the SDK's other argument errors, so callers see one shape.
        return (
            f"Error executing tool {name}: unknown argument(s) {listed}; "
            f"accepted arguments: {', '.join(sorted(accepted)) or '(none)'}"
        )


def accept_logging_level(server: MCPServer[Any]) -> None:
    """Serve ``logging/setLevel`` for handshake-era clients (2025 protocol revisions).

    The tools send no log notifications, so any level is honoured trivially; answering the
    request (and advertising the capability) keeps clients that set a level from failing.
    """

    async def set_level(ctx: ServerRequestContext[Any, Any], params: SetLevelRequestParams) -> EmptyResult:
        logger.debug("client asked for log level %s", params.level)
        return EmptyResult()

    # MCPServer has no public hook for this method; the SDK documents the lowlevel
    # add_request_handler as the way to re-provide methods the 2026 revision removed.
    server._lowlevel_server.add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
