"""The call recorder: resolve the caller's session, turn failures into tool errors, log one row per call.

Every tool handler runs inside ``CallRecorder.call``. A ``tools/call`` that never reaches a
handler (refused by the request guard, invalid arguments, an unknown tool) is logged by
``CallRecorder.unhandled``, the guard's audit hook. Either way each call leaves one row.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from mcp.server.context import ServerRequestContext
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from retrieval.embedders import EmbedderError
from retrieval.service import (
    EmptyKnowledgeBaseError,
    LookupOutcome,
    ReadOutcome,
    UnknownDocumentError,
    UnknownDomainError,
)
from server.inputs import LOGGED_ARGUMENT_LIMITS
from server.protocol.admission import ServerBusyError
from server.protocol.lifespan import AppResources, WarmupError
from server.protocol.sdk import connection_of
from server.protocol.session import SessionIdentity, SessionKeyError, resolve_session
from server.transport.http_security import peer_host, principal_of
from server.transport.request_guard import mark_recorded
from storage.invocation_record import InvocationRecord

logger = logging.getLogger(__name__)

# Failures whose message is already meant for the caller; anything else gets its type named.
_CALLER_ERRORS = (
    UnknownDomainError,
    UnknownDocumentError,
    EmptyKnowledgeBaseError,
    WarmupError,
    EmbedderError,
    ServerBusyError,
)
_NO_SESSION = SessionIdentity(None, "none")


@dataclass
class ToolCall:
    """What one tool call learned, for its log row."""

    arguments: Mapping[str, Any]
    identity: SessionIdentity = _NO_SESSION
    outcome: LookupOutcome | None = None
    read: ReadOutcome | None = None
    error: str | None = None


def loggable(value: Any, limit: int) -> str | None:
    """A string cut to ``limit`` characters, lone surrogates escaped (SQLite stores UTF-8); else None."""
    if not isinstance(value, str):
        return None
    return value[:limit].encode("utf-8", "backslashreplace").decode("utf-8")


class CallRecorder:
    """Session resolution and the invocation log, for every tool call of one server."""

    def __init__(self, resources: AppResources) -> None:
        self.resources = resources

    def identify(self, rc: ServerRequestContext[Any, Any]) -> SessionIdentity:
        """The session of a request, from what its transport carried (raises SessionKeyError)."""
        request = rc.request
        return resolve_session(
            headers=getattr(request, "headers", None),
            meta=rc.meta,
            query_params=getattr(request, "query_params", None),
            connection=connection_of(rc.session),
            is_http=request is not None,
            stdio_key=self.resources.stdio_key,
            handshake=rc.protocol_version not in MODERN_PROTOCOL_VERSIONS,
            principal=principal_of(request),
            peer=peer_host(request),
            allow_remote_keys=self.resources.settings.http.allow_remote_session_keys,
            transport_session=self.resources.transport_session,
        )

    @asynccontextmanager
    async def call(
        self, rc: ServerRequestContext[Any, Any], tool_name: str, arguments: Mapping[str, Any]
    ) -> AsyncIterator[ToolCall]:
        """Run one handler: its session resolved, its failures made tool errors, its row logged."""
        started = time.perf_counter()
        call = ToolCall(arguments)
        try:
            call.identity = self._identify_or_refuse(rc)
            yield call
        except ToolError as exc:
            call.error = str(exc)
            raise
        except _CALLER_ERRORS as exc:
            call.error = str(exc)
            raise ToolError(call.error) from exc
        except Exception as exc:
            # A store or model failure mid-request: report it as a tool error and keep serving.
            logger.exception("%s failed", tool_name)
            call.error = f"{tool_name} failed: {type(exc).__name__}: {exc}"
            raise ToolError(call.error) from exc
        finally:
            mark_recorded()
            await self._record(tool_name, call, (time.perf_counter() - started) * 1000)

    async def unhandled(
        self,
        rc: ServerRequestContext[Any, Any],
        name: Any,
        arguments: Any,
        error: str | None,
        latency_ms: float,
    ) -> None:
        """The request guard's audit hook: one row, holding only the logged fields, cut to their limits."""
        try:
            identity = self.identify(rc)
        except SessionKeyError:
            identity = _NO_SESSION
        given = arguments if isinstance(arguments, dict) else {}
        call = ToolCall(
            {field: loggable(given.get(field), limit) for field, limit in LOGGED_ARGUMENT_LIMITS.items()},
            identity=identity,
            error=loggable(error or "the call was not answered", 2000),
        )
        await self._record(loggable(name, 128) or "(no tool name)", call, latency_ms)

    def _identify_or_refuse(self, rc: ServerRequestContext[Any, Any]) -> SessionIdentity:
        try:
            return self.identify(rc)
        except SessionKeyError as exc:
            raise ToolError(str(exc)) from exc

    async def _record(self, tool_name: str, call: ToolCall, latency_ms: float) -> None:
        """Commit the call's row before its response is sent (never raises)."""
        log = self.resources.log
        if log is not None:
            # log.log_queries is hot: a privacy switch turned off applies to this very row.
            log.log_queries = self.resources.settings.log.log_queries
            await log.record(_record_of(tool_name, call, latency_ms))


def _record_of(tool_name: str, call: ToolCall, latency_ms: float) -> InvocationRecord:
    outcome, read = call.outcome, call.read
    result = outcome.result if outcome else None
    delivered = outcome or read
    return InvocationRecord(
        ts=time.time(),
        session_key=call.identity.key,
        session_scope=call.identity.scope,
        tool_name=tool_name,
        query=call.arguments.get("query"),
        domain_filter=call.arguments.get("domain"),
        missing_dimension=call.arguments.get("missing_dimension"),
        relevance_level=result.relevance_level if result else None,
        dedup_reason=result.dedup_reason if result else None,
        completeness_hint=result.completeness_hint if result else None,
        water_level=result.budget.water_level if result else None,
        next_call=result.budget.next_call if result else None,
        call_index=delivered.call_index if delivered else None,
        result_doc_keys=delivered.result_doc_keys if delivered else [],
        retrieval_details=outcome.details.model_dump(mode="json") if outcome else None,
        latency_ms=latency_ms,
        error=call.error,
    )
