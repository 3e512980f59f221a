"""The layout rules, checked on the source: layers, cycles, function length, private SDK use.

The import graph counts every import statement, including those inside functions: an import
deferred for start-up speed still ties two modules together.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Lower layers never import higher ones: server -> retrieval -> storage.
LAYERS = {"storage": 0, "retrieval": 1, "server": 2}
MAX_FUNCTION_LINES = 60
# The one module allowed to reach into the SDK's private attributes (and to silence mypy).
SDK_ADAPTER = "server.protocol.sdk"
PRIVATE_SDK_ATTRIBUTES = {"_lowlevel_server", "_connection"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, ast.Module]:
    return {
        _module_name(path): ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for layer in LAYERS
        for path in sorted((ROOT / layer).rglob("*.py"))
    }


MODULES = _modules()


def _imports(module: str, tree: ast.Module) -> Iterator[str]:
    """The project modules that ``module`` imports, anywhere in its body."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from server.protocol import prompt_texts` imports the module server.protocol.prompt_texts.
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        yield from (name for name in names if name in MODULES and name != module)


GRAPH = {module: set(_imports(module, tree)) for module, tree in MODULES.items()}


def _layer(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def test_the_walk_sees_every_layer_and_the_known_edges() -> None:
    # Guards the checks below against passing on an empty or misread graph.
    assert {m.split(".")[0] for m in MODULES} == set(LAYERS)
    assert "retrieval.engine" in GRAPH["server.container"]
    assert "storage.catalog" in GRAPH["retrieval.engine"]
    assert "server.protocol.prompt_texts" in GRAPH["server.protocol.prompts"]


def test_no_module_imports_a_layer_above_it() -> None:
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if _layer(target) > _layer(module)
    )
    assert upward == []


def _cycle_from(start: str) -> list[str] | None:
    """A path start -> ... -> start in GRAPH, if one exists (depth-first)."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        module, path = stack.pop()
        for target in GRAPH[module]:
            if target == start:
                return [*path, start]
            if target not in seen:
                seen.add(target)
                stack.append((target, [*path, target]))
    return None


def test_the_import_graph_has_no_cycle() -> None:
    cycles = [" -> ".join(cycle) for module in sorted(GRAPH) if (cycle := _cycle_from(module))]
    assert cycles == []


def test_a_cycle_is_found_when_there_is_one() -> None:
    GRAPH["storage.text"].add("storage.catalog")
    try:
        assert _cycle_from("storage.text") is not None
    finally:
        GRAPH["storage.text"].discard("storage.catalog")


@pytest.mark.parametrize("layer", ["retrieval", "storage"])
def test_retrieval_and_storage_never_import_mcp(layer: str) -> None:
    offenders = []
    for module, tree in MODULES.items():
        if module.startswith(layer + "."):
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                offenders += [f"{module}: {n}" for n in names if n.split(".")[0] in {"mcp", "mcp_types"}]
    assert offenders == []


def test_no_function_is_longer_than_sixty_lines() -> None:
    long = sorted(
        f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for module, tree in MODULES.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    )
    assert long == []


def test_private_sdk_attributes_and_type_ignores_stay_in_the_adapter() -> None:
    offenders = []
    for module, tree in MODULES.items():
        # Only server/ imports the SDK (the test above); storage has a _connection of its own.
        if module == SDK_ADAPTER or not module.startswith("server."):
            continue
        for node in ast.walk(tree):
            named = node.attr if isinstance(node, ast.Attribute) else getattr(node, "value", None)
            if isinstance(named, str) and named in PRIVATE_SDK_ATTRIBUTES:
                offenders.append(f"{module}: {named}")
    for path in sorted(p for layer in LAYERS for p in (ROOT / layer).rglob("*.py")):
        if _module_name(path) != SDK_ADAPTER and "type: ignore" in path.read_text(encoding="utf-8"):
            offenders.append(f"{_module_name(path)}: type: ignore")
    assert offenders == []
