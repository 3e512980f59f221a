"""mcp.json at the repository root works as given."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters

from server.config.http_settings import HttpSettings
from tests.helpers import ROOT, cli_env

pytestmark = pytest.mark.slow


def _config() -> dict:
    return json.loads((ROOT / "mcp.json").read_text(encoding="utf-8"))["mcpServers"]


async def test_stdio_entry_starts_a_working_server(data_dir: Path, tmp_path: Path) -> None:
    entry = _config()["lookup-knowledge"]
    assert set(entry) == {"command", "args", "env"}
    # As an installed client would: the console script on PATH, started from an unrelated directory.
    # The entry's own variables over the test's data directory (and Milvus target, on a server run).
    env = cli_env(data_dir, **entry["env"])
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    params = StdioServerParameters(command=entry["command"], args=entry["args"], env=env, cwd=str(tmp_path))
    with anyio.fail_after(120):
        async with Client(params, mode="legacy") as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            result = await client.call_tool("lookup_knowledge", {"query": "ERR_TIMEOUT 是什么"})
    assert "lookup_knowledge" in tools
    assert result.structured_content["relevance_level"] == "PRECISE"


def test_http_entry_points_at_the_default_bind_address() -> None:
    entry = _config()["lookup-knowledge-http"]
    defaults = HttpSettings()
    assert entry == {"type": "http", "url": f"http://{defaults.host}:{defaults.port}/mcp"}
