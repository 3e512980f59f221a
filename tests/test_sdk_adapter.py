"""The private SDK attributes that server.protocol.sdk relies on, checked on real SDK objects.

An SDK release that renames or removes one fails here, naming it, rather than deep in a request.
"""

from __future__ import annotations

from typing import Any

import anyio
from mcp import Client
from mcp.server.lowlevel.server import Server
from mcp.server.mcpserver import Context, MCPServer

from server.protocol.sdk import connection_of, lowlevel_server, registered_tools


def test_the_lowlevel_server_is_reachable_and_takes_request_handlers() -> None:
    server = lowlevel_server(MCPServer("adapter-check"))
    assert isinstance(server, Server)
    assert callable(server.add_request_handler) and callable(server.create_initialization_options)


async def test_a_handshake_session_carries_its_connection_object() -> None:
    mcp: MCPServer[Any] = MCPServer("adapter-check")
    seen: list[object | None] = []

    @mcp.tool()
    async def probe(ctx: Context) -> str:
        session = ctx.request_context.session
        assert hasattr(session, "_connection"), f"{type(session).__name__} has no _connection any more"
        seen.append(connection_of(session))
        return "ok"

    with anyio.fail_after(30):
        async with Client(mcp, mode="legacy") as client:
            await client.call_tool("probe", {})
            await client.call_tool("probe", {})
    # One connection object, the same for both calls of the connection.
    assert len(seen) == 2 and seen[0] is not None and seen[0] is seen[1]


async def test_a_registered_tools_output_schema_is_read_live_when_listed() -> None:
    mcp: MCPServer[Any] = MCPServer("adapter-check")

    @mcp.tool()
    async def probe() -> dict[str, int]:
        return {"n": 1}

    (tool,) = registered_tools(mcp)
    assert tool.name == "probe" and tool.fn_metadata.output_schema is not None
    tool.fn_metadata.output_schema = {"type": "object", "description": "replaced"}
    with anyio.fail_after(30):
        async with Client(mcp, mode="legacy") as client:
            (listed,) = (await client.list_tools()).tools
    assert listed.output_schema == {"type": "object", "description": "replaced"}


async def test_a_registered_tools_parameters_are_its_listed_input_schema() -> None:
    # The request guard checks argument names against Tool.parameters instead of listing the tools.
    mcp: MCPServer[Any] = MCPServer("adapter-check")

    @mcp.tool()
    async def probe(query: str, top_k: int = 3) -> str:
        return query * top_k

    (tool,) = registered_tools(mcp)
    assert set(tool.parameters["properties"]) == {"query", "top_k"}
    with anyio.fail_after(30):
        async with Client(mcp, mode="legacy") as client:
            (listed,) = (await client.list_tools()).tools
    assert listed.input_schema == tool.parameters
