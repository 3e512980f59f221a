"""Ingestion against the embedder alone, on the same texts, in the same run; and where ingest time goes.

Each run ingests a knowledge base into a fresh data directory through the real ``Ingestor``
(discovery, front matter, chunking, embedding, Milvus upsert, catalog commits, flush), and
embeds the same passages with the same model and batch size and nothing else. Runs alternate
which goes first so that drift in machine load does not favour either side. The ingest's store,
embedder and token counter are wrapped in timers, so each run also says how its time divides.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.realistic import embedded_texts
from bench.stats import ratio_summary, summarize
from retrieval.ingest import Ingestor
from server.config.loading import load_settings
from server.container import chunking_rule, open_runtime
from storage.chunking import ChunkingRule


class _Stages:
    """Seconds spent in each wrapped call, by stage."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def timed(self, stage: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - started

        return wrapper


class _TimedStore:
    def __init__(self, inner: Any, stages: _Stages) -> None:
        self.upsert = stages.timed("Milvus upsert", inner.upsert)
        self.delete_chunks = stages.timed("Milvus delete", inner.delete_chunks)
        self.flush_and_load = stages.timed("Milvus flush", inner.flush_and_load)


class _TimedEmbedder:
    def __init__(self, inner: Any, stages: _Stages) -> None:
        self.embed_passages_with_lexical = stages.timed("encoding", inner.embed_passages_with_lexical)
        # Not called by the Ingestor, which takes the lexical path above; the Ingestor's type needs it.
        self.embed_passages = stages.timed("encoding", inner.embed_passages)


def timed_ingest(runtime: Any, kb: Path, stages: _Stages) -> Any:
    """Run the runtime's ingest with its store, model and token counting timed."""
    settings = runtime.settings
    rule = chunking_rule(settings, runtime.embedder)
    counting = ChunkingRule(
        max_chars=rule.max_chars,
        max_tokens=rule.max_tokens,
        count_tokens=stages.timed("chunking: token counting", runtime.embedder.count_tokens),
    )
    ingestor = Ingestor(
        runtime.catalog,
        _TimedStore(runtime.store, stages),
        _TimedEmbedder(runtime.embedder, stages),
        rule=counting,
        batch_size=settings.embedder.batch_size,
    )
    return ingestor.run(kb)


def embed_only(embedder: Any, texts: Sequence[str], batch: int) -> float:
    """Seconds to embed texts in the ingest's batches, and nothing else."""
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        embedder.embed_passages(texts[i : i + batch])
    return time.perf_counter() - started


def _ratio_run(
    kb: Path, data: Path, embedder: Any, *, ingest_first: bool
) -> tuple[float, float, int, int, dict[str, float]]:
    """One run in a fresh data directory: ingest seconds, embed-only seconds, chunks, tokens, stages."""
    shutil.rmtree(data, ignore_errors=True)
    settings = load_settings(None, data_dir=data)
    runtime = open_runtime(settings, embedder=embedder)  # Milvus start-up is not ingestion
    rule = chunking_rule(settings, runtime.embedder)
    texts = embedded_texts(kb, rule)
    tokens = sum(runtime.embedder.count_tokens(t) for t in texts)
    batch = settings.embedder.batch_size * 4  # what one Ingestor embedding call sees
    stages = _Stages()

    def ingest() -> tuple[float, int]:
        started = time.perf_counter()
        report = timed_ingest(runtime, kb, stages)
        elapsed = time.perf_counter() - started
        if report.failed:
            raise RuntimeError(f"documents failed to ingest: {report.failed[:3]}")
        return elapsed, report.chunks

    try:
        if ingest_first:
            (seconds, chunks), embedded = ingest(), embed_only(runtime.embedder, texts, batch)
        else:
            embedded = embed_only(runtime.embedder, texts, batch)
            seconds, chunks = ingest()
    finally:
        runtime.close()
    stages.seconds["everything else (discovery, parsing, catalog)"] = seconds - sum(stages.seconds.values())
    shutil.rmtree(data, ignore_errors=True)
    return seconds, embedded, chunks, tokens, stages.seconds


def ingest_ratio(kb: Path, work: Path, embedder: Any, *, runs: int, label: str) -> dict[str, Any]:
    """chunks/s of a full ingest and of embedding alone, per run, their ratio and the ingest's stages."""
    ingest_s: list[float] = []
    embed_s: list[float] = []
    stage_runs: list[dict[str, float]] = []
    chunks = tokens = 0
    for run in range(runs):
        # Alternate which goes first, so neither always runs on a warmer machine.
        seconds, embedded, chunks, tokens, stages = _ratio_run(
            kb, work / f"ratio-{label}-{run}", embedder, ingest_first=run % 2 == 0
        )
        ingest_s.append(seconds)
        embed_s.append(embedded)
        stage_runs.append(stages)
        print(
            f"  {label} run {run + 1}/{runs}: ingest {seconds:.1f} s ({chunks / seconds:.1f} chunks/s), "
            f"embed-only {embedded:.1f} s",
            file=sys.stderr,
            flush=True,
        )
    ingest_rate = [[chunks / s] for s in ingest_s]
    embed_rate = [[chunks / s] for s in embed_s]
    return {
        "label": label,
        "chunks": chunks,
        "mean_tokens": round(tokens / chunks, 1) if chunks else None,
        "runs": runs,
        "ingest_s": summarize([[s] for s in ingest_s], digits=2),
        "embed_only_s": summarize([[s] for s in embed_s], digits=2),
        "ingest_chunks_per_s": summarize(ingest_rate, digits=2),
        "embed_only_chunks_per_s": summarize(embed_rate, digits=2),
        "ingest_over_embed": ratio_summary(ingest_rate, embed_rate),
        "stages_s": {
            stage: round(statistics.median(r.get(stage, 0.0) for r in stage_runs), 3)
            for stage in stage_runs[0]
        },
    }
