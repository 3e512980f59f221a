"""Set one entry of a YAML config file in place, keeping the rest of its text and its comments.

``calibrate --write`` used to load the file and dump it again, which dropped every comment
(116 lines of them in config.example.yaml). Here only the text of the entry itself is written
anew: PyYAML's node tree gives where each entry starts and ends, and everything outside that
span is left as it was. The result is loaded back and checked before it is returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode


class YamlEntryError(ValueError):
    """The entry cannot be set without rewriting text it does not own."""


def set_entry(text: str, path: Sequence[str], value: Any) -> str:
    """``text`` with the mapping entry at ``path`` set to ``value``.

    An existing entry's text is replaced; a missing one is added at the end of its deepest
    existing parent. Only block-style parents are edited in place.
    """
    if not path:
        raise YamlEntryError("an entry needs a path of at least one key")
    root = yaml.compose(text)
    if root is None:
        return _checked(
            text.rstrip("\n") + ("\n" if text.strip() else "") + _block(path, value, 0), path, value
        )
    node = root
    for depth, key in enumerate(path):
        if not isinstance(node, MappingNode) or node.flow_style:
            raise YamlEntryError(f"{'.'.join(path[:depth]) or 'the file'} is not a block mapping")
        found = next(((k, v) for k, v in node.value if isinstance(k, ScalarNode) and k.value == key), None)
        if found is None:
            return _checked(_append(text, node, path[depth:], value), path, value)
        if depth == len(path) - 1:
            return _checked(_replace(text, found, value), path, value)
        node = found[1]
    raise AssertionError("unreachable: the loop returns at the last key")


def _replace(text: str, entry: tuple[Node, Node], value: Any) -> str:
    key, old = entry
    start, end = key.start_mark.index, _last_leaf(old).end_mark.index
    return text[:start] + _block([key.value], value, key.start_mark.column).lstrip(" ") + text[end:]


def _append(text: str, parent: MappingNode, rest: Sequence[str], value: Any) -> str:
    if not parent.value:
        raise YamlEntryError("cannot add to an empty mapping in place")
    column = parent.value[0][0].start_mark.column
    # After the whole line of the parent's last value, so a comment ending that line stays on it.
    end = text.find("\n", _last_leaf(parent).end_mark.index)
    end = len(text) if end < 0 else end
    return text[:end] + "\n" + _block(rest, value, column) + text[end:]


def _block(path: Sequence[str], value: Any, column: int) -> str:
    """``path: value`` as block YAML, every line indented by ``column``, no trailing newline."""
    nested: Any = value
    for key in reversed(path):
        nested = {key: nested}
    dumped = yaml.safe_dump(nested, allow_unicode=True, sort_keys=False, default_flow_style=False)
    return "\n".join(" " * column + line for line in dumped.rstrip("\n").split("\n"))


def _last_leaf(node: Node) -> Node:
    """The node whose text ends a value: its last scalar, not the start of what follows it."""
    while isinstance(node, MappingNode | SequenceNode) and node.value and not node.flow_style:
        last = node.value[-1]
        node = last[1] if isinstance(node, MappingNode) else last
    return node


def _checked(text: str, path: Sequence[str], value: Any) -> str:
    data = yaml.safe_load(text)
    for key in path:
        data = data.get(key) if isinstance(data, dict) else None
    if data != value:
        raise YamlEntryError(f"setting {'.'.join(path)} would not round-trip; the file was not changed")
    return text
