"""Incremental, idempotent ingestion of a knowledge base directory.

Order of operations per changed document, chosen so that a crash at any point leaves the
index consistent: record it as pending (with every chunk id it touches) -> embed and upsert
only the chunks whose text is new (content-addressed ids) -> commit the catalog rows (the
visible switch) -> delete the chunks the new version dropped -> clear pending. The next run
repairs whatever a killed run left pending. An unchanged chunk is never embedded again,
whatever else changed in its document. With BGE-M3, the same forward pass that embeds a new
chunk gives its lexical weights, which the catalog stores with the chunk's row.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from retrieval.sparse import LexicalWeights
from storage.catalog import Catalog
from storage.catalog_records import PlannedChunk
from storage.chunking import ChunkingRule
from storage.convert.worker import ConversionWorker
from storage.discovery import Candidate, DocumentError, discover, read_source
from storage.documents import Document, content_hash, load_document
from storage.vector_store import ChunkRow, chunk_id

logger = logging.getLogger(__name__)

Progress = Callable[[int, int, str], None]


class PassageEmbedder(Protocol):
    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...


@runtime_checkable
class LexicalPassageEmbedder(Protocol):
    """A passage embedder that may also give lexical weights from the same forward pass."""

    def embed_passages_with_lexical(
        self, texts: Sequence[str]
    ) -> tuple[np.ndarray, list[LexicalWeights] | None]: ...


class ChunkStore(Protocol):
    def upsert(self, rows: Sequence[ChunkRow]) -> None: ...

    def delete_chunks(self, chunk_ids: Sequence[str]) -> None: ...

    def flush_and_load(self) -> None: ...


class CatalogMirror(Protocol):
    """The shared catalog of a Milvus server (storage.shared_sync.SharedMirror), told of every commit."""

    def exclusive(self) -> AbstractContextManager[None]:
        """Hold the store's ingest lease, with the local catalog brought to the shared one first."""
        ...

    def publish(self, doc_key: str) -> None: ...

    def withdraw(self, doc_key: str) -> None: ...

    def commit(self) -> None: ...


class IngestError(RuntimeError):
    """The knowledge base directory itself is unusable."""


class ForeignRootError(IngestError):
    """The directory is another knowledge base than the one this catalog holds (nothing was changed)."""


@dataclass
class IngestReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)
    chunks: int = 0
    embedded: int = 0  # chunks whose text was new and had to be embedded
    repaired: int = 0
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.deleted or self.repaired)

    def summary(self) -> str:
        line = (
            f"added {len(self.added)}, updated {len(self.updated)}, deleted {len(self.deleted)}, "
            f"skipped {self.skipped}, failed {len(self.failed)}, chunks {self.chunks} "
            f"({self.embedded} embedded), seconds {self.seconds:.2f}"
        )
        if self.repaired:
            line += f", repaired {self.repaired} interrupted"
        if not self.changed and not self.failed:
            line += " (no changes)"
        return line


@dataclass(frozen=True)
class _Plan:
    """One changed document: its chunks, and which of them need a vector."""

    doc: Document
    chunks: tuple[PlannedChunk, ...]
    texts: dict[str, str]  # chunk id -> embedded text, for the new chunks only
    dropped: tuple[str, ...]  # chunk ids of the old version that the new one no longer has


