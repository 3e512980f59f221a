"""L1: chunk vectors in Milvus through ``pymilvus.MilvusClient``.

Only the portable MilvusClient API is used, so the Lite file and a standalone or distributed
cluster run the same code: changing ``milvus.uri`` is the only switch. A Lite directory is shared
by every process that opens it (storage.lite_share). pymilvus is synchronous: callers on the
event loop use ``asyncio.to_thread``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from storage import lite_share
from storage.lite_socket import LiteShareError

if TYPE_CHECKING:
    from pymilvus import MilvusClient

logger = logging.getLogger(__name__)

VECTOR_FIELD = "vector"
# Only what grouping by document needs; fetching unused fields costs time on every search.
SEARCH_FIELDS = ["doc_key"]
# Bumped when the collection's fields change, so an old data directory is re-ingested, not misread.
LAYOUT = "c3"
_HNSW = {"M": 16, "efConstruction": 200}
_SEARCH_EF_MIN = 64
# Equal vectors (a section repeated word for word, one file under two paths) disconnect an HNSW
# graph: the neighbour heuristic drops every link that ties, and a search that enters the
# duplicates never leaves them. 100 copies of one vector hid 20 others from searches for
# themselves (0 of 20 found at any ef up to 4096); a stored vector moved by 1e-5 of its length
# fixed it. Each is moved by this share of its length, in a direction drawn from its key: no two
# are equal, and a cosine moves by at most this much.
_TIE_BREAK = 1e-4


class StoreError(RuntimeError):
    """Milvus is unreachable, or the collection does not fit the embedder."""


class ChunkHit(NamedTuple):
    # A named tuple, like every per-candidate record of a lookup (dense and lexical hits, chunk
    # and document scores): a lookup at 10k chunks makes about 270 of them, and a frozen
    # dataclass's __init__ (object.__setattr__ per field) costs 4-5 times a tuple's.
    chunk_id: str
    doc_key: str
    score: float  # the COSINE metric's raw score, as Milvus returned it


@dataclass(frozen=True)
class ChunkRow:
    chunk_id: str
    doc_key: str
    domain: str
    language: str
    vector: np.ndarray


def collection_name(prefix: str, embedder: str, dim: int) -> str:
    """One collection per embedder and dimension, so vectors of two models never mix."""
    return f"{prefix}_{re.sub(r'[^0-9A-Za-z_]', '_', embedder)}_{dim}_{LAYOUT}"


def tie_broken(vector: np.ndarray, chunk_id: str) -> np.ndarray:
    """``vector`` moved by ``_TIE_BREAK`` of its length, the same way every time for one key."""
    seed = int.from_bytes(hashlib.blake2b(chunk_id.encode(), digest_size=8).digest(), "big")
    direction = np.random.default_rng(seed).standard_normal(vector.shape[-1])
    scale = _TIE_BREAK * float(np.linalg.norm(vector)) / float(np.linalg.norm(direction))
    return (vector + scale * direction).astype(np.float32)


def string_literal(value: str) -> str:
    """A Milvus filter string literal; json.dumps escapes quotes and backslashes."""
    return json.dumps(value, ensure_ascii=False)


def chunk_id(doc_key: str, embedded_text: str, occurrence: int = 0) -> str:
    """Content-addressed primary key: an unchanged chunk keeps its id (and vector) across edits.

    ``occurrence`` tells apart identical chunks within one document. Re-running a killed ingest
    upserts the same ids, never duplicates.
    """
    return hashlib.sha1(f"{doc_key}\x00{occurrence}\x00{embedded_text}".encode()).hexdigest()


class MilvusVectorStore:
    """A collection of chunk vectors with COSINE HNSW search."""

    def __init__(self, *, uri: str, token: str | None, collection: str, dim: int, timeout_s: float) -> None:
        self.uri = uri
        self.collection = collection
        self.dim = dim
        self._client = _connect(uri, token, timeout_s)
        self._timeout = timeout_s

    def close(self) -> None:
        self._client.close()

    def ensure_collection(self) -> bool:
        """Create the collection (True), or check that the existing one fits the embedder's dimension."""
        created = create_or_load(self._client, self.collection, self._create, self._timeout)
        if not created:
            existing = self._vector_dim()
            if existing != self.dim:
                raise StoreError(
                    f"collection {self.collection!r} has dimension {existing}, but the embedder produces "
                    f"{self.dim}; use another collection_prefix or re-create the data directory"
                )
        return created

    def _create(self) -> None:
        from pymilvus import DataType, MilvusClient

        schema = MilvusClient.create_schema(auto_id=False, enable_dynamic_field=False)
        schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=40)
        schema.add_field("doc_key", DataType.VARCHAR, max_length=2048)
        schema.add_field("domain", DataType.VARCHAR, max_length=256)
        schema.add_field("lang", DataType.VARCHAR, max_length=8)
        schema.add_field(VECTOR_FIELD, DataType.FLOAT_VECTOR, dim=self.dim)
        index = self._client.prepare_index_params()
        # COSINE: Milvus returns the cosine itself (L2 would come back squared).
        index.add_index(field_name=VECTOR_FIELD, index_type="HNSW", metric_type="COSINE", params=_HNSW)
        # Session: a client reads its own writes (an ingest, then a lookup in the same process),
        # and a search that wrote nothing never waits. Strong made every search on a Milvus server
        # wait for the next time tick (~300 ms); the catalog decides what is visible either way
        # (a replica that takes another machine's ingest calls catch_up first).
        self._client.create_collection(
            self.collection, schema=schema, index_params=index, consistency_level="Session"
        )

    def catch_up(self) -> None:
        """Return once every write acknowledged so far is searchable here (one Strong query).

        A replica's searches are Session-consistent, which covers only its own writes: before it
        shows documents another machine ingested, it waits for their vectors this way.
        """
        self._client.query(
            self.collection, filter='id == ""', output_fields=["id"], consistency_level="Strong"
        )

    def _vector_dim(self) -> int:
        described = self._client.describe_collection(self.collection)
        for field in described.get("fields", []):
            if field.get("name") == VECTOR_FIELD:
                return int(field.get("params", {}).get("dim", -1))
        raise StoreError(f"collection {self.collection!r} has no {VECTOR_FIELD!r} field")

    def upsert(self, rows: Sequence[ChunkRow]) -> None:
        if not rows:
            return
        self._client.upsert(
            self.collection,
            [
                {
                    "id": r.chunk_id,
                    "doc_key": r.doc_key,
                    "domain": r.domain,
                    "lang": r.language,
                    VECTOR_FIELD: tie_broken(r.vector, r.chunk_id).tolist(),
                }
                for r in rows
            ],
        )

    def delete_chunks(self, chunk_ids: Sequence[str]) -> None:
        """Delete chunks by primary key: no scan of the collection."""
        if chunk_ids:
            self._client.delete(self.collection, ids=list(chunk_ids))

    def flush_and_load(self) -> None:
        """Seal segments and build the index: an unflushed Lite collection searches ~50x slower."""
        self._client.flush(self.collection)
        self._client.load_collection(self.collection)

    def search(
        self,
        vector: np.ndarray,
        *,
        limit: int,
        domain: str | None,
    ) -> list[ChunkHit]:
        """The nearest chunks, optionally only of one domain."""
        expr = f"domain == {string_literal(domain)}" if domain is not None else ""
        result = self._client.search(
            self.collection,
            data=[vector.tolist()],
            limit=limit,
            filter=expr,
            output_fields=SEARCH_FIELDS,
            search_params={"metric_type": "COSINE", "params": {"ef": max(_SEARCH_EF_MIN, limit)}},
        )
        return [
            ChunkHit(str(hit["id"]), hit["entity"]["doc_key"], float(hit["distance"])) for hit in result[0]
        ]

    def count(self) -> int:
        rows = self._client.query(
            self.collection, filter="", output_fields=["count(*)"], consistency_level="Strong"
        )
        return int(rows[0]["count(*)"])

    def chunk_ids(self, doc_key: str) -> list[str]:
        """The ids of every stored chunk of doc_key, for consistency checks."""
        rows = self._client.query(
            self.collection,
            filter=f"doc_key == {string_literal(doc_key)}",
            output_fields=["id"],
            limit=16384,
            consistency_level="Strong",  # consistency checks read what was just written
        )
        return sorted(str(r["id"]) for r in rows)


