"""The catalog's tables and the records read from them and written to them (storage.catalog)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from storage.documents import DocumentFields

SCHEMA_VERSION = "4"
# chunk_vocab (an fts5vocab table) is no longer created; it is listed so that a layout change drops it.
TABLES = ("documents", "chunks", "chunk_terms", "chunk_vocab", "pending", "shared_versions", "meta")
SCHEMA = """
CREATE TABLE IF NOT EXISTS documents (
    doc_key TEXT PRIMARY KEY,
    content_hash TEXT NOT NULL,
    title TEXT NOT NULL,
    domain TEXT NOT NULL,
    keywords TEXT NOT NULL,
    identifiers TEXT NOT NULL,
    summary TEXT NOT NULL,
    domain_description TEXT NOT NULL,
    when_to_retrieve TEXT NOT NULL,
    body TEXT NOT NULL,
    chunk_count INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    languages TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS chunks (
    chunk_id TEXT PRIMARY KEY,
    doc_key TEXT NOT NULL,
    chunk_index INTEGER NOT NULL,
    heading TEXT NOT NULL,
    text TEXT NOT NULL,
    language TEXT NOT NULL,
    lexical_weights TEXT
);
CREATE INDEX IF NOT EXISTS chunks_by_doc ON chunks (doc_key, chunk_index);
CREATE VIRTUAL TABLE IF NOT EXISTS chunk_terms USING fts5(
    chunk_id UNINDEXED, doc_key UNINDEXED, domain UNINDEXED, terms, tokenize = "unicode61 tokenchars '_'"
);
CREATE TABLE IF NOT EXISTS pending (
    doc_key TEXT PRIMARY KEY,
    content_hash TEXT,
    chunk_ids TEXT NOT NULL DEFAULT '[]'
);
-- Which version of the shared catalog (storage.shared_catalog) each document is; empty on Milvus Lite.
CREATE TABLE IF NOT EXISTS shared_versions (doc_key TEXT PRIMARY KEY, version TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
INSERT OR IGNORE INTO meta (key, value) VALUES ('generation', '0');
"""


@dataclass(frozen=True, kw_only=True)
class CatalogEntry(DocumentFields):
    """One document as the catalog lists it: what it says of itself, and what its chunks are."""

    chunk_count: int
    languages: tuple[str, ...] = ()


@dataclass(frozen=True)
class ChunkRecord:
    """One visible chunk: where it sits in its document and what it says."""

    chunk_id: str
    doc_key: str
    index: int
    heading: str
    text: str
    language: str


@dataclass(frozen=True)
class PlannedChunk:
    """A chunk of a document about to be committed."""

    chunk_id: str
    index: int
    heading: str
    text: str
    language: str
    # Token id -> weight (BGE-M3), when this chunk was just embedded by a model that gives them.
    # None for a chunk that kept its id: its stored weights are kept.
    lexical_weights: Mapping[str, float] | None = None


@dataclass(frozen=True)
class DocumentRecord:
    """One document as the catalog holds it, chunks with their text and stored lexical weights."""

    entry: CatalogEntry
    chunks: tuple[PlannedChunk, ...]
