"""The catalog in a Milvus server, so that replicas without a shared disk serve one knowledge base.

With ``milvus.uri`` naming a server, every replica's SQLite catalog (storage.catalog) is a cache of
this collection, ``<vector collection>_catalog``, beside the vectors. Its rows, all in one schema:

- ``part``: a document as the catalog holds it (entry, chunks with their text and lexical weights),
  zlib-compressed JSON in base64, cut into pieces that fit a VARCHAR (65,535 bytes). Parts are
  named by the version (a hash of the whole record), so a version's parts never change.
- ``head``: one per document, naming its current version and how many parts it has. Writing the
  parts first and the head last makes the head the per-document switch: a reader that finds a head
  finds all of its parts, and a reader that finds fewer (the ingest that replaced them already
  deleted them) skips the document until its next pull.
- ``meta``: the committed generation (bumped once per ingest batch, so replicas pull when it
  moves) and the ingest lease (storage.shared_lease).

Milvus 2.3 requires a vector field in every collection: rows carry a constant 2-dimensional one.
Every read is Strong (the collection's default): a row is read back as soon as it is written.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from storage.catalog_records import CatalogEntry, DocumentRecord, PlannedChunk
from storage.vector_store import create_or_load, string_literal

if TYPE_CHECKING:
    from pymilvus import MilvusClient

logger = logging.getLogger(__name__)

SUFFIX = "_catalog"
# A VARCHAR holds up to 65,535 bytes; base64 is one byte a character.
_PART_CHARS = 60_000
# Parts written per request: at most ~12 MB, under gRPC's message limits.
_BATCH_PARTS = 200
# Parts read per request: up to ~8 MB and 4,096 ids. Each Strong read waits for the server's
# next time tick (~200 ms on 2.3), so reading 200 parts at a time took 11 s for 10k documents.
_READ_BYTES = 8_000_000
_READ_IDS = 4096
_QUERY_CAP = 16_384
_BLANK = [0.0, 0.0]
_GENERATION_ID = "m:generation"
LEASE_ID = "m:lease"


@dataclass(frozen=True)
class Head:
    """A document's current version in the shared catalog."""

    doc_key: str
    content_hash: str
    version: str
    parts: int
    size: int = 0  # characters of all its parts together (0: unknown, taken as full parts)


def encode(record: DocumentRecord) -> tuple[str, list[str]]:
    """The record's version (a hash of it) and its parts."""
    entry = record.entry
    payload = json.dumps(
        {
            "entry": [
                entry.doc_key,
                entry.content_hash,
                entry.title,
                entry.domain,
                list(entry.keywords),
                entry.summary,
                entry.domain_description,
                entry.when_to_retrieve,
                entry.body,
                entry.chunk_count,
                list(entry.languages),
                list(entry.identifiers),
            ],
            "chunks": [
                [c.chunk_id, c.index, c.heading, c.text, c.language, c.lexical_weights] for c in record.chunks
            ],
        },
        ensure_ascii=False,
        separators=(",", ":"),
        sort_keys=True,
    ).encode()
    version = hashlib.sha1(payload).hexdigest()
    packed = base64.b64encode(zlib.compress(payload, 6)).decode("ascii")
    return version, [packed[i : i + _PART_CHARS] for i in range(0, len(packed), _PART_CHARS)] or [""]


def decode(parts: Sequence[str]) -> DocumentRecord:
    """The record that encode cut into parts (in order)."""
    data = json.loads(zlib.decompress(base64.b64decode("".join(parts))))
    e = data["entry"]
    entry = CatalogEntry(
        doc_key=e[0],
        content_hash=e[1],
        title=e[2],
        domain=e[3],
        keywords=tuple(e[4]),
        summary=e[5],
        domain_description=e[6],
        when_to_retrieve=e[7],
        body=e[8],
        chunk_count=e[9],
        languages=tuple(e[10]),
        identifiers=tuple(e[11]),
    )
    chunks = tuple(PlannedChunk(c[0], c[1], c[2], c[3], c[4], c[5]) for c in data["chunks"])
    return DocumentRecord(entry, chunks)


def _head_id(doc_key: str) -> str:
    return "h:" + hashlib.sha1(doc_key.encode()).hexdigest()


def _part_id(version: str, number: int) -> str:
    return f"p:{version}:{number}"


