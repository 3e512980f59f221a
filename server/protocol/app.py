"""The MCP server: the SDK object, its lifespan, the request guard, and the tools, resources and prompts."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer

from retrieval.action_memory import Clock
from retrieval.embedders import Embedder
from server.config.reload import SettingsHolder
from server.config.settings import Settings
from server.protocol.handlers import KnowledgeHandlers
from server.protocol.lifespan import AppResources
from server.protocol.prompts import register_prompts
from server.protocol.recorder import CallRecorder
from server.protocol.resources import register_resources
from server.protocol.tools import register_tools
from server.transport.request_guard import RequestGuard, accept_logging_level
from storage.vector_store import MilvusVectorStore

SERVER_NAME = "lookup-knowledge-mcp"
INSTRUCTIONS = (
    "A team knowledge base. Call lookup_knowledge for facts from it; read relevance_level and budget in "
    "every result, and stop looking up when the result says so. knowledge://map lists the domains."
)


def app_resources(
    settings: Settings,
    *,
    config_path: Path | None = None,
    overrides: dict[str, Any] | None = None,
    embedder: Embedder | None = None,
    store: MilvusVectorStore | None = None,
    stdio_key: str | None = None,
    clock: Clock = time.monotonic,
) -> AppResources:
    """A server's resources; tests inject an embedder, store or clock, the CLI the config for hot reload."""
    holder = SettingsHolder(settings, config_path, overrides or {})
    return AppResources(holder, embedder=embedder, store=store, stdio_key=stdio_key, clock=clock)


def create_server(resources: AppResources) -> MCPServer[AppResources]:
    """The MCP server over ``resources``, which its lifespan acquires and releases."""
    mcp: MCPServer[AppResources] = MCPServer(
        SERVER_NAME, instructions=INSTRUCTIONS, lifespan=_lifespan(resources), log_level="WARNING"
    )
    recorder = CallRecorder(resources)
    handlers = KnowledgeHandlers(resources, recorder)
    mcp.middleware.append(RequestGuard(mcp, audit=recorder.unhandled))
    accept_logging_level(mcp)
    register_tools(mcp, handlers)
    register_resources(mcp, handlers)
    register_prompts(mcp, handlers)
    return mcp


def _lifespan(
    resources: AppResources,
) -> Callable[[MCPServer[AppResources]], AbstractAsyncContextManager[AppResources]]:
    @asynccontextmanager
    async def lifespan(_: MCPServer[AppResources]) -> AsyncIterator[AppResources]:
        await resources.acquire()
        try:
            yield resources
        finally:
            await resources.release()

    return lifespan
