"""Which session a request belongs to, resolved in a fixed order and reported as session_scope.

1. explicit: a key the host application sets, the ``X-Session-Id`` header or ``_meta.session_id``.
   Keys belong to the authenticated principal: with HTTP auth the internal key carries the
   principal's name, so a client naming another principal's key gets a memory of its own.
   Over HTTP without auth, every client is the same principal, so keys are only taken from
   loopback peers unless ``http.allow_remote_session_keys`` says otherwise;
2. mcp-session: the ``mcp-session-id`` of stateful streamable HTTP, or the ``session_id`` query
   parameter of the SSE message endpoint. Each is read only on the transport that issued it and
   checks it (the SDK refuses, with 404, an id another principal opened), and the key carries
   the principal. Stateless HTTP issues none; a ``?session_id=`` on streamable HTTP, or an
   ``mcp-session-id`` on SSE, is only the client's say-so and is ignored;
3. connection: stdio (one process serves one client), or an in-process handshake connection;
4. none: no session exists (the 2026-07-28 protocol over HTTP, stateless HTTP without a key).
   Action memory is then off for that call, rather than merging unrelated clients.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from retrieval.models import SessionScope
from server.transport.http_security import is_loopback

EXPLICIT_HEADER = "x-session-id"
META_KEY = "session_id"
_KEY_PATTERN = re.compile(r"^[\x21-\x7e]{1,256}$")
_CONNECTION_STATE_KEY = "lookup_knowledge.session"


# Which session id the transport issued, and so may be trusted: the mcp-session-id header of
# stateful streamable HTTP, the session_id query parameter of the SSE message endpoint, or none.
TransportSession = Literal["mcp-session-id", "sse", "none"]


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
    transport_session: TransportSession = "mcp-session-id",
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
    if is_http:
        transport_id = _transport_session_id(headers, query_params, handshake, transport_session)
        if transport_id is not None:
            kind, value = transport_id
            prefix = f"{kind}@{principal}:" if principal else f"{kind}:"
            return SessionIdentity(prefix + value, "mcp-session")
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


def _transport_session_id(
    headers: Mapping[str, str] | None,
    query_params: Mapping[str, str] | None,
    handshake: bool,
    transport_session: TransportSession,
) -> tuple[str, str] | None:
    """(kind, id) of the session id the transport issued and checked, or None."""
    if transport_session == "mcp-session-id" and handshake and headers is not None:
        value = headers.get("mcp-session-id")
        return ("mcp", value) if value else None
    if transport_session == "sse" and query_params is not None:
        # The SSE message endpoint carries its stream's session id; the SDK has checked that the
        # stream exists and that this principal opened it.
        value = query_params.get("session_id")
        return ("sse", value) if value else None
    return None


def new_stdio_key() -> str:
    """One key per stdio process: the process serves exactly one client."""
    return "stdio:" + uuid.uuid4().hex