class SharedCatalog:
    """The catalog collection on a Milvus server (synchronous: callers on the event loop use to_thread)."""

    def __init__(self, client: MilvusClient, collection: str) -> None:
        self._client = client
        self.collection = collection

    def close(self) -> None:
        self._client.close()

    def ensure(self, timeout_s: float) -> bool:
        """Create the collection (True), or load the existing one."""
        return create_or_load(self._client, self.collection, self._create, timeout_s)

    def _create(self) -> None:
        from pymilvus import DataType, MilvusClient

        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
        schema.add_field("kind", DataType.VARCHAR, max_length=8)
        schema.add_field("doc_key", DataType.VARCHAR, max_length=2048)
        schema.add_field("content_hash", DataType.VARCHAR, max_length=128)
        schema.add_field("version", DataType.VARCHAR, max_length=64)
        schema.add_field("seq", DataType.INT64)
        schema.add_field("data", DataType.VARCHAR, max_length=65535)
        schema.add_field("blank", DataType.FLOAT_VECTOR, dim=len(_BLANK))
        index = self._client.prepare_index_params()
        index.add_index(field_name="blank", index_type="FLAT", metric_type="L2")
        self._client.create_collection(
            self.collection, schema=schema, index_params=index, consistency_level="Strong"
        )

    # -- meta rows ------------------------------------------------------------------------------
    def meta(self, row_id: str) -> tuple[str, int] | None:
        """(data, seq) of a meta row, None when it was never written."""
        rows = self._client.get(
            self.collection, ids=[row_id], output_fields=["data", "seq"], consistency_level="Strong"
        )
        return (str(rows[0]["data"]), int(rows[0]["seq"])) if rows else None

    def write_meta(self, row_id: str, data: str, seq: int) -> None:
        self._client.upsert(self.collection, [self._row(row_id, "meta", data=data, seq=seq)])

    def delete_meta(self, row_id: str) -> None:
        self._client.delete(self.collection, ids=[row_id])

    def generation(self) -> int | None:
        """The committed generation; None while nothing was ever committed here."""
        found = self.meta(_GENERATION_ID)
        return None if found is None else found[1]

    def set_generation(self, generation: int) -> None:
        self.write_meta(_GENERATION_ID, "", generation)

    # -- documents --------------------------------------------------------------------------------
    def heads(self) -> dict[str, Head]:
        """doc_key -> its head, for every document."""
        rows = self._query_all(
            kind_filter("head"), "h:", ["doc_key", "content_hash", "version", "seq", "data"]
        )
        return {
            r["doc_key"]: Head(
                r["doc_key"], r["content_hash"], r["version"], int(r["seq"]), int(r["data"] or 0)
            )
            for r in rows
        }

    def _query_all(self, expr: str, prefix: str, fields: list[str]) -> list[dict[str, Any]]:
        """Every row matching expr whose id starts with prefix, at Strong consistency.

        A query returns at most 16,384 rows; a full answer is asked again per next hex digit of the
        id (head ids end in a SHA-1). Not query_iterator: against Milvus 2.3 it falls back to a
        client-side timestamp, which is not Strong for a client that wrote nothing.
        """
        rows = self._client.query(
            self.collection,
            filter=f"{expr} and id like {string_literal(prefix + '%')}",
            output_fields=fields,
            limit=_QUERY_CAP,
            consistency_level="Strong",
        )
        if len(rows) < _QUERY_CAP:
            return list(rows)
        return [row for digit in "0123456789abcdef" for row in self._query_all(expr, prefix + digit, fields)]

    def records(self, heads: Sequence[Head]) -> Iterator[tuple[DocumentRecord, str]]:
        """The records (with their version) of heads whose parts are all there, in batches of parts."""
        batch: list[Head] = []
        size = 0
        for head in heads:
            weight = head.size or head.parts * _PART_CHARS
            if batch and (
                size + weight > _READ_BYTES or sum(h.parts for h in batch) + head.parts > _READ_IDS
            ):
                yield from self._fetch(batch)
                batch, size = [], 0
            batch.append(head)
            size += weight
        if batch:
            yield from self._fetch(batch)

    def _fetch(self, heads: Sequence[Head]) -> Iterator[tuple[DocumentRecord, str]]:
        ids = [_part_id(h.version, n) for h in heads for n in range(h.parts)]
        rows = self._client.get(self.collection, ids=ids, output_fields=["data"], consistency_level="Strong")
        data = {str(r["id"]): str(r["data"]) for r in rows}
        for head in heads:
            parts = [data.get(_part_id(head.version, n)) for n in range(head.parts)]
            if all(p is not None for p in parts):
                yield decode([p for p in parts if p is not None]), head.version
            else:
                logger.info(
                    "shared catalog: %s changed while it was read; taken on the next pull", head.doc_key
                )

    def publish(self, record: DocumentRecord, *, replaces: str | None) -> str:
        """Write the record's parts, then its head (the switch), then drop the parts of version ``replaces``.

        The caller holds the lease and knows the version it replaces (what it last pulled or sent),
        so no read is made here.
        """
        doc_key = record.entry.doc_key
        version, parts = encode(record)
        rows = [
            self._row(_part_id(version, n), "part", doc_key=doc_key, version=version, seq=n, data=part)
            for n, part in enumerate(parts)
        ]
        for start in range(0, len(rows), _BATCH_PARTS):
            self._client.upsert(self.collection, rows[start : start + _BATCH_PARTS])
        head = self._row(
            _head_id(doc_key),
            "head",
            doc_key=doc_key,
            content_hash=record.entry.content_hash,
            version=version,
            seq=len(parts),
            data=str(sum(map(len, parts))),
        )
        self._client.upsert(self.collection, [head])
        if replaces is not None and replaces != version:
            self._drop_parts(doc_key, replaces)
        return version

    def withdraw(self, doc_key: str, *, version: str | None) -> None:
        """Remove a document: its head first (the switch), then the parts of its version."""
        self._client.delete(self.collection, ids=[_head_id(doc_key)])
        if version is not None:
            self._drop_parts(doc_key, version)

    def clear(self) -> None:
        """Forget every document and the generation; the lease row stays with its holder."""
        for kind in ("head", "part"):
            self._client.delete(self.collection, filter=kind_filter(kind))
        self.delete_meta(_GENERATION_ID)

    def _drop_parts(self, doc_key: str, version: str) -> None:
        self._client.delete(
            self.collection,
            filter=f"{kind_filter('part')} and doc_key == {string_literal(doc_key)}"
            f" and version == {string_literal(version)}",
        )

    @staticmethod
    def _row(
        row_id: str,
        kind: str,
        *,
        doc_key: str = "",
        content_hash: str = "",
        version: str = "",
        seq: int = 0,
        data: str = "",
    ) -> dict[str, Any]:
        return {
            "id": row_id,
            "kind": kind,
            "doc_key": doc_key,
            "content_hash": content_hash,
            "version": version,
            "seq": seq,
            "data": data,
            "blank": _BLANK,
        }


def kind_filter(kind: str) -> str:
    """A filter on the row kind, from an escaped literal."""
    return f"kind == {string_literal(kind)}"
