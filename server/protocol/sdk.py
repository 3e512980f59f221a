"""Every use of the MCP SDK's private attributes, in one place.

The SDK has no public hook for these three needs. ``tests/test_sdk_adapter.py`` checks each
attribute on real SDK objects, so an SDK release that renames or removes one fails there, by
name, instead of somewhere deep in a request.
"""

from __future__ import annotations

from typing import Any

from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer


def lowlevel_server(mcp: MCPServer[Any]) -> Server[Any]:
    """The low-level server under an MCPServer.

    Needed to re-provide ``logging/setLevel`` (the SDK documents ``add_request_handler`` for
    methods the 2026 revision removed) and to run stdio with a wrapped read stream.
    """
    server: Server[Any] = mcp._lowlevel_server
    return server


def connection_of(session: object) -> object | None:
    """The per-connection object of a server session, or None.

    It is stable for the life of a handshake-era connection, which is what the "connection"
    session scope needs; the SDK exposes it only privately.
    """
    return getattr(session, "_connection", None)
