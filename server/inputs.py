"""The types of every argument a caller sends: MCP tools, the CLI and replayed traces share them.

Each type carries its limits and checks once; ``parse`` applies one outside pydantic models
(the CLI), with the same message an MCP client would get.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, TypeAdapter, ValidationError

from retrieval.requests import TOP_K_MAX, TOP_K_MIN
from storage.text import Language

_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")

# The longest value of each argument that the invocation log keeps.
LOGGED_ARGUMENT_LIMITS = {"query": 2000, "domain": 128, "missing_dimension": 500}


class InputError(ValueError):
    """An argument failed its checks; the message names the argument and the problem."""


def _no_bad_characters(value: str, field: str) -> str:
    for position, char in enumerate(value):
        code = ord(char)
        if (code < 0x20 and char not in "\t\n\r") or 0x7F <= code < 0xA0:
            raise ValueError(f"{field} contains control character U+{code:04X} at position {position}")
    return value


def _no_lone_surrogate(field: str) -> Callable[[Any], Any]:
    # Runs before pydantic's str check, whose error for a lone surrogate does not say where it is.
    def check(value: Any) -> Any:
        if isinstance(value, str) and (found := _LONE_SURROGATE.search(value)):
            code = ord(found.group())
            raise ValueError(f"{field} contains a lone surrogate (U+{code:04X}) at position {found.start()}")
        return value

    return check


def _text(field: str) -> Callable[[str | None], str | None]:
    def check(value: str | None) -> str | None:
        return None if value is None else _no_bad_characters(value, field)

    return check


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("query must not be blank")
    # Only punctuation or symbols ("???", an emoji): no term for the lexical search, and the
    # vectors of such text sit near everything, so it came back as REFERENCE with three documents.
    if not any(character.isalnum() for character in value):
        raise ValueError("query has no word to look up: it needs at least one letter or digit")
    return value


Query = Annotated[
    str,
    Field(
        min_length=1,
        max_length=LOGGED_ARGUMENT_LIMITS["query"],
        description=f"What you need to know, 1-{LOGGED_ARGUMENT_LIMITS['query']} characters.",
    ),
    AfterValidator(_not_blank),
    AfterValidator(_text("query")),
    BeforeValidator(_no_lone_surrogate("query")),
]
Domain = Annotated[
    str | None,
    Field(
        default=None,
        max_length=LOGGED_ARGUMENT_LIMITS["domain"],
        description="Restrict to one domain of knowledge://map.",
    ),
    AfterValidator(_text("domain")),
    BeforeValidator(_no_lone_surrogate("domain")),
]
TopK = Annotated[
    int,
    Field(
        ge=TOP_K_MIN,
        le=TOP_K_MAX,
        strict=True,
        description=f"Documents to return at most ({TOP_K_MIN}-{TOP_K_MAX}).",
    ),
]
MissingDimension = Annotated[
    str | None,
    Field(
        default=None,
        max_length=LOGGED_ARGUMENT_LIMITS["missing_dimension"],
        description=(
            "The aspect you still lack after earlier results, named so it stands on its own (for "
            "example 'Kafka consumer retry policy', not 'the steps'); a targeted lookup is ranked by it."
        ),
    ),
    AfterValidator(_text("missing_dimension")),
    BeforeValidator(_no_lone_surrogate("missing_dimension")),
]
DocKey = Annotated[
    str,
    Field(min_length=1, max_length=2048, description="doc_key of a document, as a lookup result gives it."),
    AfterValidator(_text("doc_key")),
    BeforeValidator(_no_lone_surrogate("doc_key")),
]
SectionName = Annotated[
    str | None,
    Field(
        default=None,
        max_length=500,
        description="A section heading (or part of it) from the result's sections; omit for the whole document.",
    ),
    AfterValidator(_text("section")),
    BeforeValidator(_no_lone_surrogate("section")),
]
PromptLanguage = Language


def parse(kind: Any, value: Any, name: str) -> Any:
    """``value`` checked as ``kind`` (one of the types above); InputError names ``name`` on failure."""
    try:
        return TypeAdapter(kind).validate_python(value)
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        # Numbers are echoed (short, and the mistake is in them); text could be 2000 characters.
        got = f", got {value}" if isinstance(value, int) else ""
        raise InputError(f"{name}: {problem}{got}") from None
