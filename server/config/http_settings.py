"""The HTTP section of the settings: bind address, bearer tokens and their principals, limits."""

from __future__ import annotations

import hashlib
import re

from pydantic import Field, field_validator, model_validator

from server.config.sections import ENV_PREFIX, Section
from server.transport.host_names import split_host

# The bearer token for HTTP, read by the CLI (a variable of its own: it is not a settings key).
AUTH_TOKEN_ENV = f"{ENV_PREFIX}AUTH_TOKEN"
# The principal that http.auth_token authenticates.
DEFAULT_PRINCIPAL = "default"


def token_digest(token: str) -> str:
    """The hex SHA-256 of a bearer token, as http.clients stores it."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class HttpClient(Section):
    """One principal of the HTTP transports: a name and the SHA-256 of its bearer token."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="The principal's name; explicit session keys are kept apart per name.",
    )
    token_sha256: str = Field(
        pattern=r"^[0-9a-fA-F]{64}$",
        description="Hex SHA-256 of the client's bearer token (e.g. `printf %s TOKEN | sha256sum`).",
    )


# What a configured bearer token may be (an HTTP header value a request can carry back exactly).
_BEARER_TOKEN = re.compile(r"[\x21-\x7e]+")
BEARER_TOKEN_RULE = (
    "a bearer token is one or more visible ASCII characters, without spaces; "
    "to serve without one, leave it out rather than empty"
)


class HttpSettings(Section):
    host: str = Field(default="127.0.0.1", description="Bind address for HTTP transports.")
    port: int = Field(default=8765, ge=1, le=65535, description="Port for HTTP transports.")
    auth_token: str | None = Field(
        default=None,
        description="When set, HTTP requests may authenticate with 'Authorization: Bearer <token>' "
        f"as the principal named 'default' (env {AUTH_TOKEN_ENV}, --auth-token-file).",
    )
    clients: list[HttpClient] = Field(
        default_factory=list,
        description="Named HTTP clients, each with its own token (stored as a SHA-256 hex digest). "
        "When any client or auth_token is set, every HTTP request needs one of the tokens.",
    )
    allow_remote_session_keys: bool = Field(
        default=False,
        description="Without auth, honour explicit session keys (X-Session-Id, _meta.session_id) from "
        "non-loopback HTTP peers too. Off: such keys are refused, since anyone could name them.",
    )
    max_body_bytes: int = Field(default=1_000_000, ge=1024, description="Largest accepted request body.")
    allowed_hosts: list[str] = Field(
        default_factory=list, description="Extra Host values allowed by DNS-rebinding protection."
    )

    @field_validator("auth_token")
    @classmethod
    def _token_is_usable(cls, token: str | None) -> str | None:
        # An empty token used to mean "no authentication": `auth_token: ""`, or a variable set from
        # an unset shell variable, served openly when a token was meant. Surrounding whitespace
        # could never match, since a request's token is read without it.
        if token is not None and not _BEARER_TOKEN.fullmatch(token):
            raise ValueError(BEARER_TOKEN_RULE)
        return token

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts_can_match(cls, hosts: list[str]) -> list[str]:
        # Checked with the Host header's own parser: a value it cannot read would never match.
        malformed = [host for host in hosts if split_host(host)[0] is None]
        if malformed:
            shown = ", ".join(repr(host) for host in malformed)
            raise ValueError(f"not a host name or host:port (such as kb.example or kb.example:8443): {shown}")
        return hosts

    @model_validator(mode="after")
    def _principals_are_distinct(self) -> HttpSettings:
        names = [client.name for client in self.clients]
        digests = [client.token_sha256.lower() for client in self.clients]
        if self.auth_token:
            names.append(DEFAULT_PRINCIPAL)
            digests.append(token_digest(self.auth_token))
        for label, values in (("name", names), ("token", digests)):
            repeated = sorted({value for value in values if values.count(value) > 1})
            if repeated:
                shown = repeated if label == "name" else f"{len(repeated)} token(s)"
                raise ValueError(
                    f"http.clients: each client needs its own {label}; repeated: {shown} "
                    f"(http.auth_token is the client named {DEFAULT_PRINCIPAL!r})"
                )
        return self

    def principals(self) -> dict[str, str]:
        """Token SHA-256 hex digest -> principal name, for every configured client."""
        found = {client.token_sha256.lower(): client.name for client in self.clients}
        if self.auth_token:
            found[token_digest(self.auth_token)] = DEFAULT_PRINCIPAL
        return found
