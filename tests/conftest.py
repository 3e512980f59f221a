"""Shared fixtures: the real e5 model, a once-ingested copy of the sample knowledge base, servers.

Ingesting the sample knowledge base with the real model takes ~20 s, so it happens once per
test session into a template directory; every test that needs state gets its own copy (tests
must not share memory or documents). With ``--milvus-server`` the same tests run against a real
Milvus server, each with its own collection prefix (see tests/milvus_target.py).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests import milvus_target

if TYPE_CHECKING:
    from server.config.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_KB = ROOT / "examples" / "knowledge"
PYTHON = sys.executable


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--milvus-server",
        action="store_true",
        help="start Milvus 2.3.5 standalone for the session and run against it instead of Milvus Lite "
        f"(or set {milvus_target.TEST_URI_VAR} to a running server)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "lite_only: about the Milvus Lite file itself; skipped on a server")


@pytest.fixture(scope="session")
def milvus_server_uri(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str | None]:
    """The Milvus server of this run (None: Milvus Lite); started here and stopped at the end."""
    import os

    given = os.environ.get(milvus_target.TEST_URI_VAR)
    if given:
        yield given
        return
    if not request.config.getoption("--milvus-server"):
        yield None
        return
    from tests.milvus_server import start, stop

    data = tmp_path_factory.mktemp("milvus-server")
    server = start(data)
    try:
        yield server.uri
    finally:
        stop(data)


@pytest.fixture(autouse=True)
def milvus_prefix(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, milvus_server_uri: str | None
) -> Iterator[str | None]:
    """On a server: this test's own collection prefix, in the environment settings read."""
    monkeypatch.delenv(milvus_target.URI_VAR, raising=False)
    monkeypatch.delenv(milvus_target.PREFIX_VAR, raising=False)
    if milvus_server_uri is None:
        yield None
        return
    if request.node.get_closest_marker("lite_only"):
        pytest.skip("about the Milvus Lite file; this run targets a Milvus server")
    prefix = milvus_target.prefix_for(request.node.nodeid)
    monkeypatch.setenv(milvus_target.URI_VAR, milvus_server_uri)
    monkeypatch.setenv(milvus_target.PREFIX_VAR, prefix)
    milvus_target.drop_prefixed(milvus_server_uri, prefix)
    yield prefix
    milvus_target.drop_prefixed(milvus_server_uri, prefix)


@pytest.fixture
def no_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """No LOOKUP_KNOWLEDGE_ variable of the outer environment reaches the settings this test loads."""
    import os

    from server.config.sections import ENV_PREFIX

    for name in os.environ:
        if name.startswith(ENV_PREFIX):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def e5_embedder() -> Any:
    """The real bundled multilingual-e5-small, loaded once."""
    from retrieval.embedders import CachedEmbedder, create_embedder

    return CachedEmbedder(create_embedder("e5-small"), size=4096)


@pytest.fixture(scope="session")
def sample_template(
    tmp_path_factory: pytest.TempPathFactory, e5_embedder: Any, milvus_server_uri: str | None
) -> Path:
    """A data directory holding the ingested sample knowledge base (do not modify: copy it)."""
    from tests.helpers import ingest_into

    data_dir = tmp_path_factory.mktemp("sample-template")
    ingest_into(data_dir, SAMPLE_KB, e5_embedder, milvus=_template_milvus(milvus_server_uri))
    return data_dir


def _template_milvus(uri: str | None) -> dict[str, Any] | None:
    if uri is None:
        return None
    import os

    return {"uri": uri, "collection_prefix": f"tpl_{os.getpid()}"}


@pytest.fixture
def data_dir(
    tmp_path: Path,
    sample_template: Path,
    milvus_server_uri: str | None,
    milvus_prefix: str | None,
    e5_embedder: Any,
) -> Path:
    """A private, writable copy of the ingested sample knowledge base."""
    target = tmp_path / "data"
    if milvus_server_uri is None or milvus_prefix is None:
        shutil.copytree(sample_template, target)
        return target
    template = _template_milvus(milvus_server_uri)
    assert template is not None
    return milvus_target.clone_data_dir(
        sample_template,
        target,
        uri=milvus_server_uri,
        source_prefix=template["collection_prefix"],
        prefix=milvus_prefix,
        embedder=e5_embedder,
    )


@pytest.fixture
def make_settings(data_dir: Path) -> Callable[..., Any]:
    """Settings over this test's data directory, with optional overrides."""
    from server.config.loading import load_settings

    def make(config_path: Path | None = None, **overrides: Any) -> Any:
        return load_settings(config_path, **{"data_dir": data_dir, **overrides})

    return make


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """Settings over an empty data directory (no knowledge base ingested, no overrides)."""
    from server.config.loading import load_settings

    return load_settings(None, data_dir=tmp_path)


@pytest.fixture
def make_resources(make_settings: Callable[..., Any], e5_embedder: Any) -> Callable[..., Any]:
    """A server's resources over this test's data directory, sharing the session's loaded model."""
    from server.protocol.app import app_resources

    def make(config_path: Path | None = None, **kwargs: Any) -> Any:
        overrides = kwargs.pop("overrides", {})
        settings = make_settings(config_path, **overrides)
        return app_resources(
            settings,
            config_path=config_path,
            overrides={"data_dir": settings.data_dir, **overrides},
            embedder=kwargs.pop("embedder", e5_embedder),
            **kwargs,
        )

    return make


@pytest.fixture
def make_server(make_resources: Callable[..., Any]) -> Callable[..., Any]:
    """An MCPServer over this test's data directory (make_resources' arguments)."""
    from server.protocol.app import create_server

    def make(config_path: Path | None = None, **kwargs: Any) -> Any:
        return create_server(make_resources(config_path, **kwargs))

    return make


@pytest.fixture
def server_env(data_dir: Path) -> dict[str, str]:
    """Environment for a server subprocess over this test's data directory (tests.helpers.cli_env)."""
    from tests.helpers import cli_env

    return cli_env(data_dir)