def create_or_load(client: MilvusClient, name: str, create: Callable[[], None], timeout_s: float) -> bool:
    """Create a collection (True) or load the existing one (False), also when replicas start at once.

    Another process may create it between has_collection and create_collection (which then
    fails), or be between creating it and indexing it (a load fails until the index is there):
    both are waited out, within timeout_s.
    """
    created = False
    if not client.has_collection(name):
        try:
            create()
            created = True
        except Exception:  # pymilvus raises many types; only "it exists now" is not an error
            if not client.has_collection(name):
                raise
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.load_collection(name)
            return created
        except Exception:  # "index not found" while its creator is still indexing it
            if created or time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def is_lite_uri(uri: str) -> bool:
    """Whether uri names a Milvus Lite file (pymilvus's own rule) rather than a Milvus server."""
    return uri.endswith(".db")


def check_reachable(uri: str, token: str | None, timeout_s: float) -> None:
    """Connect once and disconnect; raises StoreError naming the URI within about timeout_s."""
    _connect(uri, token, timeout_s).close()


def connect(uri: str, token: str | None, timeout_s: float) -> MilvusClient:
    """A client on uri (a Lite directory through storage.lite_share); StoreError naming the URI."""
    return _connect(uri, token, timeout_s)


def _connect(uri: str, token: str | None, timeout_s: float) -> MilvusClient:
    from pymilvus import MilvusClient

    if is_lite_uri(uri):
        # A Lite directory is locked by one process; lite_share serves it to the others.
        try:
            return lite_share.connect(uri, timeout_s)
        except LiteShareError as exc:
            raise StoreError(str(exc)) from exc
        except Exception as exc:  # pymilvus raises many types; all mean "cannot use this URI"
            raise StoreError(f"cannot connect to Milvus at {uri!r} within {timeout_s:g}s: {exc}") from exc
    kwargs: dict[str, Any] = {"uri": uri, "timeout": timeout_s}
    if token:
        kwargs["token"] = token
    try:
        return MilvusClient(**kwargs)
    except Exception as exc:  # pymilvus raises many types; all mean "cannot use this URI"
        raise StoreError(f"cannot connect to Milvus at {uri!r} within {timeout_s:g}s: {exc}") from exc
