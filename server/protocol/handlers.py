"""What the MCP handlers call: one method per tool, resource and prompt, over the lookup service.

Each method runs inside the call recorder where the call is a tool call, and turns the service's
result into what the protocol returns. The handlers in ``tools.py``, ``resources.py`` and
``prompts.py`` only declare the interface and make one call here.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from contextlib import AbstractContextManager
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp_types import CallToolResult, TextContent

from retrieval.models import DomainInfo, KnowledgeMap, ReadResult, ResetResult
from retrieval.requests import LookupRequest
from retrieval.service import UnknownDocumentError
from server.container import described_map
from server.inputs import PromptLanguage
from server.log_summary import summarize
from server.protocol import prompt_texts
from server.protocol.lifespan import AppResources, WarmupError
from server.protocol.recorder import CallRecorder
from server.rendering import render_lookup
from storage.schema import SchemaVersionError
from storage.stats_queries import log_stats

logger = logging.getLogger(__name__)

Request = ServerRequestContext[Any, Any]


class KnowledgeHandlers:
    """The body of every MCP handler of one server."""

    def __init__(self, resources: AppResources, recorder: CallRecorder) -> None:
        self.resources = resources
        self.recorder = recorder

    def _admit(self) -> AbstractContextManager[None]:
        """One more lookup in flight, or a retryable busy error (retrieval.max_lookups_in_flight, hot)."""
        return self.resources.in_flight.admit(self.resources.settings.retrieval.max_lookups_in_flight)

    async def lookup(self, rc: Request, request: LookupRequest) -> CallToolResult:
        arguments = {
            "query": request.query,
            "domain": request.domain,
            "missing_dimension": request.missing_dimension,
        }
        async with self.recorder.call(rc, "lookup_knowledge", arguments) as call:
            with self._admit():
                service = await self.resources.lookup_service()
                call.outcome = await service.lookup(
                    request, session_key=call.identity.key, scope=call.identity.scope
                )
        result = call.outcome.result
        return CallToolResult(
            content=[TextContent(type="text", text=render_lookup(result))],
            structured_content=result.model_dump(mode="json"),
        )

    async def read(self, rc: Request, via: str, doc_key: str, section: str | None) -> ReadResult:
        """A whole document or one section, for the read tool (``via`` its name) or the doc resource."""
        logged = {"query": doc_key, "missing_dimension": section}
        async with self.recorder.call(rc, via, logged) as call:
            with self._admit():
                service = await self.resources.lookup_service()
                call.read = await service.read(
                    doc_key,
                    section,
                    session_key=call.identity.key,
                    scope=call.identity.scope,
                    limit=self.resources.settings.retrieval.read_max_chars,
                )
        return call.read.result

    async def read_resource(self, rc: Request, doc_key: str, section: str | None) -> str:
        try:
            result = await self.read(rc, "knowledge://doc", doc_key, section or None)
        except ToolError as exc:
            # An unknown document is the client's mistake (-32602, naming it), not -32603.
            if isinstance(exc.__cause__, UnknownDocumentError):
                raise ResourceNotFoundError(str(exc)) from exc
            raise ResourceError(str(exc)) from exc
        return result.model_dump_json(indent=2)

    async def reset(self, rc: Request) -> ResetResult:
        async with self.recorder.call(rc, "reset_session", {}) as call:
            key = call.identity.key
            forgotten = self.resources.memory.clear(key) if key else False
        message = (
            "session memory cleared; lookup_knowledge is open again"
            if key
            else "no session could be identified, so there was no memory to clear"
        )
        return ResetResult(session_scope=call.identity.scope, forgotten=forgotten, message=message)

    async def list_domains(self, rc: Request) -> KnowledgeMap:
        async with self.recorder.call(rc, "list_knowledge_domains", {}):
            service = await self.resources.lookup_service()
            return described_map(service.engine.knowledge_map(await service.view()), None)

    async def knowledge_map(self) -> KnowledgeMap:
        """The map for resources and prompts, where a warm-up failure is a resource error."""
        try:
            service = await self.resources.lookup_service()
        except WarmupError as exc:
            raise ResourceError(str(exc)) from exc
        return described_map(service.engine.knowledge_map(await service.view()), None)

    async def domain(self, domain: str) -> DomainInfo:
        knowledge_map = await self.knowledge_map()
        found = next((d for d in knowledge_map.domains if d.domain_id == domain), None)
        if found is None:
            known = ", ".join(d.domain_id for d in knowledge_map.domains)
            raise ResourceError(f"unknown domain {domain!r}; known domains: {known}")
        return found

    async def planner_prompt(self, language: PromptLanguage) -> str:
        return prompt_texts.planner_prompt(await self.knowledge_map(), language)

    async def stats(self) -> str:
        """The whole log's summary plus the live writer's health, as JSON (knowledge://stats)."""
        log, settings = self.resources.log, self.resources.settings
        path = log.path if log is not None else settings.log_path
        try:
            summary = summarize(await log_stats(path))
        except (sqlite3.Error, SchemaVersionError) as exc:
            # Clients of the resource learn nothing about the server's filesystem: no path here.
            logger.error("cannot read the invocation log %s: %s", path, exc)
            raise ResourceError(f"cannot read the invocation log: {type(exc).__name__}") from exc
        summary["log"].pop("path", None)
        summary["log"]["enabled"] = settings.log.enabled
        summary["log"]["write_failures"] = log.failures if log is not None else None
        summary["log"]["reopens"] = log.reopens if log is not None else None
        summary["log"]["last_error"] = log.last_error if log is not None else None
        return json.dumps(summary, ensure_ascii=False, indent=2)
