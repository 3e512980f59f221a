"""The Starlette app of an HTTP transport (SSE or streamable HTTP), with its guards."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from mcp.server.mcpserver import MCPServer

from server.config.settings import Settings
from server.console.app import Console, ConsoleUnavailable, WithConsole, console_app
from server.container import Runtime
from server.protocol.lifespan import AppResources, WarmupError
from server.transport.http_security import (
    BearerAuthMiddleware,
    HostOriginGuard,
    host_policy,
    transport_security,
)


def build_http_app(
    mcp: MCPServer[AppResources],
    resources: AppResources,
    settings: Settings,
    *,
    transport: str,
    stateless: bool = False,
) -> Any:
    """The Starlette app for an HTTP transport, with auth, body limit and DNS-rebinding protection."""
    http = settings.http
    security = transport_security()
    # Only the id this transport issued names a session: stateless streamable HTTP issues none,
    # so an mcp-session-id header (or a ?session_id= anywhere but the SSE message endpoint) is
    # only the client's say-so, and trusting it would let anyone name another client's memory.
    if transport == "sse":
        resources.transport_session = "sse"
    else:
        resources.transport_session = "none" if stateless else "mcp-session-id"
    if transport == "sse":
        app = mcp.sse_app(
            max_request_body_size=http.max_body_bytes, transport_security=security, host=http.host
        )
        inner_lifespan = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def sse_lifespan(starlette_app: Any) -> AsyncIterator[None]:
            # SSE enters the MCP lifespan per connection: hold one reference for the whole
            # process so the model and memory outlive any single connection.
            await resources.acquire()
            try:
                async with inner_lifespan(starlette_app):
                    yield
            finally:
                await resources.release()

        app.router.lifespan_context = sse_lifespan
    else:
        app = mcp.streamable_http_app(
            stateless_http=stateless,
            max_request_body_size=http.max_body_bytes,
            transport_security=security,
            host=http.host,
        )
    console = served_console(resources)
    served_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(starlette_app: Any) -> AsyncIterator[None]:
        # The console's page process lives as long as the server (server.console.builder).
        async with console.running(), served_lifespan(starlette_app):
            yield

    app.router.lifespan_context = lifespan
    # The console shares the guards below: the same token and Host/Origin checks as /mcp.
    routed = WithConsole(app, console_app(console))
    guarded = HostOriginGuard(routed, host_policy(http.host, http.allowed_hosts))
    principals = http.principals()
    if principals:
        return BearerAuthMiddleware(guarded, principals)
    return guarded


def served_console(resources: AppResources) -> Console:
    """The console over this server's log, live settings and warmed-up retrieval stack."""

    async def runtime() -> Runtime:
        try:
            await resources.lookup_service()  # waits for the warm-up
        except WarmupError as exc:
            raise ConsoleUnavailable(str(exc)) from exc
        if resources.runtime is None:
            raise ConsoleUnavailable("the knowledge base is unavailable")
        return resources.runtime

    return Console(resources.settings.log_path, lambda: resources.settings, runtime, resources.in_flight)
