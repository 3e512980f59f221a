"""Helpers shared by the tests: servers as real subprocesses, an event-loop ticker, an ingested data directory."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import anyio

from server.config.sections import ENV_PREFIX
from tests.milvus_target import target_env

if TYPE_CHECKING:
    import numpy as np
    from mcp import Client
    from mcp_types import RequestParamsMeta

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "server"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with code {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.1)
    raise TimeoutError(f"server did not listen on port {port} within {timeout}s")


@contextlib.contextmanager
def http_server(
    env: dict[str, str],
    *,
    transport: str = "streamable-http",
    extra: list[str] | None = None,
    port: int | None = None,
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """Run `serve` over HTTP on a free loopback port; yields (port, process)."""
    port = port or free_port()
    args = [*CLI, "serve", "--transport", transport, "--port", str(port), *(extra or [])]
    # Output goes to a file, not a pipe nobody reads: a full pipe would stall the server.
    with tempfile.TemporaryFile() as output:
        proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=output, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, proc)
            yield port, proc
        finally:
            stop(proc)


def stop(proc: subprocess.Popen[bytes], timeout: float = 15.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def outer_env() -> dict[str, str]:
    """This process's environment without any variable of the settings (``ENV_PREFIX``)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}


def cli_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """The environment of a CLI or server subprocess over data_dir: no inherited settings variable,
    the test's Milvus target, then ``settings`` (full variable names)."""
    env = outer_env()
    env[f"{ENV_PREFIX}DATA_DIR"] = str(data_dir)
    # The test's Milvus server and collection prefix, when the run targets a server.
    env.update(target_env())
    env.update(settings)
    return env


class WrappedEmbedder:
    """An embedder that passes every encoding to ``inner``, under its name and dimension.

    Tests subclass it to count or fail query encodings on the way to the shared real model.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name, self.dim = inner.name, inner.dim

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_queries(texts)  # type: ignore[no-any-return]

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_passages(texts)  # type: ignore[no-any-return]


class Ticks:
    count = 0


@contextlib.asynccontextmanager
async def loop_ticks(interval_s: float) -> AsyncIterator[Ticks]:
    """Counts the turns of a task sleeping ``interval_s`` at a time: how long the event loop was free.

    Work that blocks the loop (a synchronous wait, a long computation) leaves it no turn.
    """
    ticks = Ticks()

    async def tick() -> None:
        while True:
            await asyncio.sleep(interval_s)
            ticks.count += 1

    task = asyncio.create_task(tick())
    try:
        yield ticks
    finally:
        task.cancel()


async def lookup(client: Client, query: str, session: str | None = "s1", **args: Any) -> dict[str, Any]:
    """One lookup_knowledge call through an in-process client, bounded: its structured content, asserted
    not an error. ``session`` is the session id the call sends (None: none, the connection's own)."""
    meta = None if session is None else cast("RequestParamsMeta", {"session_id": session})
    with anyio.fail_after(60):
        result = await client.call_tool("lookup_knowledge", {"query": query, **args}, meta=meta)
    assert not result.is_error, result.content
    content: dict[str, Any] | None = result.structured_content
    assert content is not None
    return content


def write_knowledge_base(root: Path, docs: Mapping[str, str | bytes]) -> Path:
    """Write each document at its path under root (text as UTF-8, bytes as they are); root."""
    for rel, text in docs.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text, encoding="utf-8")
    return root


def ingest_into(data_dir: Path, kb: Path, embedder: Any, milvus: dict[str, Any] | None = None) -> Any:
    """Ingest kb into data_dir with the given embedder; the report, asserted free of failures."""
    from server.config.loading import load_settings
    from server.container import open_runtime

    runtime = open_runtime(load_settings(None, data_dir=data_dir, milvus=milvus), embedder=embedder)
    try:
        report = runtime.ingestor().run(kb)
    finally:
        runtime.close()
    assert not report.failed, report.failed
    return report
