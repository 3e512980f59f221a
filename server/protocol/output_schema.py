"""Tool output schemas as listed: every definition written where it is used, optional fields as type lists.

A client checks each structured result against the tool's output schema. The MCP Python SDK's
client does it with ``jsonschema``, where each ``$ref`` is a lookup through ``referencing`` on
every call. On a lookup's DEDUPED result, measured in the client beside an in-process server at
10k chunks (2 cores), the check took 0.56 ms with pydantic's ``$defs`` and 0.39 ms inlined, and
the whole repeated call went from 3.51 to 3.30 ms. Clients with weak ``$ref`` support read the
inlined form too. The schema accepts exactly the same documents; only its layout changes.

An optional field is published the same way: pydantic writes ``anyOf: [X, {type: null}]``, and
``jsonschema`` descends into both branches (building an error for the branch that fails) where
``type: [X's type, "null"]`` is one type check. On 40 lookup results at 10k chunks the client's
check went from 316-329 to 272 us (median per result; 2 cores).
"""

from __future__ import annotations

from typing import Any

_LOCAL_DEFS = "#/$defs/"


def published(schema: dict[str, Any]) -> dict[str, Any]:
    """The form a tool's output schema is listed in: definitions inlined, optional fields merged."""
    merged: dict[str, Any] = merge_nullable(inline_definitions(schema))
    return merged


def inline_definitions(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with each local ``$ref`` replaced by its definition and ``$defs`` dropped.

    Keywords beside a ``$ref`` (a description, a default) are kept and win over the
    definition's own. A recursive definition cannot be written out, so it raises ValueError,
    as does a reference outside ``#/$defs/``.
    """
    definitions = schema.get("$defs", {})
    root = {key: value for key, value in schema.items() if key != "$defs"}
    inlined: dict[str, Any] = _inline(root, definitions, ())
    return inlined


def _inline(node: Any, definitions: dict[str, Any], expanding: tuple[str, ...]) -> Any:
    if isinstance(node, list):
        return [_inline(item, definitions, expanding) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if ref is None:
        return {key: _inline(value, definitions, expanding) for key, value in node.items()}
    name = ref.removeprefix(_LOCAL_DEFS) if isinstance(ref, str) else None
    if name is None or name == ref or name not in definitions:
        raise ValueError(
            f"cannot inline the reference {ref!r}: only local #/$defs/ definitions are supported"
        )
    if name in expanding:
        raise ValueError(f"cannot inline the recursive definition {name!r}")
    definition = _inline(definitions[name], definitions, (*expanding, name))
    siblings = {key: _inline(value, definitions, expanding) for key, value in node.items() if key != "$ref"}
    return {**definition, **siblings}


_NULL = {"type": "null"}
# Keywords that constrain every instance type, null included: a branch with any of them cannot
# take null into its own ``type`` without changing what it accepts.
_ANY_TYPE_KEYWORDS = frozenset({"const", "not", "allOf", "anyOf", "oneOf", "if", "then", "else", "$ref"})


def merge_nullable(node: Any) -> Any:
    """``node`` with each ``anyOf: [X, {type: null}]`` written as X with ``"null"`` added to its type.

    Only where that accepts exactly the same documents: X has one ``type`` and no keyword that
    applies to every type (an ``enum`` gets null added, as the null branch would accept it).
    Keywords beside the ``anyOf`` (a default, a description) are kept and win, as when inlining.
    """
    if isinstance(node, list):
        return [merge_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: merge_nullable(value) for key, value in node.items()}
    branch = _nullable_branch(node.get("anyOf"))
    if branch is None:
        return node
    merged = {**branch, "type": [branch["type"], "null"]}
    if "enum" in branch and None not in branch["enum"]:
        merged["enum"] = [*branch["enum"], None]
    return {**merged, **{key: value for key, value in node.items() if key != "anyOf"}}


def _nullable_branch(alternatives: Any) -> dict[str, Any] | None:
    """X of ``[X, {type: null}]`` (either order) when X can absorb null, else None."""
    if not isinstance(alternatives, list) or len(alternatives) != 2 or _NULL not in alternatives:
        return None
    branch = alternatives[1] if alternatives[0] == _NULL else alternatives[0]
    if not isinstance(branch, dict) or not isinstance(branch.get("type"), str) or branch["type"] == "null":
        return None
    if _ANY_TYPE_KEYWORDS & branch.keys():
        return None
    return branch
