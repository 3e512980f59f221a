"""The catalog: one SQLite row per ingested document, the source of truth for what is visible.

A vector chunk is visible only while its (doc_key, doc_hash) matches the catalog, so a document's
chunks switch from old to new in the single transaction that updates its row. ``pending`` rows
record documents whose vectors are being changed, so an ingest killed half-way is repaired
by the next one.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from storage.documents import Document

_SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    doc_key TEXT PRIMARY KEY,
    content_hash TEXT NOT NULL,
    title TEXT NOT NULL,
    domain TEXT NOT NULL,
    keywords TEXT NOT NULL,
    summary TEXT NOT NULL,
    domain_description TEXT NOT NULL,
    when_to_retrieve TEXT NOT NULL,
    body TEXT NOT NULL,
    chunk_count INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    languages TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS pending (
    doc_key TEXT PRIMARY KEY,
    content_hash TEXT
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta (key, value) VALUES ('generation', '0');
"""


@dataclass(frozen=True)
class CatalogEntry:
    doc_key: str
    content_hash: str
    title: str
    domain: str
    keywords: tuple[str, ...]
    summary: str
    domain_description: str
    when_to_retrieve: str
    body: str
    chunk_count: int
    languages: tuple[str, ...] = ()


class Catalog:
    """Synchronous SQLite access; callers on the event loop wrap it in ``asyncio.to_thread``."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def generation(self) -> int:
        """Bumped by every committed change; readers reload when it moves."""
        row = self._db.execute("SELECT value FROM meta WHERE key = 'generation'").fetchone()
        return int(row[0])

    def hashes(self) -> dict[str, str]:
        return dict(self._db.execute("SELECT doc_key, content_hash FROM documents"))

    def entries(self) -> list[CatalogEntry]:
        rows = self._db.execute(
            "SELECT doc_key, content_hash, title, domain, keywords, summary, domain_description,"
            " when_to_retrieve, body, chunk_count, languages FROM documents ORDER BY doc_key"
        )
        return [
            CatalogEntry(
                r[0],
                r[1],
                r[2],
                r[3],
                tuple(json.loads(r[4])),
                r[5],
                r[6],
                r[7],
                r[8],
                r[9],
                tuple(filter(None, r[10].split(","))),
            )
            for r in rows
        ]

    def pending(self) -> dict[str, str | None]:
        return dict(self._db.execute("SELECT doc_key, content_hash FROM pending"))

    def mark_pending(self, doc_key: str, content_hash: str | None) -> None:
        """Record, before touching vectors, that doc_key's vectors are about to change."""
        self._db.execute(
            "INSERT OR REPLACE INTO pending (doc_key, content_hash) VALUES (?, ?)", (doc_key, content_hash)
        )

    def clear_pending(self, doc_keys: Iterable[str]) -> None:
        self._db.executemany("DELETE FROM pending WHERE doc_key = ?", [(k,) for k in doc_keys])

    def commit_document(self, doc: Document) -> None:
        """Make doc's new chunks the visible ones, atomically."""
        with self._transaction():
            self._db.execute(
                "INSERT OR REPLACE INTO documents VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    doc.doc_key,
                    doc.content_hash,
                    doc.title,
                    doc.domain,
                    json.dumps(list(doc.keywords), ensure_ascii=False),
                    doc.summary,
                    doc.domain_description,
                    doc.when_to_retrieve,
                    doc.body,
                    len(doc.chunks),
                    time.time(),
                    ",".join(sorted({chunk.language for chunk in doc.chunks})),
                ),
            )
            self._bump()

    def remove_document(self, doc_key: str) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM documents WHERE doc_key = ?", (doc_key,))
            self._bump()

    def _bump(self) -> None:
        self._db.execute("UPDATE meta SET value = CAST(value AS INTEGER) + 1 WHERE key = 'generation'")

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._db.execute("COMMIT" if exc_type is None else "ROLLBACK")
