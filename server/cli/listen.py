"""The HTTP transports' listening sockets, bound before anything says "serving".

Left to itself uvicorn binds after the app's lifespan has started: a port in use then shows as
uvicorn's own ``ERROR: [Errno 98] ...`` and exit code 3, after this server has logged its URL.
Binding here first makes it one ``error:`` line and exit code 2, as every other start-up
problem is, and the sockets are handed to uvicorn.
"""

from __future__ import annotations

import errno
import socket
from typing import Any


class BindError(RuntimeError):
    """The HTTP address cannot be listened on; the message names it and the cause."""


def address_text(host: str, port: int) -> str:
    """``host:port``, with an IPv6 address in brackets as a URL needs it."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def bind_listeners(host: str, port: int) -> list[socket.socket]:
    """Listening sockets on every address ``host`` resolves to, as asyncio's create_server opens them."""
    if not host:
        # bind("") would mean every interface: too much to infer from an empty value.
        raise BindError(
            "http.host (--host) is empty: name the address to listen on, "
            "e.g. 127.0.0.1, or 0.0.0.0 for every interface"
        )
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        return _listen_all(list(dict.fromkeys((info[0], info[4]) for info in infos)))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise BindError(f"cannot bind {address_text(host, port)}: {reason[:1].lower()}{reason[1:]}") from exc


def _listen_all(addresses: list[tuple[socket.AddressFamily, Any]]) -> list[socket.socket]:
    listeners: list[socket.socket] = []
    unavailable: OSError | None = None
    try:
        for family, address in addresses:
            try:
                listeners.append(_listen(family, address))
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise
                # As asyncio does (bpo-30945): a family the host has disabled (often ::1 of
                # "localhost") is skipped; it fails the start only if nothing else is bound.
                unavailable = exc
    except OSError:
        for sock in listeners:
            sock.close()
        raise
    if not listeners and unavailable is not None:
        raise unavailable
    return listeners


def _listen(family: socket.AddressFamily, address: Any) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # As asyncio and uvicorn do: a port a previous run left in TIME_WAIT is usable at once.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            # One socket per family: "::" must not also take the IPv4 port bound beside it.
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        # Listen now, not when uvicorn starts: on Linux two SO_REUSEADDR sockets can both bind
        # one port while neither listens, so only listen() settles who has it.
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock
