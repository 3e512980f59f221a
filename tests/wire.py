"""Raw JSON-RPC over HTTP and stdio for the reliability tests: bytes in, status and payload out.

The SDK client never sends a broken frame, so the tests that need one talk to the server here.
Server subprocesses write their output to files rather than pipes: a long run logs more than a
pipe buffer holds, and a full pipe would stall the server mid-test.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shutil
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import CLI, ROOT, cli_env, free_port, stop, wait_for_port

JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 0,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "reliability-tests", "version": "1"},
    },
}


def private_data_dir(template: Path, target: Path) -> Path:
    """A writable copy of an ingested data directory (one Milvus Lite file per process)."""
    shutil.copytree(template, target)
    return target


@contextlib.contextmanager
def blocking_client(data_dir: Path, embedder: Any) -> Iterator[tuple[Any, Any]]:
    """An in-process server over data_dir and a legacy-mode client, driven from sync code via a portal."""
    from anyio.from_thread import start_blocking_portal
    from mcp import Client

    from server.config.loading import load_settings
    from server.protocol.app import app_resources, create_server

    settings = load_settings(None, data_dir=data_dir)
    server = create_server(app_resources(settings, overrides={"data_dir": data_dir}, embedder=embedder))
    with (
        start_blocking_portal() as portal,
        portal.wrap_async_context_manager(Client(server, mode="legacy")) as client,
    ):
        yield portal, client


def server_env(data_dir: Path, **settings: str) -> dict[str, str]:
    """The environment for a server subprocess over data_dir, then ``settings`` (tests.helpers.cli_env)."""
    return cli_env(data_dir, **settings)


@dataclass
class Served:
    port: int
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def output(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


@contextlib.contextmanager
def served_http(
    env: dict[str, str], logs: Path, *, extra: list[str] | None = None, port: int | None = None
) -> Iterator[Served]:
    """``serve --transport streamable-http`` on a loopback port, output to files under ``logs``."""
    port = port or free_port()
    logs.mkdir(parents=True, exist_ok=True)
    out, err = logs / f"serve-{port}.out", logs / f"serve-{port}.err"
    args = [*CLI, "serve", "--transport", "streamable-http", "--port", str(port), *(extra or [])]
    with out.open("wb") as out_file, err.open("wb") as err_file:
        proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=out_file, stderr=err_file)
    try:
        wait_for_port(port, proc)
        yield Served(port, proc, out, err)
    finally:
        stop(proc)


@dataclass
class Reply:
    status: int
    headers: httpx.Headers
    text: str

    def messages(self) -> list[dict[str, Any]]:
        """The JSON-RPC messages of a JSON or SSE response body."""
        if self.headers.get("content-type", "").startswith("text/event-stream"):
            return [
                json.loads(line[len("data:") :])
                for line in self.text.splitlines()
                if line.startswith("data:") and line[len("data:") :].strip()
            ]
        try:
            body = json.loads(self.text)
        except ValueError:
            return []
        return body if isinstance(body, list) else [body]

    def message(self) -> dict[str, Any]:
        found = self.messages()
        if len(found) != 1:
            raise AssertionError(f"expected one JSON-RPC message, got {found!r} (status {self.status})")
        return found[0]


def post(
    url: str,
    body: bytes | str | dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Reply:
    """POST one body (a dict is sent as JSON) and read the whole response."""
    content = json.dumps(body).encode() if isinstance(body, dict) else body
    response = httpx.post(url, content=content, headers={**JSON_HEADERS, **(headers or {})}, timeout=timeout)
    return Reply(response.status_code, response.headers, response.text)


class RawSession:
    """A stateful streamable-HTTP MCP session driven with hand-written bodies."""

    def __init__(self, url: str, *, headers: dict[str, str] | None = None) -> None:
        self.url = url
        self.base_headers = dict(headers or {})
        reply = post(url, INITIALIZE, headers=self.base_headers)
        if reply.status != 200:
            raise AssertionError(f"initialize failed: {reply.status} {reply.text[:300]}")
        self.session_id = reply.headers["mcp-session-id"]
        self.headers = {
            **self.base_headers,
            "mcp-session-id": self.session_id,
            "mcp-protocol-version": INITIALIZE["params"]["protocolVersion"],  # type: ignore[index]
        }
        post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=self.headers)
        self._next_id = 1

    def send(self, body: bytes | str | dict[str, Any]) -> Reply:
        return post(self.url, body, headers=self.headers)

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request; returns its JSON-RPC response message."""
        self._next_id += 1
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            body["params"] = params
        return self.send(body).message()

    def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return self.request("tools/call", {"name": name, "arguments": arguments})


