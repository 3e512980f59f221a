"""A cheap load client for ``bench.capacity``: raw HTTP/1.1 keep-alive connections, one per thread.

It runs as a process of its own so that its cost is not the server's, and it does as little as
a client can: it writes a prepared ``tools/call`` body, reads the response and looks only for
``"isError"`` in the bytes (no JSON-RPC or schema validation). Each call's start, latency and
outcome go to a JSON file.

    python -m bench.raw_client --port 8765 --connections 8 --seconds 20 --out calls.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any

HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "mcp-protocol-version": "2025-06-18",
}
TOPICS = [
    "ERR_TIMEOUT 是什么",
    "how do I configure the connection pool size",
    "webhook retries and signatures",
    "慢查询怎么排查",
    "what does the on-call rotation look like",
    "rate limit headers for clients",
    "Redis cluster failover",
    "release process checklist",
]


def body(worker: int, call: int) -> bytes:
    """A lookup whose text no other call sends, so the query cache never answers it."""
    query = f"{TOPICS[call % len(TOPICS)]} {worker}-{call}"
    message = {
        "jsonrpc": "2.0",
        "id": call,
        "method": "tools/call",
        "params": {"name": "lookup_knowledge", "arguments": {"query": query}},
    }
    return json.dumps(message, ensure_ascii=False).encode()


def worker(
    port: int, index: int, deadline: float, max_calls: int, calls: list[tuple[float, float, str]]
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for call in range(max_calls):
        started = time.time()
        if started >= deadline:
            break
        try:
            conn.request("POST", "/mcp", body=body(index, call), headers=HEADERS)
            data = conn.getresponse().read()
        except (OSError, http.client.HTTPException) as exc:
            calls.append((started, time.time() - started, f"transport: {type(exc).__name__}"))
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            continue
        outcome = "busy" if b"server busy" in data else "error" if b'"isError":true' in data else "ok"
        calls.append((started, time.time() - started, outcome))
    conn.close()


def run(port: int, connections: int, seconds: float, max_calls: int) -> dict[str, Any]:
    """Every connection makes calls back to back until ``seconds`` pass or it made ``max_calls``."""
    calls: list[tuple[float, float, str]] = []
    cpu_started, started = time.process_time(), time.time()
    deadline = started + seconds
    threads = [
        threading.Thread(target=worker, args=(port, i, deadline, max_calls, calls))
        for i in range(connections)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {
        "connections": connections,
        "started": started,
        "wall_s": time.time() - started,
        "client_cpu_s": time.process_time() - cpu_started,
        "calls": calls,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.raw_client")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--max-calls", type=int, default=1_000_000, help="per connection")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run(args.port, args.connections, args.seconds, args.max_calls)
    args.out.write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
