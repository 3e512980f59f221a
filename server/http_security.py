"""HTTP hardening: bearer-token auth, DNS-rebinding settings and the bind-address warning."""

from __future__ import annotations

import hmac
import ipaddress
import logging

from mcp.server.transport_security import TransportSecuritySettings
from starlette.types import ASGIApp, Receive, Scope, Send

logger = logging.getLogger(__name__)

_LOOPBACK_NAMES = {"localhost", "127.0.0.1", "::1"}


def is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def transport_security(host: str, port: int, extra_hosts: list[str]) -> TransportSecuritySettings:
    """DNS-rebinding protection stays on for every bind address: only known Host/Origin values pass."""
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    if not is_loopback(host) and host not in ("0.0.0.0", "::"):
        hosts.append(f"{host}:*")
        origins.append(f"http://{host}:*")
    for extra in extra_hosts:
        hosts.append(extra if ":" in extra else f"{extra}:*")
        origins.append(f"http://{extra}" if ":" in extra else f"http://{extra}:*")
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True, allowed_hosts=hosts, allowed_origins=origins
    )


def warn_if_exposed(host: str, auth_token: str | None) -> str | None:
    """The warning to print when binding beyond loopback without auth (None when fine)."""
    if is_loopback(host) or auth_token:
        return None
    return (
        f"WARNING: serving on {host} without authentication; anyone who can reach this address can query "
        "the knowledge base. Set --auth-token (or LOOKUP_KNOWLEDGE_AUTH_TOKEN)."
    )


class BearerAuthMiddleware:
    """Requires ``Authorization: Bearer <token>`` on every HTTP request; 401 otherwise."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        supplied = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                supplied = value
                break
        # compare_digest takes time independent of where the strings differ.
        if not hmac.compare_digest(supplied, self._expected):
            body = b'{"error": "unauthorized: send Authorization: Bearer <token>"}'
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"www-authenticate", b'Bearer realm="lookup-knowledge-mcp"'),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
