"""``serve``: run the MCP server over stdio, SSE or streamable HTTP."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio

from server.app import create_server
from server.data_dir import DataDirError, prepare_data_dir
from server.http_security import (
    BearerAuthMiddleware,
    HostOriginGuard,
    host_policy,
    transport_security,
    warn_if_exposed,
)
from server.resources import AppResources
from server.session import new_stdio_key
from server.settings import Settings
from server.stdio_transport import run_stdio
from storage import lite_share
from storage.vector_store import StoreError, check_reachable, is_lite_uri

logger = logging.getLogger(__name__)


def build_http_app(mcp: Any, settings: Settings, *, transport: str, stateless: bool = False) -> Any:
    """The Starlette app for an HTTP transport, with auth, body limit and DNS-rebinding protection."""
    http = settings.http
    security = transport_security()
    resources: AppResources = mcp.resources_state
    # Stateless streamable HTTP issues no session ids: an mcp-session-id header is then only
    # the client's say-so, and trusting it would let anyone name another client's memory.
    resources.trust_mcp_session_id = transport == "sse" or not stateless
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
    guarded = HostOriginGuard(app, host_policy(http.host, http.allowed_hosts))
    principals = http.principals()
    if principals:
        return BearerAuthMiddleware(guarded, principals)
    return guarded


def milvus_startup_problem(settings: Settings) -> str | None:
    """Why Milvus cannot be used (None when it can).

    The retrieval stack warms up in the background after ``initialize``, so without this
    check an unreachable server would only show up as an error on every lookup. Connecting
    is bounded by milvus.timeout_s. A Lite directory is only checked for a holder that does
    not share it (storage.lite_share); opening it here would delay ``initialize``.
    """
    uri = settings.milvus_uri
    if is_lite_uri(uri):
        return lite_share.probe(uri, settings.milvus.timeout_s)
    try:
        check_reachable(uri, settings.milvus.token, settings.milvus.timeout_s)
    except StoreError as exc:
        return str(exc)
    return None


def serve(
    settings: Settings,
    config_path: Path | None,
    overrides: dict[str, Any],
    *,
    transport: str,
    stateless: bool = False,
) -> int:
    """Run until interrupted; returns the exit code."""
    try:
        # Before serving: over stdio a failure later would leave initialize unanswered.
        prepare_data_dir(settings.data_dir)
    except DataDirError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problem = milvus_startup_problem(settings)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    stdio_key = new_stdio_key() if transport == "stdio" else None
    mcp = create_server(settings, config_path=config_path, overrides=overrides, stdio_key=stdio_key)
    if transport == "stdio":
        # stdout belongs to the protocol: everything else goes to stderr.
        anyio.run(run_stdio, mcp)
        return 0
    import uvicorn

    warning = warn_if_exposed(settings.http.host, bool(settings.http.principals()))
    if warning:
        print(warning, file=sys.stderr)
    app = build_http_app(mcp, settings, transport=transport, stateless=stateless)
    path = "/sse" if transport == "sse" else "/mcp"
    logger.info("serving %s on http://%s:%d%s", transport, settings.http.host, settings.http.port, path)
    config = uvicorn.Config(
        app, host=settings.http.host, port=settings.http.port, log_level="warning", lifespan="on"
    )
    anyio.run(uvicorn.Server(config).serve)
    return 0
