"""``make bench`` part two: the lookup path on Milvus Lite and on a Milvus 2.3.5 server, side by side.

For each size (1k, 10k, 50k chunks) the same chunk vectors go into a Lite directory and into a
server started by tests/milvus_server.py, and each lookup is timed the way the engine makes it:
the real e5 query embedding, then the engine's one dense store search (``engine.DENSE_LIMIT``).
Chunk vectors are random unit vectors: the
search cost depends on the count, the dimension and the index, not on the text, and embedding
50k chunks would take the machine an hour. Writes ``bench/results/server-column.json`` and the
"Milvus Lite and Milvus server" section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import machine
from bench.lookup_bench import log
from bench.store_ready import wait_until_indexed
from retrieval.engine import DENSE_LIMIT
from storage.vector_store import VECTOR_FIELD, ChunkRow, MilvusVectorStore

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Milvus Lite and Milvus server"
QUERIES = [
    "how do I configure the connection pool size",
    "ERR_TIMEOUT 是什么",
    "what does the on-call rotation look like",
    "Redis cluster failover",
    "慢查询怎么排查",
    "rate limit headers for clients",
    "how to read a Java stack trace",
    "release process checklist",
]


def _fill(store: MilvusVectorStore, total: int, *, start: int, rng: np.random.Generator) -> None:
    """Add chunks start..total-1: half English, half Chinese, over 8 domains."""
    batch = 2000
    for first in range(start, total, batch):
        rows = []
        for i in range(first, min(first + batch, total)):
            vector = rng.normal(size=store.dim).astype(np.float32)
            rows.append(
                ChunkRow(
                    f"chunk-{i}",
                    f"doc-{i}.md",
                    f"domain-{i % 8}",
                    "en" if i % 2 else "zh",
                    vector / np.linalg.norm(vector),
                )
            )
        store.upsert(rows)
    store.flush_and_load()


def _time_lookups(store: MilvusVectorStore, embedder: Any, rounds: int) -> dict[str, float]:
    lookups, searches = [], []
    for _ in range(rounds):
        for query in QUERIES:
            query = f"{query} {time.perf_counter_ns()}"  # fresh: no embedding cache hit
            started = time.perf_counter()
            vector = embedder.embed_query(query)
            searched = time.perf_counter()
            store.search(vector, limit=DENSE_LIMIT, domain=None)
            done = time.perf_counter()
            lookups.append((done - started) * 1000)
            searches.append((done - searched) * 1000)
    return {
        "lookup_median_ms": round(statistics.median(lookups), 2),
        "lookup_p95_ms": round(sorted(lookups)[int(0.95 * (len(lookups) - 1))], 2),
        "search_median_ms": round(statistics.median(searches), 2),
        "samples": len(lookups),
    }


def _cpu_idle_share(seconds: float = 1.0) -> float:
    """The machine's idle share over a short window, from /proc/stat."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)

    idle0, total0 = sample()
    time.sleep(seconds)
    idle1, total1 = sample()
    return (idle1 - idle0) / max(total1 - total0, 1)


def _wait_for_server_index(store: MilvusVectorStore, size: int, timeout_s: float = 300.0) -> dict[str, Any]:
    """Wait until the server has indexed every row and its background work has stopped.

    A search on the server stays fast while its index build runs in other processes, but that
    build takes the cores the query embedding needs: measured during it, a 50,000-chunk lookup
    looked 25x slower than its search.
    """
    started = time.monotonic()
    described: dict[str, Any] = {}
    while time.monotonic() - started < timeout_s:
        described = store._client.describe_index(store.collection, VECTOR_FIELD)
        if int(described.get("indexed_rows", 0)) >= size and int(described.get("pending_index_rows", 0)) == 0:
            break
        time.sleep(1.0)
    idle = _cpu_idle_share()
    while idle < 0.7 and time.monotonic() - started < timeout_s:
        idle = _cpu_idle_share()
    return {"seconds": round(time.monotonic() - started, 1), "idle_share": round(idle, 2)}


