"""The layout rules, checked on the source: layers, cycles, function and module length, private SDK
use, and the folders of server/ (the MCP surface, the transports, the composition root).

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
# The function-size rule also holds outside the layers, for the benchmarks.
SIZED_PACKAGES = (*LAYERS, "bench")
# The one module allowed to reach into the SDK's private attributes (and to silence mypy).
SDK_ADAPTER = "server.protocol.sdk"
PRIVATE_SDK_ATTRIBUTES = {"_lowlevel_server", "_connection"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(packages: tuple[str, ...]) -> dict[str, ast.Module]:
    return {
        _module_name(path): ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for package in packages
        for path in sorted((ROOT / package).rglob("*.py"))
    }


MODULES = _modules(tuple(LAYERS))
SIZED_MODULES = _modules(SIZED_PACKAGES)


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
    assert {m.split(".")[0] for m in SIZED_MODULES} == set(SIZED_PACKAGES)
    assert "bench.report" in SIZED_MODULES


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


def _sdk_imports(tree: ast.Module) -> list[str]:
    """The modules of the MCP SDK (``mcp``, ``mcp_types``) that a module's code imports."""
    names = [
        name
        for node in ast.walk(tree)
        for name in (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
    ]
    return [n for n in names if n.split(".")[0] in {"mcp", "mcp_types"}]


@pytest.mark.parametrize("layer", ["retrieval", "storage"])
def test_retrieval_and_storage_never_import_mcp(layer: str) -> None:
    offenders = []
    for module, tree in MODULES.items():
        if module.startswith(layer + "."):
            offenders += [f"{module}: {n}" for n in _sdk_imports(tree)]
    assert offenders == []


def test_no_function_is_longer_than_sixty_lines() -> None:
    long = sorted(
        f"{module}.{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for module, tree in SIZED_MODULES.items()
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


# The folders of server/: the MCP surface (protocol/) and the transports with their hardening
# (transport/). A transport carries requests to the surface without knowing its handlers; the
# surface reads what a request carried (principal, peer) and marks it recorded for the guard, but
# never picks a transport: the CLI does.
SURFACE = "server.protocol."
TRANSPORT = "server.transport."
# What a transport may use of the surface: the SDK adapter and the resources it serves.
SURFACE_FOR_TRANSPORTS = {"server.protocol.sdk", "server.protocol.lifespan"}
# The surface's only ways into transport/: the app factory installs the request guard, the
# recorder reads the request's principal and peer and tells the guard the call is logged, and the
# session resolver asks whether a peer is loopback.
TRANSPORT_FOR_SURFACE = {
    "server.protocol.app": {"server.transport.request_guard"},
    "server.protocol.recorder": {"server.transport.http_security", "server.transport.request_guard"},
    "server.protocol.session": {"server.transport.http_security"},
}
# The transports themselves, which only the command line starts.
TRANSPORT_ENTRIES = {"server.transport.http_app", "server.transport.stdio"}
# The modules that import the MCP SDK: the surface, the transports, and replay (an in-process client).
SDK_IMPORTERS = (SURFACE, TRANSPORT, "server.cli.replay")
# The composition root, the one place that builds the retrieval stack from the settings.
COMPOSITION_ROOT = "server.container"
WIRED_IN_THE_ROOT = {
    "KnowledgeEngine",
    "LookupService",
    "MilvusVectorStore",
    "SharedCatalog",
    "Ingestor",
    "ActionMemory",
}
MAX_MODULE_LINES = 400


def _edges(source: str, target: str) -> list[str]:
    return sorted(
        f"{module} -> {imported}"
        for module, imported_set in GRAPH.items()
        if module.startswith(source)
        for imported in imported_set
        if imported.startswith(target)
    )


def test_the_folder_rules_see_the_known_edges() -> None:
    # Guards the folder checks against passing on renamed or missing modules.
    assert SURFACE_FOR_TRANSPORTS | set(TRANSPORT_FOR_SURFACE) | TRANSPORT_ENTRIES <= set(MODULES)
    assert all(targets <= set(MODULES) for targets in TRANSPORT_FOR_SURFACE.values())
    assert "server.transport.request_guard" in GRAPH["server.protocol.app"]
    assert "server.transport.http_app" in GRAPH["server.cli.serve"]
    assert COMPOSITION_ROOT in GRAPH["server.protocol.lifespan"]


def test_transports_use_only_the_sdk_adapter_and_the_resources_of_the_surface() -> None:
    beyond = [
        edge for edge in _edges(TRANSPORT, SURFACE) if edge.split(" -> ")[1] not in SURFACE_FOR_TRANSPORTS
    ]
    assert beyond == []


def test_transports_never_import_retrieval_or_storage() -> None:
    assert _edges(TRANSPORT, "retrieval.") + _edges(TRANSPORT, "storage.") == []


def test_the_surface_reaches_transport_only_where_a_request_needs_it() -> None:
    beyond = [
        edge
        for edge in _edges(SURFACE, TRANSPORT)
        if edge.split(" -> ")[1] not in TRANSPORT_FOR_SURFACE.get(edge.split(" -> ")[0], set())
    ]
    assert beyond == []


def test_only_the_command_line_starts_a_transport() -> None:
    starters = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets & TRANSPORT_ENTRIES
        if not module.startswith("server.cli.")
    ]
    assert starters == []


def test_only_the_surface_the_transports_and_replay_import_the_sdk() -> None:
    importers = []
    for module, tree in MODULES.items():
        if _sdk_imports(tree):
            importers.append(module)
    assert importers, "the walk found no SDK import at all"
    assert sorted({m for m in importers if not m.startswith(SDK_IMPORTERS)}) == []


def test_the_retrieval_stack_is_built_only_in_the_composition_root() -> None:
    builders = sorted(
        f"{module}: {node.func.id}"
        for module, tree in MODULES.items()
        if module.startswith("server.") and module != COMPOSITION_ROOT
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in WIRED_IN_THE_ROOT
    )
    assert builders == []
    root_calls = {
        node.func.id
        for node in ast.walk(MODULES[COMPOSITION_ROOT])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    }
    assert root_calls >= WIRED_IN_THE_ROOT


def test_no_product_module_is_longer_than_four_hundred_lines() -> None:
    lengths = {
        _module_name(path): len(path.read_text(encoding="utf-8").splitlines())
        for layer in LAYERS
        for path in (ROOT / layer).rglob("*.py")
    }
    long = sorted(f"{m}: {n} lines" for m, n in lengths.items() if n > MAX_MODULE_LINES)
    assert long == []
