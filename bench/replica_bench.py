"""Replica start-up and propagation on a Milvus server: an empty data directory to first answer, an edit to every replica.

For each size (1k, 10k chunks of bench.corpus, one chunk per document) on one Milvus 2.3.5 server:

- **ingest from scratch** (the path a new replica took before the catalog was shared): a
  ``lookup-knowledge-mcp ingest`` process with the real e5 model into an empty prefix, then a
  cold ``serve`` over stdio on that data directory, to its first lookup answered;
- **replica start**: a cold ``serve`` over stdio with an empty data directory on the populated
  prefix, to its first lookup answered (interpreter, model load, catalog pull from Milvus, first
  search). The serving process logs what it pulled and how many passages it embedded (0);
- **propagation**: a replica serving over HTTP with the default ``milvus.sync_interval_s``; a few
  times, one document is edited to name a new identifier and ingested in this process, and the
  delay from the ingest's commit (the generation moving) to the replica's first lookup that
  answers the edited document is timed.

Ingest from scratch is measured at ``scratch`` sizes only (default 1k: at 10k it took this
machine 48 minutes, too long for ``make bench``; ``--scratch-sizes 1000,10000`` measures
it). At the other sizes the server is filled by the same ingest with random unit vectors under
e5-small's name (the replica pulls the same catalog and searches as many vectors, whatever their
values), and the figure last measured at that size is carried over from the results file, with
its date.

Writes ``bench/results/replicas.json`` and the "Replica start-up" section of docs/benchmarks.md.
Run by ``make bench`` through bench.server_bench, on the server it starts.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np

from bench import machine
from bench.coldstart import one_start
from bench.corpus import corpus, identifier_query, write_knowledge_base
from bench.lookup_bench import log
from tests.milvus_target import drop_prefixed

ROOT = Path(__file__).resolve().parent.parent
SECTION = "## Replica start-up on a Milvus server"
_PULLED = re.compile(
    r"took (\d+) documents \((\d+) chunks\).*in ([0-9.]+) s; passages embedded by this process: (\d+)"
)


def _env(data_dir: Path, uri: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOOKUP_KNOWLEDGE_")}
    env["LOOKUP_KNOWLEDGE_DATA_DIR"] = str(data_dir)
    env["LOOKUP_KNOWLEDGE_MILVUS__URI"] = uri
    env["LOOKUP_KNOWLEDGE_MILVUS__COLLECTION_PREFIX"] = prefix
    return env


def _start(env: dict[str, str], query: str, stderr_path: Path) -> dict[str, Any]:
    with stderr_path.open("wb") as stderr:
        timed = one_start(env, [query], stderr=stderr, rss=False, timeout_s=1800.0)
    pulled = _PULLED.findall(stderr_path.read_text(errors="replace"))
    timed["pulled"] = (
        {"documents": int(pulled[0][0]), "chunks": int(pulled[0][1]), "seconds": float(pulled[0][2])}
        if pulled
        else None
    )
    timed["passages_embedded"] = int(pulled[0][3]) if pulled else None
    return timed


class _UnitVectors:
    """Random unit vectors under e5-small's name and dimension, to fill the server fast."""

    name = "e5-small"
    dim = 384

    def __init__(self) -> None:
        self._rng = np.random.default_rng(7)

    def _unit(self, count: int) -> np.ndarray:
        vectors = self._rng.normal(size=(count, self.dim)).astype(np.float32)
        unit: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return unit

    def embed_queries(self, texts: Any) -> np.ndarray:
        return self._unit(len(texts))

    def embed_passages(self, texts: Any) -> np.ndarray:
        return self._unit(len(texts))

    def count_tokens(self, text: str) -> int:
        return len(text.split()) + 2


def _fill(kb: Path, data_dir: Path, uri: str, prefix: str, embedder: Any) -> float | None:
    """Ingest kb in this process; the monotonic time its last generation was committed (None: no change)."""
    from server.config.loading import load_settings
    from server.container import open_runtime
    from tests.milvus_target import timed_mirror

    committed: list[float] = []

    settings = load_settings(None, data_dir=data_dir, milvus={"uri": uri, "collection_prefix": prefix})
    with mock.patch("server.container.SharedMirror", timed_mirror(committed)):
        runtime = open_runtime(settings, embedder=embedder)
        try:
            runtime.ingestor().run(kb)
        finally:
            runtime.close()
    return committed[-1] if committed else None


