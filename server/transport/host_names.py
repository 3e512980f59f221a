"""Host names as Host and Origin headers and ``http.allowed_hosts`` write them, parsed strictly.

The settings check ``http.allowed_hosts`` with the parser the DNS-rebinding guard matches requests
with, so a value the guard could never match is refused when the settings load.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def split_host(value: str) -> tuple[str | None, int | None]:
    """``name[:port]`` (IPv6 in brackets) as (lowercase name, port); (None, None) when malformed."""
    try:
        parts = urlsplit("//" + value.strip())
        port = parts.port  # raises ValueError for "8791.evil"
    except ValueError:
        return None, None
    if parts.username is not None or parts.password is not None or parts.path or parts.query:
        return None, None
    return parts.hostname, port


def origin_host(value: str) -> tuple[str | None, int | None]:
    """``scheme://name[:port]`` as (name, port); (None, None) for anything else (paths, userinfo, null)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None, None
    if parts.scheme not in ("http", "https") or parts.username is not None or parts.password is not None:
        return None, None
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return None, None
    return parts.hostname, port