def primary(result: dict[str, Any]) -> str | None:
    """The doc_key of the primary answer in a lookup's JSON-RPC result, asserted not an error."""
    assert not result.get("isError"), result
    found = result["structuredContent"].get("primary")
    return found["doc_key"] if found else None


def http_lookup(url: str, query: str) -> dict[str, Any]:
    """The JSON-RPC result of one lookup over HTTP, in a session of its own (a NO_MATCH counts against no later call)."""
    result: dict[str, Any] = RawSession(url).call_tool("lookup_knowledge", {"query": query})["result"]
    return result


def http_primary(url: str, query: str, *, may_fail: bool = False) -> str | None:
    """The doc_key of the primary answer to one lookup over HTTP (``http_lookup``); None on an error
    result when it may fail."""
    result = http_lookup(url, query)
    if may_fail and result.get("isError"):
        return None
    return primary(result)


class StdioPeer:
    """A ``serve`` subprocess over stdio, written to line by line and read with a bounded wait."""

    def __init__(self, env: dict[str, str], stderr: Path) -> None:
        self._stderr = stderr.open("wb")
        self.proc = subprocess.Popen(
            [*CLI, "serve"],
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)

    def send_line(self, line: str | bytes) -> None:
        assert self.proc.stdin is not None
        data = line.encode() if isinstance(line, str) else line
        self.proc.stdin.write(data.rstrip(b"\n") + b"\n")
        self.proc.stdin.flush()

    def send(self, message: dict[str, Any]) -> None:
        self.send_line(json.dumps(message))

    def receive(self, timeout: float = 60.0) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no stdio reply within {timeout}s") from None
        return json.loads(line)  # type: ignore[no-any-return]

    def initialize(self) -> dict[str, Any]:
        self.send(INITIALIZE)
        reply = self.receive()
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return reply

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            stop(self.proc)
        self._stderr.close()


class RawSSE:
    """An SSE MCP session driven with hand-written bodies: the stream is read on a thread."""

    def __init__(
        self, base_url: str, *, headers: dict[str, str] | None = None, timeout: float = 60.0
    ) -> None:
        self.base_url = base_url
        self.headers = dict(headers or {})
        self._timeout = timeout
        self._events: queue.Queue[tuple[str, str]] = queue.Queue()
        self._http = httpx.Client(timeout=httpx.Timeout(timeout, read=None))
        self._response: httpx.Response | None = None
        threading.Thread(target=self._pump, daemon=True).start()
        kind, data = self._next_event()
        if kind != "endpoint":
            raise AssertionError(f"expected the endpoint event first, got {kind!r}: {data[:200]}")
        self.endpoint = base_url + data
        self._next_id = 0

    def _pump(self) -> None:
        kind, data = "message", ""
        try:
            with self._http.stream("GET", self.base_url + "/sse", headers=self.headers) as response:
                self._response = response
                if response.status_code != 200:
                    self._events.put(("status", str(response.status_code)))
                    return
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        kind = line[len("event:") :].strip()
                    elif line.startswith("data:"):
                        data = line[len("data:") :].strip()
                    elif not line and data:
                        self._events.put((kind, data))
                        kind, data = "message", ""
        except (httpx.HTTPError, RuntimeError, ValueError):
            return  # closed by close(), or the server went away: the waiting side times out

    def _next_event(self) -> tuple[str, str]:
        try:
            return self._events.get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError(f"no SSE event within {self._timeout}s") from None

    def post(self, body: dict[str, Any], *, headers: dict[str, str] | None = None) -> int:
        """POST one message to the session's endpoint (as ``headers`` if given); the status."""
        response = httpx.post(
            self.endpoint, json=body, headers=headers if headers is not None else self.headers, timeout=30
        )
        return response.status_code

    def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """One request; its JSON-RPC response, read off the stream."""
        self._next_id += 1
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            body["params"] = params
        status = self.post(body)
        if status != 202:
            raise AssertionError(f"{method} was not accepted: {status}")
        while True:
            kind, data = self._next_event()
            message = json.loads(data)
            if kind == "message" and message.get("id") == self._next_id:
                return message  # type: ignore[no-any-return]

    def initialize(self) -> None:
        self.request("initialize", INITIALIZE["params"])  # type: ignore[arg-type]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def close(self) -> None:
        if self._response is not None:
            with contextlib.suppress(httpx.HTTPError, RuntimeError):
                self._response.close()
        self._http.close()