def _ingest_from_scratch(kb: Path, data_dir: Path, uri: str, prefix: str, stderr: Path) -> float:
    started = time.perf_counter()
    with stderr.open("wb") as err:
        subprocess.run(
            [sys.executable, "-m", "server", "ingest", str(kb)],
            cwd=ROOT,
            env=_env(data_dir, uri, prefix),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    return time.perf_counter() - started


def _answered_after(url: str, query: str, doc_key: str, since: float, timeout_s: float = 120.0) -> float:
    """Seconds from ``since`` until a lookup of query on the replica at url answers doc_key."""
    from tests.wire import RawSession

    while True:
        result = RawSession(url).call_tool("lookup_knowledge", {"query": query})["result"]
        primary = (result.get("structuredContent") or {}).get("primary") or {}
        elapsed = time.monotonic() - since
        if primary.get("doc_key") == doc_key:
            return elapsed
        if elapsed > timeout_s:
            raise RuntimeError(f"{doc_key} not answered for {query!r} within {timeout_s:g}s: {result}")
        time.sleep(0.05)


def _propagation(
    kb: Path, items: list[Any], ingester: Path, uri: str, prefix: str, edits: int
) -> dict[str, Any]:
    """Median delay, over ``edits`` edits, from an ingest's commit to a serving replica answering it."""
    from server.config.sections import MilvusSettings
    from tests.wire import served_http

    sync_s = MilvusSettings().sync_interval_s
    delays = []
    work = ingester.parent
    with served_http(
        _env(work / f"follower-{prefix}", uri, prefix), work / f"follower-{prefix}-logs"
    ) as follower:
        _answered_after(follower.url, identifier_query(items[0]), items[0].relative_path, time.monotonic())
        for n in range(edits):
            item = items[(n + 1) * len(items) // (edits + 1)]
            token = f"REPLICA_EDIT_{n}_{os.getpid()}"
            (kb / item.relative_path).write_text(
                f"{item.markdown()}\n{token} names this edit.\n", encoding="utf-8"
            )
            committed = _fill(kb, ingester, uri, prefix, _UnitVectors())
            if committed is None:
                raise RuntimeError(f"the edit of {item.relative_path} committed nothing")
            delays.append(_answered_after(follower.url, token, item.relative_path, committed))
    return {
        "sync_interval_s": sync_s,
        "edits": edits,
        "median_s": round(statistics.median(delays), 2),
        "min_s": round(min(delays), 2),
        "max_s": round(max(delays), 2),
    }


def _one_size(size: int, uri: str, work: Path, starts: int, scratch: bool, edits: int) -> dict[str, Any]:
    items = corpus(size)
    kb = work / f"kb-{size}"
    write_knowledge_base(kb, items)
    query = identifier_query(items[size // 2])
    prefix = f"bench_replicas_{size}_{os.getpid()}"
    ingester = work / f"ingester-{size}"
    measured: dict[str, Any] = {"chunks": size, "prefix": prefix}
    if scratch:
        log(f"replicas {size}: ingest from scratch")
        ingest_s = _ingest_from_scratch(kb, ingester, uri, prefix, work / f"ingest-{size}.err")
        after = _start(_env(ingester, uri, prefix), query, work / f"serve-ingested-{size}.err")
        measured["ingest_from_scratch_s"] = round(ingest_s, 1)
        measured["serve_after_ingest_first_lookup_ms"] = round(after["first_lookup_ms"], 1)
        measured["current_path_s"] = round(ingest_s + after["first_lookup_ms"] / 1000, 1)
        measured["current_path_measured"] = time.strftime("%Y-%m-%d")
    else:
        log(f"replicas {size}: filling the server with random vectors")
        _fill(kb, ingester, uri, prefix, _UnitVectors())
    measured |= _replica_starts(size, uri, prefix, query, work, starts)
    if edits:
        log(f"replicas {size}: propagation of {edits} edits")
        measured["propagation"] = _propagation(kb, items, ingester, uri, prefix, edits)
    return measured


def _replica_starts(size: int, uri: str, prefix: str, query: str, work: Path, starts: int) -> dict[str, Any]:
    replicas = []
    for n in range(starts):
        log(f"replicas {size}: replica start {n + 1}/{starts}")
        replicas.append(
            _start(_env(work / f"replica-{size}-{n}", uri, prefix), query, work / f"replica-{size}-{n}.err")
        )
    first = [r["first_lookup_ms"] for r in replicas]
    return {
        "replica_first_lookup_ms": {
            "median": round(statistics.median(first), 1),
            "min": round(min(first), 1),
            "max": round(max(first), 1),
            "starts": starts,
        },
        "replica_pull": [r["pulled"] for r in replicas],
        "replica_passages_embedded": [r["passages_embedded"] for r in replicas],
    }


def run(
    sizes: list[int],
    server_uri: str,
    work: Path,
    *,
    starts: int = 3,
    scratch: tuple[int, ...] = (1000,),
    edits: int = 5,
) -> dict[str, Any]:
    """Replica starts and propagation at every size, ingest from scratch at the scratch sizes."""
    results: dict[str, Any] = {"sizes": sizes, "load": {"start": machine.load_average()}, "by_size": {}}
    for size in sizes:
        measured = _one_size(size, server_uri, work, starts, size in scratch, edits)
        drop_prefixed(server_uri, measured.pop("prefix"))
        results["by_size"][str(size)] = measured
        log(
            f"replicas {size}: replica first answer {measured['replica_first_lookup_ms']['median']} ms, "
            f"ingest from scratch {measured.get('current_path_s')} s, "
            f"propagation {measured.get('propagation', {}).get('median_s')} s"
        )
    results["load"]["end"] = machine.load_average()
    return results


def carry_over(results: dict[str, Any], previous: Path) -> dict[str, Any]:
    """Results with the ingest-from-scratch figures last measured at the sizes this run did not measure."""
    if not previous.exists():
        return results
    before = json.loads(previous.read_text(encoding="utf-8")).get("by_size", {})
    for size, got in results["by_size"].items():
        old = before.get(size, {})
        if "current_path_s" not in got and old.get("current_path_measured"):
            keys = ("ingest_from_scratch_s", "serve_after_ingest_first_lookup_ms", "current_path_s")
            got |= {k: old[k] for k in (*keys, "current_path_measured") if k in old}
            got["current_path_carried_over"] = True
    return results


def save(results: dict[str, Any], path: Path, docs: Path) -> None:
    """Write the results (with figures carried over from the file they replace) and the docs section."""
    from bench.server_bench import write_docs

    results = carry_over(results, path)
    path.write_text(json.dumps(results, indent=2), encoding="utf-8")
    write_docs(render(results), docs)
    print(render(results))


def _row(size: int, got: dict[str, Any]) -> str:
    first = got["replica_first_lookup_ms"]
    pulls = [p["seconds"] for p in got["replica_pull"] if p]
    pull = f"{statistics.median(pulls):.2f} s" if pulls else "?"
    embedded = ", ".join(str(e) for e in got["replica_passages_embedded"])
    current = got.get("current_path_s")
    scratch, ratio = "not measured", ""
    if current is not None:
        scratch = f"{current:.1f} s"
        ratio = f"{current / (first['median'] / 1000):.0f}x"
        if got.get("current_path_carried_over"):
            scratch += f" (measured {got['current_path_measured']})"
    moved = got.get("propagation")
    propagation = (
        f"{moved['median_s']:.2f} s ({moved['min_s']:.2f}-{moved['max_s']:.2f}, {moved['edits']} edits)"
        if moved
        else "not run"
    )
    return (
        f"| {size:,} | {first['median'] / 1000:.1f} s ({first['min'] / 1000:.1f}-{first['max'] / 1000:.1f}) "
        f"| {pull} | {embedded} | {scratch} | {ratio} | {propagation} |"
    )


def render(results: dict[str, Any]) -> str:
    sync = next(
        (g["propagation"]["sync_interval_s"] for g in results["by_size"].values() if "propagation" in g), None
    )
    lines = [
        SECTION,
        "",
        "A new replica with an empty data directory on a Milvus 2.3.5 server that already holds the",
        "knowledge base (`bench/replica_bench.py`): a cold `serve` over stdio to its first lookup",
        "answered, which pulls the shared catalog and embeds nothing, against the path a replica took",
        "before the catalog was shared: `ingest` from scratch with e5-small, then the same cold start",
        "(a figure not measured in this run is the one last measured at that size, with its date;",
        "the replica's own figures then come from a server filled with random unit vectors, whose",
        "catalog it pulls and searches the same way). Propagation: from an ingest's commit of one",
        f"edited document to a serving replica's first lookup that answers it, `sync_interval_s` {sync}.",
        "Synthetic one-chunk documents (bench/corpus.py); load average "
        f"{results.get('load', {}).get('start')} at start, {results.get('load', {}).get('end')} at end.",
        "",
        "| chunks | replica: first answer (median, min-max) | of which catalog pull | passages embedded "
        "| ingest from scratch + first answer | ratio | propagation (median, min-max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for size in results["sizes"]:
        got = results["by_size"].get(str(size))
        lines.append(_row(size, got) if got is not None else f"| {size:,} | not run | | | | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from tests.milvus_server import start, stop

    p = argparse.ArgumentParser(prog="python -m bench.replica_bench", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,10000")
    p.add_argument("--starts", type=int, default=3, help="replica starts per size")
    p.add_argument("--edits", type=int, default=5, help="edits timed per size for propagation (0: skip)")
    p.add_argument("--scratch-sizes", default="1000", help="sizes at which ingest from scratch is measured")
    p.add_argument("--server-uri", default=None, help="use a running server instead of starting one")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "results" / "replicas.json")
    p.add_argument("--docs", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="replica-bench-"))
    uri = args.server_uri
    try:
        if uri is None:
            uri = start(work / "milvus-server").uri
        scratch = tuple(int(s) for s in args.scratch_sizes.split(",") if s)
        sizes = [int(s) for s in args.sizes.split(",")]
        results = run(sizes, uri, work, starts=args.starts, scratch=scratch, edits=args.edits)
    finally:
        if args.server_uri is None:
            stop(work / "milvus-server")
        shutil.rmtree(work, ignore_errors=True)
    save(results, args.results, args.docs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
