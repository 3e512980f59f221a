"""stdio with an answer for every line: a line that is not JSON-RPC gets a JSON-RPC error back.

The SDK's stdio transport drops such a line (it logs it at debug level), so a client that
sent a broken frame would wait for a reply that never comes. Here the line is answered with
``-32700 Parse error`` (not JSON) or ``-32600 Invalid request`` (JSON, but not a JSON-RPC
message), carrying the request id when one can be read, and the next line is served as usual.

Lines are read with a cap (``MAX_LINE_BYTES``): a longer line is skipped without being held
in memory or parsed, and answered ``-32600 Invalid request: the line is longer than ...``.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from collections.abc import Mapping
from typing import Any, BinaryIO, cast

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage
from mcp_types import ErrorData, JSONRPCError
from mcp_types.jsonrpc import INVALID_REQUEST, PARSE_ERROR
from pydantic import ValidationError

from server.protocol.sdk import lowlevel_server

logger = logging.getLogger(__name__)

# The HTTP transports' default body limit (http.max_body_bytes): a request is a few KB at most.
MAX_LINE_BYTES = 1_000_000
# What the reader hands the SDK in place of an overlong line: it fails to parse, and the
# answering stream recognises it by its text.
_OVERLONG = "\x00overlong line\x00"


class BoundedLines:
    """stdin as the SDK's stdio transport iterates it, one line at a time, each at most ``limit`` bytes."""

    def __init__(self, buffer: BinaryIO, limit: int = MAX_LINE_BYTES) -> None:
        self._buffer = buffer
        self.limit = limit

    def _readline(self) -> str | None:
        line = self._buffer.readline(self.limit + 1)
        if not line:
            return None
        if len(line) > self.limit and not line.endswith(b"\n"):
            # Skip the rest of the line in bounded pieces; nothing of it is kept.
            while (rest := self._buffer.readline(65536)) and not rest.endswith(b"\n"):
                pass
            return _OVERLONG
        return line.decode("utf-8", errors="replace")

    def __aiter__(self) -> BoundedLines:
        return self

    async def __anext__(self) -> str:
        line = await anyio.to_thread.run_sync(self._readline, abandon_on_cancel=True)
        if line is None:
            raise StopAsyncIteration
        return line


def error_reply(exc: Exception) -> JSONRPCError:
    """The JSON-RPC error for a frame the transport could not parse."""
    errors = exc.errors() if isinstance(exc, ValidationError) else []
    if any(err.get("input") == _OVERLONG for err in errors):
        message = f"Invalid request: the line is longer than {MAX_LINE_BYTES} bytes, the stdio limit"
        return JSONRPCError(jsonrpc="2.0", id=None, error=ErrorData(code=INVALID_REQUEST, message=message))
    if not errors or any(err["type"] == "json_invalid" for err in errors):
        detail = errors[0]["msg"] if errors else str(exc)
        return JSONRPCError(
            jsonrpc="2.0", id=None, error=ErrorData(code=PARSE_ERROR, message=f"Parse error: {detail}")
        )
    # An error at the top level (a location of one union member) carries the whole message.
    top_level = [err["input"] for err in errors if len(err["loc"]) <= 1]
    kind = _json_kind(top_level[0]) if top_level and not isinstance(top_level[0], Mapping) else None
    # A missing-field error carries the whole message as its input: the id, if any, is there.
    # JSON-RPC answers with a null id when the id cannot be read.
    request_id = next(
        (
            value
            for err in errors
            if isinstance(err.get("input"), Mapping)
            and isinstance(value := err["input"].get("id"), str | int)
            and not isinstance(value, bool)
        ),
        None,
    )
    problem = (
        f"expected a JSON-RPC 2.0 request object, got a JSON {kind}"
        if kind is not None
        else "not a JSON-RPC 2.0 message (needs jsonrpc '2.0', and method, or result, or error)"
    )
    return JSONRPCError(
        jsonrpc="2.0",
        id=request_id,
        error=ErrorData(code=INVALID_REQUEST, message=f"Invalid request: {problem}"),
    )


def _json_kind(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {list: "array", str: "string", type(None): "null"}.get(type(value), type(value).__name__)


class _AnsweringReceiveStream:
    """The transport's read stream, minus unparseable frames, which are answered on the write stream."""

    def __init__(self, inner: Any, write_stream: Any) -> None:
        self._inner = inner
        self._write = write_stream
        # The dispatcher reads the sender's context per message from here (duck-typed).
        self.last_context: contextvars.Context | None = None

    async def receive(self) -> SessionMessage:
        while True:
            item = await self._inner.receive()
            if isinstance(item, Exception):
                reply = error_reply(item)
                logger.info("answered an unparseable stdio frame: %s", reply.error.message)
                await self._write.send(SessionMessage(reply))
                continue
            self.last_context = getattr(self._inner, "last_context", None)
            message: SessionMessage = item
            return message

    def __aiter__(self) -> _AnsweringReceiveStream:
        return self

    async def __anext__(self) -> SessionMessage:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    def close(self) -> None:
        self._inner.close()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _AnsweringReceiveStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


async def run_stdio(mcp: MCPServer[Any]) -> None:
    """Serve over the process's stdin/stdout, as ``MCPServer.run_stdio_async`` does, answering bad frames."""
    # MCPServer.run_stdio_async offers no hook on the read stream; this is its body, with
    # the read stream wrapped.
    server = lowlevel_server(mcp)
    # The SDK iterates stdin with ``async for``; BoundedLines serves it that way.
    stdin = cast(Any, BoundedLines(sys.stdin.buffer))
    async with stdio_server(stdin=stdin) as (read_stream, write_stream):
        await server.run(
            _AnsweringReceiveStream(read_stream, write_stream),
            write_stream,
            server.create_initialization_options(),
        )
