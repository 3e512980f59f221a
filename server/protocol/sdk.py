"""Every use of the MCP SDK's private attributes, in one place.

The SDK has no public hook for these needs. ``tests/test_sdk_adapter.py`` checks each
attribute on real SDK objects, so an SDK release that renames or removes one fails there, by
name, instead of somewhere deep in a request.
"""

from __future__ import annotations

from typing import Any

from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool


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


def registered_tools(mcp: MCPServer[Any]) -> list[Tool]:
    """The tools registered on an MCPServer, as the SDK keeps them.

    Needed to publish each tool's output schema in its inlined form (``output_schema.py``): the
    SDK reads ``Tool.fn_metadata.output_schema`` live when it lists the tools. The request guard
    reads each tool's input schema (``Tool.parameters``) here too.
    """
    return mcp._tool_manager.list_tools()
