"""Which session a request belongs to, resolved in a fixed order and reported as session_scope.

1. explicit: a key the host application sets, the ``X-Session-Id`` header or ``_meta.session_id``;
2. mcp-session: the ``mcp-session-id`` of stateful streamable HTTP, or the SSE ``session_id``;
3. connection: stdio (one process serves one client), or an in-process handshake connection;
4. none: no session exists (the 2026-07-28 protocol over HTTP, stateless HTTP without a key).
   Action memory is then off for that call, rather than merging unrelated clients.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from retrieval.models import SessionScope

EXPLICIT_HEADER = "x-session-id"
META_KEY = "session_id"
_KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,256}$")
_CONNECTION_STATE_KEY = "lookup_knowledge.session"


class SessionKeyError(ValueError):
    """An explicit session key is malformed."""


@dataclass(frozen=True)
class SessionIdentity:
    key: str | None
    scope: SessionScope


def _explicit(value: Any, source: str) -> str:
    if not isinstance(value, str) or not _KEY_PATTERN.match(value):
        shown = value if not isinstance(value, str) else value[:40]
        raise SessionKeyError(
            f"{source} must be 1-256 printable ASCII characters without spaces, got {shown!r}"
        )
    return value


def resolve_session(
    *,
    headers: Mapping[str, str] | None,
    meta: Any,
    query_params: Mapping[str, str] | None,
    connection: Any,
    is_http: bool,
    stdio_key: str | None,
    handshake: bool,
) -> SessionIdentity:
    """Apply the resolution order to what the transport carried."""
    meta_value = meta.get(META_KEY) if isinstance(meta, Mapping) else getattr(meta, META_KEY, None)
    if meta_value is not None:
        return SessionIdentity("explicit:" + _explicit(meta_value, "_meta.session_id"), "explicit")
    if headers is not None and headers.get(EXPLICIT_HEADER) is not None:
        return SessionIdentity("explicit:" + _explicit(headers[EXPLICIT_HEADER], "X-Session-Id"), "explicit")
    if headers is not None and headers.get("mcp-session-id"):
        return SessionIdentity("mcp:" + headers["mcp-session-id"], "mcp-session")
    if query_params is not None and query_params.get("session_id"):
        # SSE: the message endpoint carries the stream's session id as a query parameter.
        return SessionIdentity("sse:" + query_params["session_id"], "mcp-session")
    if is_http:
        return SessionIdentity(None, "none")
    if stdio_key is not None:
        return SessionIdentity(stdio_key, "connection")
    state = getattr(connection, "state", None)
    if handshake and isinstance(state, dict):
        # In-process clients on a handshake connection: the connection object lives as long as
        # the client, and its scratch state is private to it.
        key = state.setdefault(_CONNECTION_STATE_KEY, "conn:" + uuid.uuid4().hex)
        return SessionIdentity(key, "connection")
    return SessionIdentity(None, "none")


def new_stdio_key() -> str:
    """One key per stdio process: the process serves exactly one client."""
    return "stdio:" + uuid.uuid4().hex
