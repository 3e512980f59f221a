"""Load over streamable HTTP on loopback: concurrent sessions x lookups against a ``serve`` process.

Besides latency it checks what must hold under load:
- protocol errors: any exception from the client (a JSON-RPC error, a dropped stream) counts;
- cross-session leaks: every session sends its own queries, and may only ever see, in
  ``already_in_context`` and ``retrieved_domains_this_session``, the documents and domains
  it was itself given;
- log rows: the invocation log holds exactly one ``lookup_knowledge`` row per call, and each
  session's rows number its calls.

``tests/test_load.py`` runs the CI size (50 x 20); ``python -m bench.load --sessions 200 --calls 20``
runs a larger one against a freshly ingested copy of the sample knowledge base.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
from mcp import Client

from tests.helpers import free_port, stop, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_KB = ROOT / "examples" / "knowledge"
TOPICS = [
    json.loads(line)["query"]
    for line in (ROOT / "examples" / "calibration" / "queries.jsonl").read_text(encoding="utf-8").splitlines()
    if json.loads(line).get("doc")
]


@dataclass
class LoadReport:
    sessions: int
    calls_per_session: int
    calls: int = 0
    protocol_errors: int = 0
    tool_errors: int = 0
    leaks: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    tiers: Counter[str] = field(default_factory=Counter)
    deduped_documents: int = 0
    wall_s: float = 0.0
    log_rows: int | None = None
    log_rows_per_session: dict[str, int] = field(default_factory=dict)

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        if not ordered:
            return float("nan")
        return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]

    def summary(self) -> dict[str, Any]:
        return {
            "sessions": self.sessions,
            "calls_per_session": self.calls_per_session,
            "calls": self.calls,
            "protocol_errors": self.protocol_errors,
            "tool_errors": self.tool_errors,
            "cross_session_leaks": len(self.leaks),
            "log_rows": self.log_rows,
            "p50_ms": round(self.percentile(50), 1),
            "p95_ms": round(self.percentile(95), 1),
            "max_ms": round(max(self.latencies_ms, default=float("nan")), 1),
            "mean_ms": round(statistics.fmean(self.latencies_ms), 1) if self.latencies_ms else None,
            "wall_s": round(self.wall_s, 1),
            "throughput_per_s": round(self.calls / self.wall_s, 1) if self.wall_s else None,
            "tiers": dict(self.tiers),
            "already_in_context_hits": self.deduped_documents,
        }


def session_queries(index: int, count: int) -> list[str]:
    """The queries of one session: topics asked twice in different words, and text no other session sends."""
    topics = [TOPICS[(index * 7 + j) % len(TOPICS)] for j in range((count + 1) // 2)]
    first = [f"{topic} (session {index}, question {j})" for j, topic in enumerate(topics)]
    again = [f"again, for session {index}: {topic}" for topic in topics]
    return (first + again)[:count]


async def _session(url: str, index: int, calls: int, report: LoadReport, timeout_s: float) -> None:
    own_docs: dict[str, str] = {}  # doc_key#section -> domain, as returned to this session
    try:
        async with Client(url, mode="legacy", read_timeout_seconds=timeout_s) as client:
            for query in session_queries(index, calls):
                started = time.perf_counter()
                try:
                    result = await client.call_tool("lookup_knowledge", {"query": query})
                except Exception as exc:  # any failure of the protocol itself is what this counts
                    report.protocol_errors += 1
                    report.errors.append(f"session {index}: {type(exc).__name__}: {exc}")
                    continue
                finally:
                    report.calls += 1
                report.latencies_ms.append((time.perf_counter() - started) * 1000)
                if result.is_error:
                    report.tool_errors += 1
                    report.errors.append(f"session {index}: tool error {result.content!r}"[:500])
                    continue
                _check_isolation(index, result.structured_content or {}, own_docs, report)
    except Exception as exc:  # the connection itself failed
        report.protocol_errors += 1
        report.errors.append(f"session {index}: connection: {type(exc).__name__}: {exc}")


def _check_isolation(
    index: int, answer: dict[str, Any], own_docs: dict[str, str], report: LoadReport
) -> None:
    report.tiers[answer.get("relevance_level", "?")] += 1
    already = {doc["doc_key"] for doc in answer.get("already_in_context", [])}
    report.deduped_documents += len(already)
    foreign = already - {passage.split("#", 1)[0] for passage in own_docs}
    if foreign:
        report.leaks.append(f"session {index} was told it already has {sorted(foreign)}")
    returned = ([answer["primary"]] if answer.get("primary") else []) + answer.get("supplement", [])
    # Memory is per passage: another section of a document is new content, the same one never is.
    passages = {
        f"{doc['doc_key']}#{section}": doc["domain"]
        for doc in returned
        for section in doc["sections"] or [""]
    }
    twice = set(passages) & set(own_docs)
    if twice:
        report.leaks.append(f"session {index} was sent {sorted(twice)} a second time")
    own_docs.update(passages)
    domains = set(answer.get("retrieved_domains_this_session", []))
    if domains != set(own_docs.values()):
        report.leaks.append(
            f"session {index} domains {sorted(domains)} differ from its own {sorted(set(own_docs.values()))}"
        )


async def drive(url: str, *, sessions: int, calls: int, timeout_s: float = 300.0) -> LoadReport:
    """Run every session at once; the whole run is bounded by timeout_s."""
    report = LoadReport(sessions=sessions, calls_per_session=calls)
    started = time.perf_counter()
    with anyio.fail_after(timeout_s):
        async with anyio.create_task_group() as tg:
            for index in range(sessions):
                tg.start_soon(_session, url, index, calls, report, timeout_s)
    report.wall_s = time.perf_counter() - started
    return report


def count_log_rows(log_path: Path, report: LoadReport) -> None:
    """Fill in the lookup_knowledge rows of the invocation log, in total and per session."""
    with sqlite3.connect(f"file:{log_path}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT session_key, COUNT(*) FROM tool_invocation WHERE tool_name = 'lookup_knowledge' "
            "GROUP BY session_key"
        ).fetchall()
    report.log_rows_per_session = {str(key): int(n) for key, n in rows}
    report.log_rows = sum(report.log_rows_per_session.values())


def load_env(data_dir: Path) -> dict[str, str]:
    """The server's environment for a load run.

    Governance is off so that every call runs retrieval and the dedup memory (which stays on):
    with the default budget a session is stopped after a few calls and the rest of its calls
    would be cheap refusals, measuring the circuit breaker instead of the lookup path.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOKUP_KNOWLEDGE_")}
    env["LOOKUP_KNOWLEDGE_DATA_DIR"] = str(data_dir)
    env["LOOKUP_KNOWLEDGE_GOVERNANCE__ENABLED"] = "false"
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--calls", type=int, default=20, help="lookups per session")
    parser.add_argument("--data-dir", type=Path, default=None, help="an ingested data directory to copy")
    parser.add_argument("--timeout", type=float, default=900.0, help="bound on the whole run, in seconds")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="load-") as tmp:
        data_dir = Path(tmp) / "data"
        if args.data_dir:
            shutil.copytree(args.data_dir, data_dir)
        else:
            print("ingesting the sample knowledge base ...", file=sys.stderr)
            subprocess.run(
                [sys.executable, "-m", "server", "ingest", str(SAMPLE_KB), "--data-dir", str(data_dir)],
                check=True,
                cwd=ROOT,
            )
        port = free_port()
        with (Path(tmp) / "serve.log").open("wb") as log_file:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "server",
                    "serve",
                    "--transport",
                    "streamable-http",
                    "--port",
                    str(port),
                ],
                env=load_env(data_dir),
                cwd=ROOT,
                stdout=log_file,
                stderr=log_file,
            )
        try:
            wait_for_port(port, proc, timeout=120.0)
            report = anyio.run(
                lambda: drive(
                    f"http://127.0.0.1:{port}/mcp",
                    sessions=args.sessions,
                    calls=args.calls,
                    timeout_s=args.timeout,
                )
            )
            count_log_rows(data_dir / "log.sqlite", report)
        finally:
            stop(proc, timeout=30)
    print(json.dumps(report.summary(), indent=2))
    for line in (report.errors + report.leaks)[:20]:
        print(line, file=sys.stderr)
    ok = (
        report.protocol_errors == 0
        and report.tool_errors == 0
        and not report.leaks
        and report.log_rows == report.calls == args.sessions * args.calls
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
