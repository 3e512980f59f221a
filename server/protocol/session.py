"""Which session a request belongs to, resolved in a fixed order and reported as session_scope.

1. explicit: a key the host application sets, the ``X-Session-Id`` header or ``_meta.session_id``.
   Keys belong to the authenticated principal: with HTTP auth the internal key carries the
   principal's name, so a client naming another principal's key gets a memory of its own.
   Over HTTP without auth, every client is the same principal, so keys are only taken from
   loopback peers unless ``http.allow_remote_session_keys`` says otherwise;
2. mcp-session: the ``mcp-session-id`` of stateful streamable HTTP (which the transport issued
   and checks), or the SSE ``session_id``. Stateless HTTP issues none, so the header is ignored;
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
from server.protocol.http_security import is_loopback

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


def explicit_key(principal: str | None, key: str) -> str:
    """The internal memory key of an explicit key; principal names hold no ':', so keys cannot collide."""
    return f"explicit@{principal}:{key}" if principal else f"explicit:{key}"


def resolve_session(
    *,
    headers: Mapping[str, str] | None,
    meta: Any,
    query_params: Mapping[str, str] | None,
    connection: Any,
    is_http: bool,
    stdio_key: str | None,
    handshake: bool,
    principal: str | None = None,
    peer: str | None = None,
    allow_remote_keys: bool = False,
    trust_mcp_session_id: bool = True,
) -> SessionIdentity:
    """Apply the resolution order to what the transport carried."""
    meta_value = meta.get(META_KEY) if isinstance(meta, Mapping) else getattr(meta, META_KEY, None)
    explicit: str | None = None
    if meta_value is not None:
        explicit = _explicit(meta_value, "_meta.session_id")
    elif headers is not None and headers.get(EXPLICIT_HEADER) is not None:
        explicit = _explicit(headers[EXPLICIT_HEADER], "X-Session-Id")
    if explicit is not None:
        if is_http and principal is None and not allow_remote_keys and not (peer and is_loopback(peer)):
            raise SessionKeyError(
                f"explicit session keys (X-Session-Id, _meta.session_id) are refused from {peer or 'an unknown peer'} "
                "over HTTP without authentication, since any client could name them; configure "
                "http.clients or an auth token, or set http.allow_remote_session_keys"
            )
        return SessionIdentity(explicit_key(principal, explicit), "explicit")
    mcp_session_id = headers.get("mcp-session-id") if headers is not None else None
    if mcp_session_id and is_http and handshake and trust_mcp_session_id:
        prefix = f"mcp@{principal}:" if principal else "mcp:"
        return SessionIdentity(prefix + mcp_session_id, "mcp-session")
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
