"""Keeping a replica's SQLite catalog in line with the shared catalog on a Milvus server.

``pull`` brings the local catalog to the shared one: documents whose shared version it does not
hold are taken (each batch in one local transaction, so a document switches whole), documents
the shared catalog no longer lists are dropped. ``SharedMirror`` is the other direction, for an
ingest: under the lease it pulls first (so the content hashes it compares are the shared ones and
an unchanged document embeds nothing), then sends each document it commits.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from storage.catalog import Catalog
from storage.shared_catalog import SharedCatalog
from storage.shared_lease import IngestLease

logger = logging.getLogger(__name__)

# Documents taken per local transaction: a first pull of 10k chunks commits in a few transactions.
_APPLY_BATCH = 500


@dataclass(frozen=True)
class Pulled:
    """What one pull did; ``generation`` is None when a document changed while it was read."""

    generation: int | None
    taken: int
    dropped: int
    chunks: int
    seconds: float


def pull(
    catalog: Catalog, shared: SharedCatalog, *, before_taking: Callable[[], None] | None = None
) -> Pulled:
    """Bring the local catalog to the shared catalog's committed state.

    ``before_taking`` runs once the heads are read and before any document is taken: the vector
    store's catch_up, so that a document never shows here before its vectors can be found.
    """
    started = time.perf_counter()
    # Read before the heads: a commit in between moves it again, so the next poll pulls again.
    generation = shared.generation()
    heads = shared.heads()
    held = catalog.shared_versions()
    stale = [h for key, h in sorted(heads.items()) if held.get(key) != h.version]
    dropped = sorted(set(catalog.hashes()) - set(heads))
    if stale and before_taking is not None:
        before_taking()
    taken = chunks = 0
    batch = []
    for record in shared.records(stale):
        batch.append(record)
        if len(batch) >= _APPLY_BATCH:
            catalog.apply_shared(batch, ())
            taken, chunks = taken + len(batch), chunks + sum(len(r.chunks) for r, _ in batch)
            batch = []
    catalog.apply_shared(batch, dropped)
    taken, chunks = taken + len(batch), chunks + sum(len(r.chunks) for r, _ in batch)
    complete = taken == len(stale)
    return Pulled(
        generation if complete else None, taken, len(dropped), chunks, time.perf_counter() - started
    )


class SharedMirror:
    """An ingest's link to the shared catalog (retrieval.ingest.CatalogMirror)."""

    def __init__(self, catalog: Catalog, shared: SharedCatalog, lease: IngestLease | None = None) -> None:
        self._catalog = catalog
        self._shared = shared
        self._lease = lease or IngestLease(shared)
        self._changed = False
        # doc_key -> the shared version, as pulled or sent under the lease: what a publish replaces.
        self._held: dict[str, str] = {}

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the ingest lease, with the local catalog brought to the shared one first."""
        self._lease.acquire()
        try:
            if self._shared.generation() is None:
                self._seed()
            else:
                done = pull(self._catalog, self._shared)
                self._held = self._catalog.shared_versions()
                logger.info(
                    "shared catalog: took %d documents and dropped %d before ingesting",
                    done.taken,
                    done.dropped,
                )
            yield
        finally:
            self._lease.release()

    def _seed(self) -> None:
        """A shared catalog never committed to starts as this catalog (a data directory from before it)."""
        keys = sorted(self._catalog.hashes())
        # Whatever an interrupted seeding or clear left: heads of documents this catalog lacks.
        self._shared.clear()
        self._held = {}
        for doc_key in keys:
            self.publish(doc_key)
        self._shared.set_generation(1)
        self._changed = False
        if keys:
            logger.info("shared catalog: seeded with this data directory's %d documents", len(keys))

    def publish(self, doc_key: str) -> None:
        """Send a document just committed locally; replicas take it at the next generation."""
        self._lease.check()
        record = self._catalog.record(doc_key)
        if record is None:
            return
        version = self._shared.publish(record, replaces=self._held.get(doc_key))
        self._catalog.mark_shared(doc_key, version)
        self._held[doc_key] = version
        self._changed = True

    def withdraw(self, doc_key: str) -> None:
        self._lease.check()
        self._shared.withdraw(doc_key, version=self._held.pop(doc_key, None))
        self._changed = True

    def commit(self) -> None:
        """Move the generation when documents were sent, so replicas pull them."""
        if not self._changed:
            return
        self._lease.check()
        self._shared.set_generation((self._shared.generation() or 0) + 1)
        self._changed = False
