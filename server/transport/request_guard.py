"""Refuse malformed requests before they reach a handler (unknown tool arguments, oversized ``_meta``),
and make sure every ``tools/call`` leaves exactly one row in the invocation log.

The SDK builds each tool's argument model with extra fields allowed, so a misspelt argument
(``topk`` for ``top_k``) would be silently dropped and the call would run with the default.
This middleware turns it into an ``isError`` result that names the argument, like any other
argument validation failure, so the caller can correct itself.

The tool handlers log their own calls (``CallRecorder.call`` in server.protocol.recorder). A call that never
reaches a handler (refused here, an argument that fails validation, an unknown tool, a
malformed ``tools/call``) is logged here instead, through the ``audit`` hook: a per-request
``ToolAudit`` tells the two apart.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, EmptyResult, SetLevelRequestParams, TextContent
from mcp_types.jsonrpc import INVALID_PARAMS

from server.protocol.sdk import lowlevel_server, registered_tools

logger = logging.getLogger(__name__)

# A session id and a few protocol keys fit in well under 1 KiB; 16 KiB leaves room for clients
# that carry tracing context, and keeps one request from inflating the log and the memory.
MAX_META_BYTES = 16 * 1024


@dataclass
class ToolAudit:
    """Whether the current tools/call has written its log row yet."""

    recorded: bool = False


_current_audit: ContextVar[ToolAudit | None] = ContextVar("lookup_knowledge_tool_audit", default=None)


def mark_recorded() -> None:
    """Called by a tool handler once it has logged its call, so the guard does not log it again."""
    audit = _current_audit.get()
    if audit is not None:
        audit.recorded = True


# (request context, tool name as sent, arguments as sent, error, latency in ms) -> log one row
AuditHook = Callable[[ServerRequestContext[Any, Any], Any, Any, "str | None", float], Awaitable[None]]


class RequestGuard:
    """Server middleware: ``_meta`` size limit on every request, unknown-argument check and audit on tools/call."""

    def __init__(
        self, server: MCPServer[Any], *, max_meta_bytes: int = MAX_META_BYTES, audit: AuditHook | None = None
    ) -> None:
        self._server = server
        self.max_meta_bytes = max_meta_bytes
        self._audit = audit

    async def __call__(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params
        if ctx.request_id is None:
            return await call_next(ctx)
        if ctx.method == "tools/call":
            return await self._audited_call(ctx, params, call_next)
        if isinstance(params, Mapping):
            self._check_meta(params)
        return await call_next(ctx)

    def _check_meta(self, params: Mapping[str, Any]) -> None:
        meta = params.get("_meta")
        if meta is not None:
            size = len(json.dumps(meta, default=str).encode())
            if size > self.max_meta_bytes:
                raise MCPError(
                    INVALID_PARAMS,
                    f"_meta is too large: {size} bytes; the limit is {self.max_meta_bytes} bytes",
                )

    async def _audited_call(
        self, ctx: ServerRequestContext[Any, Any], params: Any, call_next: CallNext
    ) -> HandlerResult:
        audit = ToolAudit()
        token = _current_audit.set(audit)
        started = time.perf_counter()
        error: str | None = None
        name = params.get("name") if isinstance(params, Mapping) else None
        arguments = params.get("arguments") if isinstance(params, Mapping) else None
        try:
            if isinstance(params, Mapping):
                self._check_meta(params)
                refusal = self._unknown_arguments(params)
                if refusal is not None:
                    logger.info("refused tools/call: %s", refusal)
                    error = refusal
                    return CallToolResult(content=[TextContent(type="text", text=refusal)], is_error=True)
            result = await call_next(ctx)
            error = _error_text(result)
            return result
        except MCPError as exc:
            error = f"JSON-RPC error {exc.error.code}: {exc.error.message}"
            raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            _current_audit.reset(token)
            if not audit.recorded and self._audit is not None:
                await self._audit(ctx, name, arguments, error, (time.perf_counter() - started) * 1000)

    def _unknown_arguments(self, params: Mapping[str, Any]) -> str | None:
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, Mapping) or not arguments:
            return None  # the SDK's own validation reports these
        # The registered tool's own input schema, the one the SDK lists: listing the tools builds
        # every tool's protocol model, on every call.
        tool = next((t for t in registered_tools(self._server) if t.name == name), None)
        if tool is None or tool.parameters.get("additionalProperties") is True:
            return None
        accepted = set(tool.parameters.get("properties", {}))
        unknown = sorted(str(key) for key in arguments if key not in accepted)
        if not unknown:
            return None
        listed = ", ".join(repr(key[:64]) for key in unknown[:10])
        # The same prefix as the SDK's other argument errors, so callers see one shape.
        return (
            f"Error executing tool {name}: unknown argument(s) {listed}; "
            f"accepted arguments: {', '.join(sorted(accepted)) or '(none)'}"
        )


def _error_text(result: Any) -> str | None:
    """The text of an ``isError`` tools/call result (wire dict or model), else None."""
    if isinstance(result, CallToolResult):
        is_error, content = bool(result.is_error), [c.model_dump() for c in result.content]
    elif isinstance(result, Mapping):
        is_error, content = bool(result.get("isError")), list(result.get("content") or [])
    else:
        return None
    if not is_error:
        return None
    texts = [str(item.get("text", "")) for item in content if isinstance(item, Mapping)]
    return " ".join(texts) or "tool error"


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
    lowlevel_server(server).add_request_handler("logging/setLevel", SetLevelRequestParams, set_level)
