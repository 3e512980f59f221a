"""``serve``: run the MCP server over stdio, SSE or streamable HTTP."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from pathlib import Path
from typing import Any

import anyio

from server.cli.listen import BindError, address_text, bind_listeners
from server.config.data_dir import DataDirError, check_invocation_log, prepare_data_dir
from server.config.settings import Settings
from server.protocol.app import app_resources, create_server
from server.protocol.lifespan import AppResources
from server.protocol.session import new_stdio_key
from server.transport.http_app import build_http_app
from server.transport.http_security import warn_if_exposed
from server.transport.stdio import run_stdio
from storage import lite_share
from storage.vector_store import StoreError, check_reachable, is_lite_uri

logger = logging.getLogger(__name__)


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


def cmd_serve(
    args: argparse.Namespace, settings: Settings, config_path: Path | None, overrides: dict[str, Any]
) -> int:
    return serve(settings, config_path, overrides, transport=args.transport, stateless=args.stateless)


def serve(
    settings: Settings,
    config_path: Path | None,
    overrides: dict[str, Any],
    *,
    transport: str,
    stateless: bool = False,
) -> int:
    """Run until interrupted; returns the exit code."""
    # Before serving: over stdio a failure later would leave initialize unanswered.
    problem = startup_problem(settings)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    if transport == "stdio":
        resources = app_resources(
            settings, config_path=config_path, overrides=overrides, stdio_key=new_stdio_key()
        )
        # stdout belongs to the protocol: everything else goes to stderr.
        anyio.run(run_stdio, create_server(resources))
        return 0
    try:
        listeners = bind_listeners(settings.http.host, settings.http.port)
    except BindError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        resources = app_resources(settings, config_path=config_path, overrides=overrides)
        serve_http(resources, listeners, transport=transport, stateless=stateless)
    finally:
        for sock in listeners:
            sock.close()
    return 0


def startup_problem(settings: Settings) -> str | None:
    """Why the server cannot start (None when it can): data directory and its log, watched folder, Milvus."""
    try:
        prepare_data_dir(settings.data_dir)
        if settings.log.enabled:
            check_invocation_log(settings.log_path)
    except DataDirError as exc:
        return str(exc)
    watched = settings.watch.directory
    if watched is not None and not watched.is_dir():
        # Checked here, not only by the watcher: it would log an error and serve an empty index.
        why = "it is not a directory" if watched.exists() else "it does not exist"
        return f"cannot watch {str(watched)!r} (--watch, watch.directory): {why}"
    return milvus_startup_problem(settings)


def serve_http(
    resources: AppResources, listeners: list[socket.socket], *, transport: str, stateless: bool
) -> None:
    """Serve SSE or streamable HTTP on the bound sockets until interrupted."""
    import uvicorn

    settings = resources.settings
    warning = warn_if_exposed(settings.http.host, bool(settings.http.principals()))
    if warning:
        print(warning, file=sys.stderr)
    app = build_http_app(
        create_server(resources), resources, settings, transport=transport, stateless=stateless
    )
    path = "/sse" if transport == "sse" else "/mcp"
    port = listeners[0].getsockname()[1]
    logger.info("serving %s on http://%s%s", transport, address_text(settings.http.host, port), path)
    # host and port only label uvicorn's own messages: it serves the sockets bound above.
    config = uvicorn.Config(app, host=settings.http.host, port=port, log_level="warning", lifespan="on")
    anyio.run(uvicorn.Server(config).serve, listeners)
