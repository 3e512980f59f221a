"""Which Milvus the tests run against: Milvus Lite (default) or a real Milvus server.

``pytest --milvus-server`` starts Milvus 2.3.5 standalone once per session (tests/milvus_server.py)
and stops it at the end; ``LOOKUP_KNOWLEDGE_TEST_MILVUS_URI=http://host:port`` uses a running one.
On a server every test gets its own collection prefix, set as the ``LOOKUP_KNOWLEDGE_MILVUS__*``
environment that in-process settings and server subprocesses both read, and its collections are
dropped afterwards. Tests marked ``lite_only`` are about the Lite file itself and are skipped there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

from server.config.sections import ENV_PREFIX
from storage.shared_sync import SharedMirror

URI_VAR = f"{ENV_PREFIX}MILVUS__URI"
PREFIX_VAR = f"{ENV_PREFIX}MILVUS__COLLECTION_PREFIX"
TEST_URI_VAR = f"{ENV_PREFIX}TEST_MILVUS_URI"


def target_env() -> dict[str, str]:
    """The Milvus-server settings of the running test, as environment (empty on Milvus Lite)."""
    return {k: os.environ[k] for k in (URI_VAR, PREFIX_VAR) if k in os.environ}


def prefix_for(nodeid: str) -> str:
    """A collection prefix of one test: valid for Milvus, short, and stable across runs."""
    return "t_" + hashlib.sha1(nodeid.encode()).hexdigest()[:12]


def drop_prefixed(uri: str, prefix: str) -> None:
    """Drop every collection of one test."""
    from pymilvus import MilvusClient

    client = MilvusClient(uri=uri, timeout=30)
    try:
        for name in client.list_collections():
            if name.startswith(prefix + "_"):
                client.drop_collection(name)
    finally:
        client.close()


def clone_data_dir(
    template: Path, target: Path, *, uri: str, source_prefix: str, prefix: str, embedder: Any
) -> Path:
    """Copy an ingested data directory to another collection prefix on the server.

    The catalog is a file (copied and renamed after the collection); the vectors live on the
    server, so they are copied row for row into the new collection.
    """
    from pymilvus import MilvusClient

    from storage.vector_store import MilvusVectorStore, collection_name

    shutil.copytree(template, target)
    source = collection_name(source_prefix, embedder.name, embedder.dim)
    name = collection_name(prefix, embedder.name, embedder.dim)
    catalogs = target / "catalog"
    (catalogs / f"{source}.sqlite").rename(catalogs / f"{name}.sqlite")
    for suffix in ("-wal", "-shm"):
        leftover = catalogs / f"{source}.sqlite{suffix}"
        if leftover.exists():
            leftover.rename(catalogs / f"{name}.sqlite{suffix}")
    store = MilvusVectorStore(uri=uri, token=None, collection=name, dim=embedder.dim, timeout_s=30)
    client = MilvusClient(uri=uri, timeout=30)
    try:
        store.ensure_collection()
        rows = client.query(
            source,
            filter='doc_key != ""',
            output_fields=["id", "doc_key", "domain", "lang", "vector"],
            consistency_level="Strong",
            limit=16384,
        )
        client.insert(name, [dict(row) for row in rows])
        store.flush_and_load()
    finally:
        client.close()
        store.close()
    return target


def timed_mirror(times: list[float]) -> type[SharedMirror]:
    """A shared-catalog mirror that notes, in ``times``, the monotonic time of each generation it commits."""

    class TimedMirror(SharedMirror):
        def commit(self) -> None:
            moved = self._changed
            super().commit()
            if moved:
                times.append(time.monotonic())

    return TimedMirror