class Ingestor:
    """Brings the catalog and the vector store in line with a directory."""

    def __init__(
        self,
        catalog: Catalog,
        store: ChunkStore,
        embedder: PassageEmbedder,
        *,
        rule: ChunkingRule,
        batch_size: int = 32,
        converter: ConversionWorker | None = None,
        mirror: CatalogMirror | None = None,
    ) -> None:
        self._catalog = catalog
        self._mirror = mirror
        self._store = store
        self._embedder = embedder
        self._rule = rule
        self._batch_size = batch_size
        # HTML, PDF, Word and PowerPoint files convert in this bounded child (None: in process).
        self._converter = converter

    def run(self, root: Path, progress: Progress | None = None, *, replace: bool = False) -> IngestReport:
        """Ingest root; every bad file is reported in the result, never raised.

        ForeignRootError, before anything changes, when root is another folder than the one this
        catalog was ingested from, that folder is still there and this run would delete documents
        of it: most likely a second knowledge base pointed at the same data directory. ``replace``
        lets it replace the first.

        With a shared catalog (a Milvus server), the whole run holds its ingest lease, and every
        document committed here is sent to it: replicas take it when the generation moves.
        """
        if not root.is_dir():
            raise IngestError(f"knowledge base directory {str(root)!r} does not exist or is not a directory")
        with self._mirror.exclusive() if self._mirror is not None else contextlib.nullcontext():
            return self._run(root, progress, replace=replace)

    def _run(self, root: Path, progress: Progress | None, *, replace: bool) -> IngestReport:
        started = time.perf_counter()
        report = IngestReport()
        report.repaired = self._repair()
        visible = self._catalog.hashes()
        seen: set[str] = set()
        todo: list[_Plan] = []
        try:
            for candidate in discover(root):
                seen.add(candidate.doc_key)
                try:
                    doc = self._load_changed(candidate, visible.get(candidate.doc_key))
                except DocumentError as exc:
                    report.failed.append((exc.doc_key, exc.reason))
                    continue
                if doc is None:
                    report.skipped += 1
                else:
                    todo.append(self._plan(doc))
        finally:
            if self._converter is not None:
                self._converter.close()
        resolved = str(root.resolve())
        if not replace:
            self._refuse_a_foreign_root(resolved, len(set(visible) - seen))
        self._catalog.record_ingested_root(resolved)
        total = sum(len(p.texts) for p in todo)
        done = 0
        for batch in _batches(todo, self._batch_size * 4):
            self._write(batch, visible, report)
            done += sum(len(p.texts) for p in batch)
            if progress:
                progress(done, total, batch[-1].doc.doc_key)
        for doc_key in sorted(set(visible) - seen):
            self._delete(doc_key)
            report.deleted.append(doc_key)
        if self._mirror is not None:
            self._mirror.commit()
        if report.changed:
            self._store.flush_and_load()
        report.seconds = time.perf_counter() - started
        return report

    def _load_changed(self, candidate: Candidate, visible_hash: str | None) -> Document | None:
        """The document, or None when its bytes are the ones ingested (before any conversion)."""
        raw = read_source(candidate)
        if content_hash(raw, rule=self._rule, doc_key=candidate.doc_key) == visible_hash:
            return None
        convert = self._converter.convert if self._converter is not None else None
        return load_document(candidate, rule=self._rule, raw=raw, convert=convert)

    def _refuse_a_foreign_root(self, root: str, deleting: int) -> None:
        previous = self._catalog.ingested_root()
        # A folder that is gone was most likely moved or renamed: its documents keep their keys.
        if deleting and previous is not None and previous != root and Path(previous).is_dir():
            raise ForeignRootError(
                f"{root!r} is not the folder this data directory was ingested from ({previous!r}, "
                f"still there): ingesting it would delete {deleting} of that folder's documents. "
                "Use another --data-dir for a second knowledge base, or replace that one with "
                f"`lookup-knowledge-mcp ingest {root} --replace`"
            )

    def _plan(self, doc: Document) -> _Plan:
        existing = set(self._catalog.chunk_ids(doc.doc_key))
        occurrences: dict[str, int] = {}
        chunks: list[PlannedChunk] = []
        texts: dict[str, str] = {}
        for chunk, text in zip(doc.chunks, doc.embedding_texts(), strict=True):
            occurrence = occurrences[text] = occurrences.get(text, -1) + 1
            cid = chunk_id(doc.doc_key, text, occurrence)
            chunks.append(PlannedChunk(cid, chunk.index, chunk.heading, chunk.text, chunk.language))
            if cid not in existing:
                texts[cid] = text
        dropped = tuple(sorted(existing - {c.chunk_id for c in chunks}))
        return _Plan(doc, tuple(chunks), texts, dropped)

    def _repair(self) -> int:
        """Undo the vector changes of documents a killed run left pending."""
        pending = self._catalog.pending()
        if not pending:
            return 0
        for doc_key, (_, touched) in pending.items():
            visible = set(self._catalog.chunk_ids(doc_key))
            self._store.delete_chunks([cid for cid in touched if cid not in visible])
        self._catalog.clear_pending(pending)
        logger.warning("repaired %d document(s) left pending by an interrupted ingest", len(pending))
        return len(pending)

    def _write(self, plans: list[_Plan], visible: dict[str, str], report: IngestReport) -> None:
        for plan in plans:
            touched = [*plan.texts, *plan.dropped]
            self._catalog.mark_pending(plan.doc.doc_key, plan.doc.content_hash, touched)
        new = [(cid, text, plan) for plan in plans for cid, text in plan.texts.items()]
        vectors, lexical = self._encode([text for _, text, _ in new])
        languages = {c.chunk_id: c.language for plan in plans for c in plan.chunks}
        self._store.upsert(
            [
                ChunkRow(cid, plan.doc.doc_key, plan.doc.domain, languages[cid], vectors[i])
                for i, (cid, _, plan) in enumerate(new)
            ]
        )
        weights = {cid: lexical[i] for i, (cid, _, _) in enumerate(new)} if lexical else {}
        for plan in plans:
            doc = plan.doc
            chunks = (
                [replace(c, lexical_weights=weights.get(c.chunk_id)) for c in plan.chunks]
                if weights
                else plan.chunks
            )
            self._catalog.commit_document(doc, chunks)
            if self._mirror is not None:
                self._mirror.publish(doc.doc_key)
            self._store.delete_chunks(plan.dropped)
            (report.updated if doc.doc_key in visible else report.added).append(doc.doc_key)
            report.chunks += len(plan.chunks)
            report.embedded += len(plan.texts)
        self._catalog.clear_pending(p.doc.doc_key for p in plans)
        if self._mirror is not None:
            self._mirror.commit()  # replicas take this batch while the next one embeds

    def _encode(self, texts: list[str]) -> tuple[np.ndarray | list[np.ndarray], list[LexicalWeights] | None]:
        """Vectors of the new chunks and, when the embedder gives them, their lexical weights."""
        if not texts:
            return [], None
        if isinstance(self._embedder, LexicalPassageEmbedder):
            return self._embedder.embed_passages_with_lexical(texts)
        return self._embedder.embed_passages(texts), None

    def _delete(self, doc_key: str) -> None:
        ids = self._catalog.chunk_ids(doc_key)
        self._catalog.mark_pending(doc_key, None, ids)
        self._catalog.remove_document(doc_key)
        if self._mirror is not None:
            self._mirror.withdraw(doc_key)
        self._store.delete_chunks(ids)
        self._catalog.clear_pending([doc_key])


def _batches(plans: list[_Plan], max_chunks: int) -> list[list[_Plan]]:
    """Group documents so one embedding call sees about max_chunks new passages."""
    batches: list[list[_Plan]] = []
    current: list[_Plan] = []
    size = 0
    for plan in plans:
        if current and size + len(plan.texts) > max_chunks:
            batches.append(current)
            current, size = [], 0
        current.append(plan)
        size += len(plan.texts)
    if current:
        batches.append(current)
    return batches
