"""Shared fixtures: the real e5 model, a once-ingested copy of the sample knowledge base, servers.

Ingesting the sample knowledge base with the real model takes ~20 s, so it happens once per
test session into a template directory; every test that needs state gets its own copy (a
Milvus Lite file can be opened by one process at a time, and tests must not share memory).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_KB = ROOT / "examples" / "knowledge"
PYTHON = sys.executable


@pytest.fixture(scope="session")
def e5_embedder() -> Any:
    """The real bundled multilingual-e5-small, loaded once."""
    from retrieval.embedders import CachedEmbedder, create_embedder

    return CachedEmbedder(create_embedder("e5-small"), size=4096)


@pytest.fixture(scope="session")
def sample_template(tmp_path_factory: pytest.TempPathFactory, e5_embedder: Any) -> Path:
    """A data directory holding the ingested sample knowledge base (do not modify: copy it)."""
    from server.runtime import open_runtime
    from server.settings import load_settings

    data_dir = tmp_path_factory.mktemp("sample-template")
    settings = load_settings(None, data_dir=data_dir)
    runtime = open_runtime(settings, embedder=e5_embedder)
    try:
        report = runtime.ingestor().run(SAMPLE_KB)
    finally:
        runtime.close()
    assert not report.failed, report.failed
    return data_dir


@pytest.fixture
def data_dir(tmp_path: Path, sample_template: Path) -> Path:
    """A private, writable copy of the ingested sample knowledge base."""
    target = tmp_path / "data"
    shutil.copytree(sample_template, target)
    return target


@pytest.fixture
def make_settings(data_dir: Path) -> Callable[..., Any]:
    """Settings over this test's data directory, with optional overrides."""
    from server.settings import load_settings

    def make(config_path: Path | None = None, **overrides: Any) -> Any:
        return load_settings(config_path, **{"data_dir": data_dir, **overrides})

    return make


@pytest.fixture
def make_server(make_settings: Callable[..., Any], e5_embedder: Any) -> Callable[..., Any]:
    """An MCPServer over this test's data directory, sharing the session's loaded model."""
    from server.app import create_server

    def make(config_path: Path | None = None, **kwargs: Any) -> Any:
        overrides = kwargs.pop("overrides", {})
        settings = make_settings(config_path, **overrides)
        return create_server(
            settings,
            config_path=config_path,
            overrides={"data_dir": settings.data_dir, **overrides},
            embedder=kwargs.pop("embedder", e5_embedder),
            **kwargs,
        )

    return make


@pytest.fixture
def server_env(data_dir: Path) -> Iterator[dict[str, str]]:
    """Environment for a server subprocess over this test's data directory."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOKUP_KNOWLEDGE_")}
    env["LOOKUP_KNOWLEDGE_DATA_DIR"] = str(data_dir)
    yield env
