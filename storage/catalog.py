"""The catalog: SQLite rows for every ingested document and chunk, the source of truth for what is visible.

A vector chunk is visible only while its chunk id is one of its document's catalog chunks, so a
document switches from its old chunks to its new ones in the single transaction that rewrites
its rows. Chunk ids are content-addressed, so an unchanged chunk keeps its id (and its vector)
across edits of the rest of its document. ``pending`` rows record documents whose vectors are
being changed, so an ingest killed half-way is repaired by the next one.

The chunk text also feeds an FTS5 table of lexical terms (storage.text.terms): the second
retrieval signal, in the same file and the same transaction, so it works with every Milvus.
Lookups score those terms in memory (storage.lexical_index); FTS5 answers which documents hold
every word of a keyword.
With BGE-M3, each chunk's lexical weights (token id -> weight, from the forward pass that
gave its vector) are a JSON column of its row, written in that same transaction.

On a Milvus server this file is a cache of the shared catalog (storage.shared_catalog): rows are
taken from it (``apply_shared``) and each commit here is sent to it (``record``), and
``shared_versions`` says which of its versions each document is.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from storage.catalog_records import (
    SCHEMA,
    SCHEMA_VERSION,
    TABLES,
    CatalogEntry,
    ChunkRecord,
    DocumentRecord,
    PlannedChunk,
)
from storage.documents import Document
from storage.lexical_index import TermRow
from storage.text import terms

logger = logging.getLogger(__name__)


class Catalog:
    """Synchronous SQLite access; callers on the event loop wrap it in ``asyncio.to_thread``."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        """Open (and create or migrate) the catalog; ``read_only`` opens an existing one as it is."""
        self.path = path
        if read_only:
            self._db = sqlite3.connect(
                f"{path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False, isolation_level=None
            )
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._migrate()

    def reader(self) -> Catalog:
        """A read-only connection of its own to the same file, for a long read beside this one.

        Loading a knowledge view reads the whole catalog (seconds at 100k chunks); on a connection
        of its own it does not hold up the short reads that lookups make on the shared one.
        """
        return Catalog(self.path, read_only=True)

    def _migrate(self) -> None:
        """Create the schema; a catalog of an older layout is emptied, so the next ingest rebuilds it."""
        version = None
        if self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'meta'").fetchone():
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            version = row[0] if row else "1"
            if version != SCHEMA_VERSION:
                logger.warning(
                    "catalog %s has layout %s, this version uses %s: it is emptied; run ingest again",
                    self.path,
                    version,
                    SCHEMA_VERSION,
                )
                for table in reversed(TABLES):
                    self._db.execute(f"DROP TABLE IF EXISTS {table}")
        self._db.executescript(SCHEMA)
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema', ?)", (SCHEMA_VERSION,))

    def close(self) -> None:
        self._db.close()

    @contextmanager
    def snapshot(self) -> Iterator[None]:
        """One read transaction: every read inside it sees the same committed state.

        Without it each SELECT sees the latest commit, so a view assembled from several reads
        while another process ingests could carry one generation's number and the next one's
        documents. A savepoint, so that it also nests inside a transaction already open.
        """
        self._db.execute("SAVEPOINT catalog_snapshot")
        try:
            yield
        finally:
            self._db.execute("RELEASE catalog_snapshot")

    def generation(self) -> int:
        """Bumped by every committed change; readers reload when it moves."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
        return int(row[0])

    def ingested_root(self) -> str | None:
        """The folder the last ingest read (absolute), if one was recorded."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'root'").fetchone()
        return None if row is None else str(row[0])

    def record_ingested_root(self, root: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('root', ?)", (root,))

    def hashes(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT doc_key, content_hash FROM documents"))

    def entries(self) -> list[CatalogEntry]:
        return self._entries("ORDER BY doc_key")

    def _entries(self, where: str, parameters: Sequence[str] = ()) -> list[CatalogEntry]:
        rows = self._db.execute(
            "SELECT doc_key, content_hash, title, domain, keywords, summary, domain_description,"
            f" when_to_retrieve, body, chunk_count, languages, identifiers FROM documents {where}",
            parameters,
        )
        return [
            CatalogEntry(
                doc_key=r[0],
                content_hash=r[1],
                title=r[2],
                domain=r[3],
                keywords=tuple(json.loads(r[4])),
                summary=r[5],
                domain_description=r[6],
                when_to_retrieve=r[7],
                body=r[8],
                chunk_count=r[9],
                languages=tuple(filter(None, r[10].split(","))),
                identifiers=tuple(json.loads(r[11])),
            )
            for r in rows
        ]

    # -- chunks --------------------------------------------------------------------------
    def chunk_index(self) -> dict[str, tuple[str, int, str]]:
        """chunk_id -> (doc_key, chunk_index, language) of every visible chunk."""
        rows = self._db.execute("SELECT chunk_id, doc_key, chunk_index, language FROM chunks")
        return {r[0]: (r[1], r[2], r[3]) for r in rows}

    def chunk_ids(self, doc_key: str) -> list[str]:
        rows = self._db.execute(
            "SELECT chunk_id FROM chunks WHERE doc_key = ? ORDER BY chunk_index", (doc_key,)
        )
        return [r[0] for r in rows]

    def chunks_of(self, doc_key: str) -> list[ChunkRecord]:
        """The document's chunks in order."""
        rows = self._db.execute(
            "SELECT chunk_id, doc_key, chunk_index, heading, text, language FROM chunks"
            " WHERE doc_key = ? ORDER BY chunk_index",
            (doc_key,),
        )
        return [ChunkRecord(*r) for r in rows]

    def chunks_by_id(self, chunk_ids: Sequence[str]) -> dict[str, ChunkRecord]:
        """chunk_id -> the visible chunk, for the ids that are visible."""
        found: dict[str, ChunkRecord] = {}
        for part in _parts(chunk_ids):
            rows = self._db.execute(
                "SELECT chunk_id, doc_key, chunk_index, heading, text, language FROM chunks"
                f" WHERE chunk_id IN ({','.join('?' * len(part))})",
                part,
            )
            found.update((r[0], ChunkRecord(*r)) for r in rows)
        return found

    def lexical_weights(self, chunk_ids: Sequence[str]) -> dict[str, dict[str, float]]:
        """chunk_id -> its stored lexical weights, for the ids that have them."""
        found: dict[str, dict[str, float]] = {}
        for part in _parts(chunk_ids):
            rows = self._db.execute(
                "SELECT chunk_id, lexical_weights FROM chunks"
                f" WHERE lexical_weights IS NOT NULL AND chunk_id IN ({','.join('?' * len(part))})",
                part,
            )
            found.update((r[0], json.loads(r[1])) for r in rows)
        return found

    # -- lexical terms ----------------------------------------------------------------------
    def term_rows(self) -> Iterator[TermRow]:
        """Every visible chunk's lexical terms, in rowid order, one row at a time (storage.lexical_index)."""
        rows = self._db.execute("SELECT chunk_id, doc_key, domain, terms FROM chunk_terms ORDER BY rowid")
        return (TermRow(*row) for row in rows)

    def documents_containing(self, all_terms: Sequence[str], *, limit: int = 3) -> set[str]:
        """Up to ``limit`` documents whose chunks contain every one of the terms."""
        unique = sorted(set(all_terms))
        if not unique:
            return set()
        match = " AND ".join(f'"{t}"' for t in unique)
        rows = self._db.execute(
            "SELECT DISTINCT doc_key FROM chunk_terms WHERE chunk_terms MATCH ? LIMIT ?", (match, limit)
        )
        return {r[0] for r in rows}

    # -- ingest ------------------------------------------------------------------------------
    def pending(self) -> dict[str, tuple[str | None, list[str]]]:
        """doc_key -> (content hash being written, chunk ids being written)."""
        rows = self._db.execute("SELECT doc_key, content_hash, chunk_ids FROM pending")
        return {r[0]: (r[1], json.loads(r[2])) for r in rows}

    def mark_pending(self, doc_key: str, content_hash: str | None, chunk_ids: Iterable[str] = ()) -> None:
        """Record, before touching vectors, that doc_key's vectors are about to change."""
        self._db.execute(
            "INSERT OR REPLACE INTO pending (doc_key, content_hash, chunk_ids) VALUES (?, ?, ?)",
            (doc_key, content_hash, json.dumps(list(chunk_ids))),
        )

    def clear_pending(self, doc_keys: Iterable[str]) -> None:
        self._db.executemany("DELETE FROM pending WHERE doc_key = ?", [(k,) for k in doc_keys])

    def commit_document(self, doc: Document, chunks: Sequence[PlannedChunk]) -> None:
        """Make doc's new chunks the visible ones, atomically."""
        entry = CatalogEntry(
            **doc.fields(), chunk_count=len(chunks), languages=tuple(sorted({c.language for c in chunks}))
        )
        with self._transaction():
            # Chunks that kept their id were not embedded again: carry their weights over.
            kept = dict(
                self._db.execute(
                    "SELECT chunk_id, lexical_weights FROM chunks WHERE doc_key = ?", (doc.doc_key,)
                )
            )
            self._delete_rows(doc.doc_key)
            self._insert(entry, chunks, kept)
            self._bump()

    def _insert(self, entry: CatalogEntry, chunks: Sequence[PlannedChunk], kept: Mapping[str, str]) -> None:
        self._db.execute(
            "INSERT INTO documents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                entry.doc_key,
                entry.content_hash,
                entry.title,
                entry.domain,
                json.dumps(list(entry.keywords), ensure_ascii=False),
                json.dumps(list(entry.identifiers), ensure_ascii=False),
                entry.summary,
                entry.domain_description,
                entry.when_to_retrieve,
                entry.body,
                len(chunks),
                time.time(),
                ",".join(entry.languages),
            ),
        )
        for c in chunks:
            # The FTS row shares the chunk's rowid, so deleting a document's terms is an index probe.
            weights = kept.get(c.chunk_id) if c.lexical_weights is None else _json(c.lexical_weights)
            rowid = self._db.execute(
                "INSERT INTO chunks VALUES (?, ?, ?, ?, ?, ?, ?)",
                (c.chunk_id, entry.doc_key, c.index, c.heading, c.text, c.language, weights),
            ).lastrowid
            self._db.execute(
                "INSERT INTO chunk_terms (rowid, chunk_id, doc_key, domain, terms) VALUES (?, ?, ?, ?, ?)",
                (
                    rowid,
                    c.chunk_id,
                    entry.doc_key,
                    entry.domain,
                    " ".join(terms(f"{entry.title}\n{c.heading}\n{c.text}")),
                ),
            )

    # -- the shared catalog (storage.shared_catalog) ----------------------------------------
    def record(self, doc_key: str) -> DocumentRecord | None:
        """Everything the catalog holds of one document, as another replica's catalog takes it."""
        entry = next((e for e in self._entries("WHERE doc_key = ?", (doc_key,))), None)
        if entry is None:
            return None
        rows = self._db.execute(
            "SELECT chunk_id, chunk_index, heading, text, language, lexical_weights FROM chunks"
            " WHERE doc_key = ? ORDER BY chunk_index",
            (doc_key,),
        )
        chunks = tuple(
            PlannedChunk(r[0], r[1], r[2], r[3], r[4], None if r[5] is None else json.loads(r[5]))
            for r in rows
        )
        return DocumentRecord(entry, chunks)

    def shared_versions(self) -> dict[str, str]:
        """doc_key -> the shared catalog's version this catalog holds (documents taken from it or sent to it)."""
        return dict(self._db.execute("SELECT doc_key, version FROM shared_versions"))

    def mark_shared(self, doc_key: str, version: str) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO shared_versions (doc_key, version) VALUES (?, ?)", (doc_key, version)
        )

    def apply_shared(self, records: Sequence[tuple[DocumentRecord, str]], removed: Sequence[str]) -> None:
        """Take documents (with their shared version) and removals from the shared catalog, in one transaction."""
        if not records and not removed:
            return
        with self._transaction():
            for record, version in records:
                self._delete_rows(record.entry.doc_key)
                self._insert(record.entry, record.chunks, {})
                self.mark_shared(record.entry.doc_key, version)
            for doc_key in removed:
                self._delete_rows(doc_key)
            self._bump()

    def remove_document(self, doc_key: str) -> None:
        with self._transaction():
            self._delete_rows(doc_key)
            self._bump()

    def forget_all(self) -> int:
        """Empty the catalog in one transaction (its vectors are gone); how many documents it listed."""
        with self._transaction():
            count = int(self._db.execute("SELECT COUNT(*) FROM documents").fetchone()[0])
            pending = self._db.execute("SELECT 1 FROM pending LIMIT 1").fetchone()
            if count or pending:
                for table in ("chunk_terms", "chunks", "documents", "pending", "shared_versions"):
                    self._db.execute(f"DELETE FROM {table}")
                self._bump()
        return count

    def _delete_rows(self, doc_key: str) -> None:
        self._db.execute(
            "DELETE FROM chunk_terms WHERE rowid IN (SELECT rowid FROM chunks WHERE doc_key = ?)", (doc_key,)
        )
        self._db.execute("DELETE FROM chunks WHERE doc_key = ?", (doc_key,))
        self._db.execute("DELETE FROM documents WHERE doc_key = ?", (doc_key,))
        # Changed here: the shared catalog's version, if any, is no longer what this catalog holds.
        self._db.execute("DELETE FROM shared_versions WHERE doc_key = ?", (doc_key,))

    def _bump(self) -> None:
        self._db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation'")

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


# SQLite's default cap on host parameters is 999 in older builds; stay well under it.
_PART = 500


def _parts(ids: Sequence[str]) -> list[list[str]]:
    unique = list(dict.fromkeys(ids))
    return [unique[i : i + _PART] for i in range(0, len(unique), _PART)]


def _json(weights: Mapping[str, float]) -> str:
    return json.dumps(dict(weights), separators=(",", ":"))


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
