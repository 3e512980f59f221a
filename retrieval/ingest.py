"""Incremental, idempotent ingestion of a knowledge base directory.

Order of operations per changed document, chosen so that a crash at any point leaves the
index consistent: record it as pending -> upsert the new chunks (deterministic ids) ->
commit the catalog row (the visible switch) -> delete the old chunks -> clear pending.
The next run repairs whatever a killed run left pending.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from storage.catalog import Catalog
from storage.documents import Document, DocumentError, discover, load_document
from storage.vector_store import ChunkRow

logger = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]


class PassageEmbedder(Protocol):
    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...


class ChunkStore(Protocol):
    def upsert(self, rows: Sequence[ChunkRow]) -> None: ...

    def delete_document(self, doc_key: str, *, keep_hash: str | None = None) -> None: ...

    def flush_and_load(self) -> None: ...


class IngestError(RuntimeError):
    """The knowledge base directory itself is unusable."""


@dataclass
class IngestReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    chunks: int = 0
    repaired: int = 0
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.deleted or self.repaired)

    def summary(self) -> str:
        line = (
            f"added {len(self.added)}, updated {len(self.updated)}, deleted {len(self.deleted)}, "
            f"skipped {self.skipped}, failed {len(self.failed)}, chunks {self.chunks}, "
            f"seconds {self.seconds:.2f}"
        )
        if self.repaired:
            line += f", repaired {self.repaired} interrupted"
        if not self.changed and not self.failed:
            line += " (no changes)"
        return line


class Ingestor:
    """Brings the catalog and the vector store in line with a directory."""

    def __init__(
        self,
        catalog: Catalog,
        store: ChunkStore,
        embedder: PassageEmbedder,
        *,
        max_chars: int,
        batch_size: int = 32,
    ) -> None:
        self._catalog = catalog
        self._store = store
        self._embedder = embedder
        self._max_chars = max_chars
        self._batch_size = batch_size

    def run(self, root: Path, progress: Progress | None = None) -> IngestReport:
        """Ingest root; every bad file is reported in the result, never raised."""
        started = time.perf_counter()
        if not root.is_dir():
            raise IngestError(f"knowledge base directory {str(root)!r} does not exist or is not a directory")
        report = IngestReport()
        report.repaired = self._repair()
        visible = self._catalog.hashes()
        seen: set[str] = set()
        todo: list[Document] = []
        candidates = list(discover(root))
        for candidate in candidates:
            seen.add(candidate.doc_key)
            try:
                doc = load_document(candidate, max_chars=self._max_chars)
            except DocumentError as exc:
                report.failed.append((exc.doc_key, exc.reason))
                continue
            if visible.get(doc.doc_key) == doc.content_hash:
                report.skipped += 1
            else:
                todo.append(doc)
        total_chunks = sum(len(d.chunks) for d in todo)
        done = 0
        for batch in _batches(todo, self._batch_size * 4):
            self._write(batch, visible, report)
            done += sum(len(d.chunks) for d in batch)
            if progress:
                progress(done, total_chunks, batch[-1].doc_key)
        for doc_key in sorted(set(visible) - seen):
            self._delete(doc_key)
            report.deleted.append(doc_key)
        if report.changed:
            self._store.flush_and_load()
        report.seconds = time.perf_counter() - started
        return report

    def _repair(self) -> int:
        """Undo the vector changes of documents a killed run left pending."""
        pending = self._catalog.pending()
        if not pending:
            return 0
        visible = self._catalog.hashes()
        for doc_key in pending:
            keep = visible.get(doc_key)
            if keep is None:
                self._store.delete_document(doc_key)
            else:
                self._store.delete_document(doc_key, keep_hash=keep)
        self._catalog.clear_pending(pending)
        logger.warning("repaired %d document(s) left pending by an interrupted ingest", len(pending))
        return len(pending)

    def _write(self, docs: list[Document], visible: dict[str, str], report: IngestReport) -> None:
        for doc in docs:
            self._catalog.mark_pending(doc.doc_key, doc.content_hash)
        texts = [text for doc in docs for text in doc.embedding_texts()]
        vectors = self._embedder.embed_passages(texts)
        rows: list[ChunkRow] = []
        position = 0
        for doc in docs:
            for chunk in doc.chunks:
                rows.append(
                    ChunkRow(
                        doc.doc_key,
                        doc.content_hash,
                        chunk.index,
                        doc.domain,
                        chunk.language,
                        vectors[position],
                    )
                )
                position += 1
        self._store.upsert(rows)
        for doc in docs:
            self._catalog.commit_document(doc)
            if doc.doc_key in visible:
                # Only an update has older chunks to drop. A new document's only chunks are the ones
                # just written (a killed run's leftovers were removed by _repair), and a delete by
                # filter costs a scan of the collection: on Milvus Lite ~340 ms per document at 10k
                # unflushed chunks, which made a bulk ingest quadratic.
                self._store.delete_document(doc.doc_key, keep_hash=doc.content_hash)
            (report.updated if doc.doc_key in visible else report.added).append(doc.doc_key)
            report.chunks += len(doc.chunks)
        self._catalog.clear_pending(d.doc_key for d in docs)

    def _delete(self, doc_key: str) -> None:
        self._catalog.mark_pending(doc_key, None)
        self._catalog.remove_document(doc_key)
        self._store.delete_document(doc_key)
        self._catalog.clear_pending([doc_key])


def _batches(docs: list[Document], max_chunks: int) -> list[list[Document]]:
    """Group documents so one embedding call sees about max_chunks passages."""
    batches: list[list[Document]] = []
    current: list[Document] = []
    size = 0
    for doc in docs:
        if current and size + len(doc.chunks) > max_chunks:
            batches.append(current)
            current, size = [], 0
        current.append(doc)
        size += len(doc.chunks)
    if current:
        batches.append(current)
    return batches
