"""Cold start and peak memory of the real serving process: ``python -m server serve`` over stdio.

The clock starts just before the process is spawned. The initialize request is written at once
(it waits in the pipe while Python starts), so "initialize answered" covers interpreter start,
imports and the handshake; "first lookup answered" adds the background warm-up (model load,
Milvus open, collection load) that the first lookup waits for.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, BinaryIO

import psutil

from bench.stats import summarize

ROOT = Path(__file__).resolve().parent.parent
HANDSHAKE_VERSION = "2025-06-18"


class _Lines:
    """Reads a pipe's lines on a thread so reads can be bounded in time."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._queue: queue.Queue[bytes] = queue.Queue()
        self._thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self._thread.start()

    def _pump(self, stream: IO[bytes]) -> None:
        for line in iter(stream.readline, b""):
            self._queue.put(line)
        self._queue.put(b"")

    def response(self, request_id: int, timeout_s: float) -> dict[str, Any]:
        """The JSON-RPC response with request_id, skipping notifications."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no response to request {request_id} within {timeout_s:g}s")
            line = self._queue.get(timeout=remaining)
            if not line:
                raise RuntimeError(f"the server closed stdout before answering request {request_id}")
            message: dict[str, Any] = json.loads(line)
            if message.get("id") == request_id:
                if "error" in message:
                    raise RuntimeError(f"request {request_id} failed: {message['error']}")
                return message


def _send(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    if proc.stdin is None:
        raise RuntimeError("the server process was started without a stdin pipe")
    proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()


def _lookup(request_id: int, query: str, session: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {
            "name": "lookup_knowledge",
            "arguments": {"query": query},
            "_meta": {"session_id": session},
        },
    }


def peak_rss_mb(pid: int) -> dict[str, float]:
    """VmHWM (peak resident set) of the process and, summed, of its children, in MiB."""

    def hwm(p: int) -> float:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return 0.0

    children = psutil.Process(pid).children(recursive=True)
    own = hwm(pid)
    return {"process": round(own, 1), "children": round(sum(hwm(c.pid) for c in children), 1)}


def one_start(
    env: dict[str, str], queries: list[str], *, stderr: BinaryIO, rss: bool, timeout_s: float = 120.0
) -> dict[str, Any]:
    """Start the server once; time initialize and the first lookup; optionally load it and read its peak RSS."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "server", "serve"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    try:
        if proc.stdout is None:
            raise RuntimeError("the server process was started without a stdout pipe")
        lines = _Lines(proc.stdout)
        _send(
            proc,
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": HANDSHAKE_VERSION,
                    "capabilities": {},
                    "clientInfo": {"name": "bench", "version": "1"},
                },
            },
        )
        lines.response(1, timeout_s)
        initialize_ms = (time.perf_counter() - started) * 1000
        _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _send(proc, _lookup(2, queries[0], "cold-0"))
        lines.response(2, timeout_s)
        first_ms = (time.perf_counter() - started) * 1000
        result: dict[str, Any] = {"initialize_ms": initialize_ms, "first_lookup_ms": first_ms}
        if rss:
            for n, query in enumerate(queries[1:], start=3):
                _send(proc, _lookup(n, query, f"rss-{n}"))
                lines.response(n, timeout_s)
            result["rss_mb"] = peak_rss_mb(proc.pid)
            result["rss_lookups"] = len(queries)
        return result
    finally:
        if proc.stdin is not None:
            proc.stdin.close()  # end of input ends the stdio server
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def cold_start(
    data_dir: Path, queries: list[str], *, starts: int, rss_queries: int, log_path: Path
) -> dict[str, Any]:
    """Median over several starts; the last start also serves rss_queries lookups and reports peak RSS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOKUP_KNOWLEDGE_")}
    env["LOOKUP_KNOWLEDGE_DATA_DIR"] = str(data_dir)
    runs = []
    imports = []
    for _ in range(starts):
        # What the serving process imports before it can read a message, timed on its own.
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", "import server.cli, server.cli.commands, server.cli.serve"],
            cwd=ROOT,
            env=env,
            check=True,
        )
        imports.append([(time.perf_counter() - started) * 1000])
    with log_path.open("ab") as stderr:
        for i in range(starts):
            last = i == starts - 1
            batch = queries[i : i + rss_queries] if last else queries[i : i + 1]
            runs.append(one_start(env, batch, stderr=stderr, rss=last))
    rss = runs[-1].get("rss_mb", {})
    return {
        "starts": starts,
        # Each start is its own round, so the spread is the range over starts.
        "initialize_ms": summarize([[r["initialize_ms"]] for r in runs], digits=1),
        "first_lookup_ms": summarize([[r["first_lookup_ms"]] for r in runs], digits=1),
        "interpreter_and_imports_ms": summarize(imports, digits=1),
        "peak_rss_mb": rss,
        "rss_lookups": runs[-1].get("rss_lookups"),
    }