def run(sizes: list[int], rounds: int, server_uri: str | None, work: Path) -> dict[str, Any]:
    from retrieval.embedders import CachedEmbedder, create_embedder
    from tests.milvus_server import start, stop

    embedder = CachedEmbedder(create_embedder("e5-small"), size=0)
    server_data = work / "milvus-server"
    started_here = server_uri is None
    if server_uri is None:
        log("starting Milvus 2.3.5 standalone")
        server_uri = start(server_data).uri
    results: dict[str, Any] = {
        "sizes": sizes,
        "lite": {},
        "server": {},
        "load": {"start": machine.load_average()},
    }
    try:
        for label, uri in (("lite", str(work / "milvus.db")), ("server", server_uri)):
            store = MilvusVectorStore(
                uri=uri, token=None, collection="bench_server_column_384", dim=384, timeout_s=60
            )
            if label == "server" and store._client.has_collection(store.collection):
                store._client.drop_collection(store.collection)
            store.ensure_collection()
            rng = np.random.default_rng(7)
            filled = 0
            try:
                for size in sizes:
                    log(f"{label}: filling to {size} chunks")
                    _fill(store, size, start=filled, rng=rng)
                    filled = size
                    ready = wait_until_indexed(store)
                    if label == "server":
                        ready["server_settled"] = _wait_for_server_index(store, size)
                    measured: dict[str, Any] = _time_lookups(store, embedder, rounds)
                    measured["index_wait"] = ready
                    results[label][str(size)] = measured
                    log(f"{label} {size}: {measured['lookup_median_ms']} ms median lookup")
            finally:
                if label == "server":
                    store._client.drop_collection(store.collection)
                store.close()
    finally:
        if started_here:
            stop(server_data)
    results["load"]["end"] = machine.load_average()
    return results


def render(results: dict[str, Any]) -> str:
    sizes = results["sizes"]
    lines = [
        SECTION,
        "",
        f"The engine's dense path (e5 query embedding + its one search, limit {DENSE_LIMIT}) over the same",
        "random unit vectors, in a Milvus Lite directory and in Milvus 2.3.5 standalone on loopback",
        "(`tests/milvus_server.py`, `bench/server_bench.py`). Medians (p95) in ms; load average "
        f"{results.get('load', {}).get('start')} at start, {results.get('load', {}).get('end')} at end.",
        "",
        "| chunks | Lite embed + search | Lite search | server embed + search | server search |",
        "|---|---|---|---|---|",
    ]
    for size in sizes:
        lite, server = results["lite"].get(str(size)), results["server"].get(str(size))
        cells = []
        for part in (lite, server):
            if part is None:
                cells += ["not run", "not run"]
            else:
                cells += [
                    f"{part['lookup_median_ms']} ({part['lookup_p95_ms']})",
                    str(part["search_median_ms"]),
                ]
        lines.append(f"| {size:,} | " + " | ".join(cells) + " |")
    for label in ("lite", "server"):
        got = results[label]
        first, last = str(sizes[0]), str(sizes[-1])
        if first in got and last in got:
            ratio = got[last]["lookup_median_ms"] / got[first]["lookup_median_ms"]
            verdict = ""
            if label == "server":
                verdict = " (target <= 1.5: " + ("met" if ratio <= 1.5 else "**missed**") + ")"
            lines.append("")
            lines.append(
                f"- {label}: median lookup at {int(last):,} / at {int(first):,} = {ratio:.2f}{verdict}"
            )
    return "\n".join(lines) + "\n"


def write_docs(section: str, docs: Path) -> None:
    """Replace (or append) the section of the benchmarks page that ``section`` heads (its first line)."""
    heading = section.splitlines()[0]
    text = docs.read_text(encoding="utf-8") if docs.exists() else ""
    if heading in text:
        head, _, tail = text.partition(heading)
        rest = tail.split("\n## ", 1)
        text = head + section + ("\n## " + rest[1] if len(rest) > 1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    docs.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.server_bench", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,10000,50000")
    p.add_argument("--rounds", type=int, default=10, help="rounds of 8 fresh queries per size")
    p.add_argument("--server-uri", default=None, help="use a running server instead of starting one")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "server-column.json")
    p.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--render-only", action="store_true", help="only rewrite the section from --results")
    p.add_argument(
        "--replica-sizes",
        default="1000,10000",
        help="bench.replica_bench on the same server at these sizes (empty: skip it)",
    )
    args = p.parse_args(argv)
    if args.render_only:
        write_docs(render(json.loads(args.results.read_text(encoding="utf-8"))), args.docs)
        return 0
    from bench import replica_bench
    from tests.milvus_server import start, stop

    work = Path(tempfile.mkdtemp(prefix="server-bench-"))
    uri = args.server_uri
    replicas = None
    try:
        if uri is None:
            log("starting Milvus 2.3.5 standalone")
            uri = start(work / "milvus-server").uri
        results = run([int(s) for s in args.sizes.split(",")], args.rounds, uri, work)
        if args.replica_sizes:
            replicas = replica_bench.run([int(s) for s in args.replica_sizes.split(",")], uri, work)
    finally:
        if args.server_uri is None:
            stop(work / "milvus-server")
        shutil.rmtree(work, ignore_errors=True)
    args.results.write_text(json.dumps(results, indent=2), encoding="utf-8")
    write_docs(render(results), args.docs)
    print(render(results))
    if replicas is not None:
        replica_bench.save(replicas, args.results.parent / "replicas.json", args.docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
