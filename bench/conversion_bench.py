"""Conversion of HTML, PDF, Word and PowerPoint files against embedding the text they give.

Per format, the files of a mixed knowledge base are converted in process (the converter's own
cost) and their chunks embedded with the same model and batch size the ingest uses; the ratio
says how much conversion adds to the embedding a file needs anyway. Then the whole mixed
knowledge base (the sample's markdown, both export examples, and the built files) is ingested
through the real Ingestor and its bounded conversion child, with the child's calls timed: the
conversion share is their time, child start-up included, over the ingest's.

``python -m bench.conversion_bench`` runs it alone; ``bench.run`` runs it as one of its steps.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from retrieval.ingest import Ingestor
from server.config.loading import load_settings
from server.container import chunking_rule, conversion_limits, open_runtime
from storage.convert import convert_bytes
from storage.convert.worker import ConversionWorker
from storage.discovery import Candidate
from storage.documents import load_document
from tests.office_files import (
    FIRST_WEEK,
    OUTAGE,
    RELEASES,
    TRAVEL,
    Outline,
    docx_bytes,
    html_bytes,
    pdf_bytes,
    pptx_bytes,
)

ROOT = Path(__file__).resolve().parent.parent
BUILDERS = {".pdf": pdf_bytes, ".docx": docx_bytes, ".pptx": pptx_bytes, ".html": html_bytes}
OUTLINES = (TRAVEL, FIRST_WEEK, OUTAGE, RELEASES)


def _variant(outline: Outline, number: int) -> Outline:
    """The outline as the n-th document of its kind: its own title, codes and a sentence of its own."""
    sections = tuple(
        (heading, (*paragraphs, f"Revision {number} of this section applies to site {number}."))
        for heading, paragraphs in outline.sections
    )
    table = (outline.table[0], *((f"{row[0]}_{number}", *row[1:]) for row in outline.table[1:]))
    return replace(outline, title=f"{outline.title} {number}", sections=sections, table=table)


def build_mixed(root: Path, per_format: int) -> dict[str, list[str]]:
    """Write the mixed knowledge base under root; the doc_keys of the built files, by suffix."""
    shutil.copytree(ROOT / "examples" / "knowledge", root, dirs_exist_ok=True)
    shutil.copytree(ROOT / "examples" / "confluence-export", root, dirs_exist_ok=True)
    shutil.copytree(ROOT / "examples" / "notion-export", root, dirs_exist_ok=True)
    built: dict[str, list[str]] = {suffix: [] for suffix in BUILDERS}
    for suffix, build in BUILDERS.items():
        for number in range(per_format):
            key = f"converted-{suffix[1:]}/doc-{number}{suffix}"
            path = root / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(build(_variant(OUTLINES[number % len(OUTLINES)], number)))
            built[suffix].append(key)
    return built


def per_format(
    root: Path, built: dict[str, list[str]], embedder: Any, rule: Any, batch: int
) -> dict[str, Any]:
    """Per format: conversion seconds in process, embedding seconds of the same chunks, their ratio."""
    rows: dict[str, Any] = {}
    for suffix, keys in built.items():
        convert_bytes((root / keys[0]).read_bytes(), suffix)  # the converter's imports are not its cost
        convert_s = embed_s = 0.0
        chunks = 0
        for key in keys:
            raw = (root / key).read_bytes()
            started = time.perf_counter()
            convert_bytes(raw, suffix)
            convert_s += time.perf_counter() - started
            doc = load_document(Candidate(key, root / key), rule=rule, raw=raw)
            texts = doc.embedding_texts()
            chunks += len(texts)
            started = time.perf_counter()
            for i in range(0, len(texts), batch):
                embedder.embed_passages(texts[i : i + batch])
            embed_s += time.perf_counter() - started
        rows[suffix] = {
            "files": len(keys),
            "chunks": chunks,
            "convert_ms_per_file": round(1000 * convert_s / len(keys), 1),
            "embed_ms_per_file": round(1000 * embed_s / len(keys), 1),
            "convert_over_embed": round(convert_s / embed_s, 3) if embed_s else None,
        }
    return rows


class _TimedWorker(ConversionWorker):
    seconds = 0.0
    files = 0

    def convert(self, raw: bytes, suffix: str) -> Any:
        started = time.perf_counter()
        try:
            return super().convert(raw, suffix)
        finally:
            self.seconds += time.perf_counter() - started
            self.files += 1


def mixed_ingest(root: Path, work: Path, embedder: Any, run: int) -> dict[str, Any]:
    """A fresh ingest of the mixed knowledge base, with the conversion child's calls timed."""
    data = work / f"conversion-ingest-{run}"
    shutil.rmtree(data, ignore_errors=True)
    settings = load_settings(None, data_dir=data)
    runtime = open_runtime(settings, embedder=embedder)
    worker = _TimedWorker(conversion_limits(settings))
    try:
        rule = chunking_rule(settings, runtime.embedder)
        ingestor = Ingestor(
            runtime.catalog,
            runtime.store,
            runtime.embedder,
            rule=rule,
            batch_size=settings.embedder.batch_size,
            converter=worker,
        )
        report = ingestor.run(root)
    finally:
        runtime.close()
        shutil.rmtree(data, ignore_errors=True)
    if report.failed:
        raise RuntimeError(f"documents failed to ingest: {report.failed[:3]}")
    return {
        "documents": len(report.added),
        "converted_files": worker.files,
        "chunks": report.chunks,
        "ingest_s": round(report.seconds, 2),
        "conversion_s": round(worker.seconds, 2),
        "conversion_share": round(worker.seconds / report.seconds, 3),
    }


def measure(work: Path, embedder: Any, *, per_format_files: int = 12, runs: int = 3) -> dict[str, Any]:
    """Per-format conversion against embedding, and the conversion share of a mixed ingest (median)."""
    root = work / "conversion-kb"
    shutil.rmtree(root, ignore_errors=True)
    built = build_mixed(root, per_format_files)
    settings = load_settings(None, data_dir=work / "conversion-probe")
    rule = chunking_rule(settings, embedder)
    formats = per_format(root, built, embedder, rule, settings.embedder.batch_size * 4)
    ingests = [mixed_ingest(root, work, embedder, run) for run in range(runs)]
    for row in ingests:
        print(f"  mixed ingest: {json.dumps(row)}", file=sys.stderr, flush=True)
    median = statistics.median(r["conversion_share"] for r in ingests)
    return {"per_format": formats, "mixed_ingests": ingests, "conversion_share": median}


def main() -> int:
    from retrieval.embedders import CachedEmbedder, create_embedder

    embedder = CachedEmbedder(create_embedder("e5-small"), size=4096)
    with tempfile.TemporaryDirectory() as work:
        result = measure(Path(work), embedder)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
