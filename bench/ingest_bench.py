"""Ingestion throughput against the embedder alone, on the same texts, in the same run.

Each run ingests the same small knowledge base into a fresh data directory through the real
``Ingestor`` (discovery, front matter, embedding, Milvus upsert, catalog commits, flush), and
embeds the same passages with the same model and batch size and nothing else. Runs alternate
which goes first so that drift in machine load does not favour either side.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

from bench.stats import ratio_summary, summarize
from server.runtime import open_runtime
from server.settings import load_settings
from storage.documents import discover, load_document


def _embedding_texts(root: Path, max_chars: int) -> list[str]:
    return [text for c in discover(root) for text in load_document(c, max_chars=max_chars).embedding_texts()]


def ingest_ratio(kb: Path, work: Path, embedder: Any, *, runs: int) -> dict[str, Any]:
    """chunks/s of a full ingest and passages/s of embedding alone, per run, and their ratio."""
    ingest_s: list[float] = []
    embed_s: list[float] = []
    chunks = 0
    for run in range(runs):
        data = work / f"ratio-run-{run}"
        shutil.rmtree(data, ignore_errors=True)
        settings = load_settings(None, data_dir=data)
        texts = _embedding_texts(kb, settings.chunking.max_chars)
        batch = settings.embedder.batch_size * 4  # what one Ingestor embedding call sees

        def embed_only(texts: list[str] = texts, batch: int = batch) -> float:
            started = time.perf_counter()
            for i in range(0, len(texts), batch):
                embedder.embed_passages(texts[i : i + batch])
            return time.perf_counter() - started

        def ingest(settings: Any = settings) -> tuple[float, int]:
            runtime = open_runtime(settings, embedder=embedder)  # Milvus start-up is not ingestion
            try:
                started = time.perf_counter()
                report = runtime.ingestor().run(kb)
                elapsed = time.perf_counter() - started
            finally:
                runtime.close()
            if report.failed:
                raise RuntimeError(f"synthetic documents failed to ingest: {report.failed[:3]}")
            return elapsed, report.chunks

        if run % 2 == 0:
            (seconds, chunks), embedded = ingest(), embed_only()
        else:
            embedded = embed_only()
            seconds, chunks = ingest()
        ingest_s.append(seconds)
        embed_s.append(embedded)
        shutil.rmtree(data, ignore_errors=True)
        print(
            f"  ingest run {run + 1}/{runs}: {chunks / seconds:.1f} chunks/s ingest, "
            f"{len(texts) / embedded:.1f} passages/s embed-only",
            file=sys.stderr,
            flush=True,
        )
    ingest_rate = [[chunks / s] for s in ingest_s]
    embed_rate = [[chunks / s] for s in embed_s]
    return {
        "chunks": chunks,
        "runs": runs,
        "ingest_chunks_per_s": summarize(ingest_rate, digits=1),
        "embed_only_passages_per_s": summarize(embed_rate, digits=1),
        "ingest_over_embed": ratio_summary(ingest_rate, embed_rate),
    }
