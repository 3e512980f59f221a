"""Start-up and private state: an unusable data directory, file modes, an empty knowledge base.

Issue 14, findings 4, 5 and 10, through real server processes (stdio and streamable HTTP) and
the in-process client.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from tests.helpers import CLI, ROOT, free_port
from tests.wire import StdioPeer, server_env

EMPTY_KB = "the knowledge base is empty"


def _file(tmp_path: Path) -> Path:
    target = tmp_path / "data"
    target.write_text("not a directory\n", encoding="utf-8")
    return target


def _under_a_file(tmp_path: Path) -> Path:
    return _file(tmp_path) / "nested"


def _catalog_is_a_file(tmp_path: Path) -> Path:
    target = tmp_path / "data"
    target.mkdir()
    (target / "catalog").write_text("", encoding="utf-8")
    return target


def _read_only(tmp_path: Path) -> Path:
    if os.geteuid() == 0:
        pytest.skip("root writes into a mode 555 directory; the other cases cover the check")
    target = tmp_path / "data"
    target.mkdir()
    target.chmod(0o555)
    return target


def _log_is_a_directory(tmp_path: Path) -> Path:
    target = tmp_path / "data"
    (target / "log.sqlite").mkdir(parents=True)
    return target


def _log_is_not_a_database(tmp_path: Path) -> Path:
    target = tmp_path / "data"
    target.mkdir()
    (target / "log.sqlite").write_bytes(b"this is not an SQLite database\n" * 64)
    return target


UNUSABLE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "a file": (_file, "exists and is not a directory"),
    "under a file": (_under_a_file, "cannot create it: Not a directory"),
    "uncreatable subdirectory": (_catalog_is_a_file, "exists and is not a directory"),
    "read-only": (_read_only, "cannot write in it: Permission denied"),
    # Issue 34, weak 4: these were a 76-line traceback (stdio, exit 1) or "Application startup
    # failed" (HTTP, exit 3).
    "log.sqlite is a directory": (_log_is_a_directory, "'log.sqlite' is a directory, not a file"),
    "log.sqlite is not a database": (_log_is_not_a_database, "'log.sqlite' is not a usable SQLite database"),
}


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
@pytest.mark.parametrize("case", list(UNUSABLE))
def test_an_unusable_data_directory_stops_serve_with_one_line_and_exit_code_2(
    tmp_path: Path, case: str, transport: str
) -> None:
    make, cause = UNUSABLE[case]
    data_dir = make(tmp_path)
    args = [*CLI, "serve", "--transport", transport, "--port", str(free_port())]
    # stdin carries an initialize: the server must not sit on it silently.
    done = subprocess.run(
        args,
        env=server_env(data_dir),
        cwd=ROOT,
        input=b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}\n',
        capture_output=True,
        timeout=60,
    )
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2, done.stderr.decode()[-2000:]
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: data directory ")
    assert cause in lines[0]
    assert str(data_dir if case != "uncreatable subdirectory" else data_dir / "catalog") in lines[0]
    assert done.stdout == b""


@pytest.mark.slow
def test_state_is_private_and_an_empty_knowledge_base_is_an_error_naming_the_fix(tmp_path: Path) -> None:
    data_dir = tmp_path / "fresh" / "data"
    peer = StdioPeer(server_env(data_dir), tmp_path / "stderr")
    try:
        assert "result" in peer.initialize()
        peer.send(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "lookup_knowledge", "arguments": {"query": "ERR_TIMEOUT"}},
            }
        )
        reply = peer.receive(timeout=120)
    finally:
        peer.close()
    result = reply["result"]
    assert result["isError"] is True
    text = result["content"][0]["text"]
    # Issue 34, weak 8: the client learns how to fill it, not where the server keeps its data.
    assert EMPTY_KB in text and str(data_dir) not in text and str(tmp_path) not in text
    assert "lookup-knowledge-mcp ingest <dir> --data-dir <that directory>" in text
    warning = f"WARNING server.protocol.lifespan: {EMPTY_KB}"
    stderr = (tmp_path / "stderr").read_text()
    assert stderr.count(warning) == 1  # said once at start-up, with the path
    assert f"--data-dir {data_dir}" in stderr

    # finding 5: the data directory is 0700 and nothing in it is readable by group or others.
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    created = list(data_dir.rglob("*"))
    names = {p.name for p in created}
    assert "log.sqlite" in names and any(
        p.suffix == ".sqlite" and p.parent.name == "catalog" for p in created
    )
    assert any("milvus" in p.name for p in created), names
    for path in created:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} has mode {mode:o}"
        if path.is_file():
            assert mode == 0o600, f"{path} has mode {mode:o}"


async def test_every_tool_and_the_map_say_the_knowledge_base_is_empty(
    tmp_path: Path, e5_embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from server.config.loading import load_settings
    from server.protocol.app import app_resources, create_server

    data_dir = tmp_path / "empty"
    server = create_server(app_resources(load_settings(None, data_dir=data_dir), embedder=e5_embedder))
    caplog.set_level(logging.WARNING)
    with anyio.fail_after(120):
        async with Client(server, mode="legacy") as client:
            lookups = [
                await client.call_tool("lookup_knowledge", {"query": query})
                for query in ("ERR_TIMEOUT", "webhook retries", "连接池")
            ]
            domains = await client.call_tool("list_knowledge_domains", {})
            knowledge_map = (await client.read_resource("knowledge://map")).contents[0].text
    for result in lookups:
        assert result.is_error  # never NO_MATCH
        assert EMPTY_KB in result.content[0].text and str(tmp_path) not in result.content[0].text
    assert domains.structured_content is not None
    assert domains.structured_content["empty"] is True
    assert "lookup-knowledge-mcp ingest" in domains.structured_content["message"]
    assert str(tmp_path) not in json.dumps(domains.structured_content)
    assert '"empty": true' in knowledge_map and str(tmp_path) not in knowledge_map
    warnings = [r for r in caplog.records if EMPTY_KB in r.getMessage()]
    assert len(warnings) == 1


async def test_a_knowledge_base_with_documents_is_not_reported_empty(make_server: Any) -> None:
    async with Client(make_server(), mode="legacy") as client:
        with anyio.fail_after(120):
            domains = await client.call_tool("list_knowledge_domains", {})
    assert domains.structured_content is not None
    assert domains.structured_content["empty"] is False and domains.structured_content["message"] is None
