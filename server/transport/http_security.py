"""HTTP hardening: bearer-token principals, exact Host/Origin checks and the bind-address warning.

The SDK's own DNS-rebinding check matches ``127.0.0.1:*`` as a string prefix, so
``Host: 127.0.0.1:8791.evil`` and ``Origin: http://127.0.0.1:8791.evil.example`` passed it.
``HostOriginGuard`` parses both headers and compares the host name exactly; the SDK's check is
left to Content-Type only.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

from server.transport.host_names import origin_host, split_host

logger = logging.getLogger(__name__)

_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}
# Where the authenticated principal travels from the ASGI middleware to the tool handlers.
PRINCIPAL_STATE_KEY = "lookup_knowledge.principal"


def is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class HostPolicy:
    """The host names a request may name in Host and Origin; a name with a port allows only that port."""

    any_port: frozenset[str]
    exact: frozenset[tuple[str, int]]

    def allows(self, name: str | None, port: int | None) -> bool:
        if not name:
            return False
        name = name.lower()
        return name in self.any_port or (port is not None and (name, port) in self.exact)


def host_policy(host: str, extra_hosts: list[str]) -> HostPolicy:
    """Loopback names, the bind address (unless a wildcard) and ``http.allowed_hosts``."""
    any_port = set(_LOOPBACK_NAMES)
    exact: set[tuple[str, int]] = set()
    if not is_loopback(host) and host not in ("0.0.0.0", "::"):
        any_port.add(host.strip("[]").lower())
    for extra in extra_hosts:
        name, port = split_host(extra)
        if name is None:
            raise ValueError(f"http.allowed_hosts: {extra!r} is not a host name or host:port")
        if port is None:
            any_port.add(name)
        else:
            exact.add((name, port))
    return HostPolicy(frozenset(any_port), frozenset(exact))


def transport_security() -> TransportSecuritySettings:
    """The SDK's own check, reduced to Content-Type: HostOriginGuard does Host and Origin exactly."""
    return TransportSecuritySettings(enable_dns_rebinding_protection=False)


async def _refuse(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return bytes(value)
    return None


class HostOriginGuard:
    """DNS-rebinding protection: 421 for a Host, 403 for an Origin, that the policy does not name."""

    def __init__(self, app: ASGIApp, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        plain = [(b"content-type", b"text/plain; charset=utf-8")]
        host = _header(scope, b"host")
        if host is None or not self.policy.allows(*split_host(host.decode("latin-1"))):
            logger.warning("refused Host header %r", (host or b"")[:100])
            await _refuse(send, 421, b"Invalid Host header", plain)
            return
        origin = _header(scope, b"origin")
        if origin is not None and not self.policy.allows(*origin_host(origin.decode("latin-1"))):
            logger.warning("refused Origin header %r", origin[:100])
            await _refuse(send, 403, b"Invalid Origin header", plain)
            return
        await self.app(scope, receive, send)


def warn_if_exposed(host: str, authenticated: bool) -> str | None:
    """The warning to print when binding beyond loopback without auth (None when fine)."""
    if is_loopback(host) or authenticated:
        return None
    return (
        f"WARNING: serving on {host} without authentication; anyone who can reach this address can query "
        "the knowledge base. Set --auth-token-file (or LOOKUP_KNOWLEDGE_AUTH_TOKEN, or http.clients)."
    )


def bearer_token(header: bytes | None) -> bytes | None:
    """The credentials of ``Authorization: Bearer <token>``; the scheme is case-insensitive (RFC 7235)."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(b" ")
    token = token.strip(b" \t")
    if scheme.lower() != b"bearer" or not token:
        return None
    return token


class BearerAuthMiddleware:
    """Requires a known bearer token on every HTTP request (401 otherwise) and records its principal.

    ``principals`` maps the hex SHA-256 of each token to the principal's name, so the
    configuration holds no token in clear. The principal is put in the request state, where
    the session resolution reads it to keep explicit session keys apart per principal, and in
    ``scope["user"]``, where the SDK's transports read who opened a session: streamable HTTP
    and SSE then answer another principal's use of its id (POST, GET, DELETE, or a message to
    ``/messages/?session_id=``) with 404, as if the session did not exist.
    """

    def __init__(self, app: ASGIApp, principals: Mapping[str, str]) -> None:
        if not principals:
            raise ValueError("BearerAuthMiddleware needs at least one token")
        self.app = app
        self._principals = [(bytes.fromhex(digest), name) for digest, name in principals.items()]

    def authenticate(self, header: bytes | None) -> str | None:
        """The principal whose token the header carries, or None."""
        token = bearer_token(header)
        digest = hashlib.sha256(token).digest() if token is not None else b"\0" * 32
        found = None
        for expected, name in self._principals:
            # Every digest is compared, in constant time, so timing does not tell which one matched.
            if hmac.compare_digest(digest, expected) and token is not None:
                found = name
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        principal = self.authenticate(_header(scope, b"authorization"))
        if principal is None:
            await _refuse(
                send,
                401,
                b'{"error": "unauthorized: send Authorization: Bearer <token>"}',
                [
                    (b"content-type", b"application/json"),
                    (b"www-authenticate", b'Bearer realm="lookup-knowledge-mcp"'),
                ],
            )
            return
        state: dict[str, Any] = scope.setdefault("state", {})
        state[PRINCIPAL_STATE_KEY] = principal
        scope["user"] = principal_user(principal)
        await self.app(scope, receive, send)


def principal_user(principal: str) -> AuthenticatedUser:
    """The SDK's authenticated user for a principal: session ownership compares its client_id.

    The token itself is not kept: only the principal's name identifies it.
    """
    return AuthenticatedUser(AccessToken(token=f"principal:{principal}", client_id=principal, scopes=[]))


def principal_of(request: Any) -> str | None:
    """The principal BearerAuthMiddleware authenticated for this HTTP request (None without auth)."""
    scope = getattr(request, "scope", None)
    if not isinstance(scope, Mapping):
        return None
    state = scope.get("state")
    return state.get(PRINCIPAL_STATE_KEY) if isinstance(state, Mapping) else None


# Headers a reverse proxy adds. Behind a proxy on this host every TCP peer is loopback.
_PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")
PROXIED_PEER = "a client behind a proxy"


def peer_host(request: Any) -> str | None:
    """The TCP peer address of an HTTP request; PROXIED_PEER when a proxy header is present.

    Behind a reverse proxy on the same host every request arrives from loopback, so loopback
    would vouch for any client. A request that names a proxy header (Forwarded,
    X-Forwarded-For, X-Real-IP) is counted as remote; the header's value itself is not trusted
    (any client can send it), so it only ever takes trust away.
    """
    headers = getattr(request, "headers", None)
    if headers is not None and any(name in headers for name in _PROXY_HEADERS):
        return PROXIED_PEER
    client = getattr(request, "client", None)
    return getattr(client, "host", None)
