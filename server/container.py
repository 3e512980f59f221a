"""The composition root: from the settings, open and wire catalog, Milvus store, embedder, engine, service.

Shared by the CLI commands and the MCP server's lifespan. Everything here is synchronous and
slow (model load, Milvus start): the server runs it in a background thread so that
``initialize`` answers at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from retrieval.action_memory import ActionMemory
from retrieval.background import Background, encode_background
from retrieval.embedders import CachedEmbedder, Embedder, create_embedder
from retrieval.engine import KnowledgeEngine
from retrieval.ingest import Ingestor
from retrieval.models import KnowledgeMap
from retrieval.requests import Policy
from retrieval.reranker import PassageReranker, create_reranker
from retrieval.service import LookupService
from server.config.data_dir import empty_knowledge_base_message, prepare_data_dir
from server.config.settings import Settings
from storage.catalog import Catalog
from storage.chunking import ChunkingRule
from storage.convert.worker import ConversionLimits, ConversionWorker
from storage.shared_catalog import SUFFIX, SharedCatalog
from storage.shared_sync import Pulled, SharedMirror, pull
from storage.vector_store import MilvusVectorStore, collection_name, connect, is_lite_uri

logger = logging.getLogger(__name__)


@dataclass
class Runtime:
    """The opened resources; close() releases them."""

    settings: Settings
    embedder: CachedEmbedder
    store: MilvusVectorStore
    catalog: Catalog
    engine: KnowledgeEngine
    background: Background
    # On a Milvus server: the catalog every replica shares, and the generation last pulled from it.
    shared: SharedCatalog | None = None
    shared_generation: int | None = None

    def ingestor(self, catalog: Catalog | None = None) -> Ingestor:
        """An ingestor over this runtime's store and model; a watcher passes a catalog connection of its own."""
        catalog = catalog or self.catalog
        return Ingestor(
            catalog,
            self.store,
            self.embedder,
            rule=chunking_rule(self.settings, self.embedder),
            batch_size=self.settings.embedder.batch_size,
            converter=ConversionWorker(conversion_limits(self.settings)),
            mirror=SharedMirror(catalog, self.shared) if self.shared is not None else None,
        )

    def close(self) -> None:
        self.engine.close()
        self.catalog.close()
        self.store.close()
        if self.shared is not None:
            self.shared.close()


def chunking_rule(settings: Settings, embedder: CachedEmbedder) -> ChunkingRule:
    """Chunks bounded in characters and, when the embedder can count them, in its tokens."""
    return ChunkingRule(
        max_chars=settings.chunking.max_chars,
        max_tokens=settings.chunking.max_tokens,
        count_tokens=embedder.count_tokens,
    )


def conversion_limits(settings: Settings) -> ConversionLimits:
    """How long and how much memory one file's conversion may take, and how large a file may be."""
    conversion = settings.conversion
    return ConversionLimits(conversion.timeout_s, conversion.memory_mb, conversion.max_file_mb)


def catalog_path(settings: Settings, collection: str) -> Path:
    """One catalog per collection, so switching embedders never confuses what is ingested."""
    return settings.data_dir / "catalog" / f"{collection}.sqlite"


def load_embedder(settings: Settings) -> Embedder:
    cfg = settings.embedder
    return create_embedder(cfg.name, model_path=cfg.model_path, device=cfg.device, batch_size=cfg.batch_size)


def load_reranker(settings: Settings) -> PassageReranker | None:
    """The reranker when enabled; None (and FlagEmbedding never imported) when it is not."""
    cfg = settings.reranker
    if not cfg.enabled:
        return None
    return create_reranker(cfg.model_path, device=cfg.device, batch_size=cfg.batch_size)


def open_runtime(
    settings: Settings, *, embedder: Embedder | None = None, store: MilvusVectorStore | None = None
) -> Runtime:
    """Load the embedder (and the reranker, if enabled), connect to Milvus and open the catalog."""
    prepare_data_dir(settings.data_dir)
    inner = embedder if embedder is not None else load_embedder(settings)
    # Loaded before Milvus and the catalog open, so a bad reranker path leaves nothing to close.
    reranker = load_reranker(settings)
    cached = (
        inner
        if isinstance(inner, CachedEmbedder)
        else CachedEmbedder(inner, size=settings.embedder.query_cache_size)
    )
    name = collection_name(settings.milvus.collection_prefix, cached.name, cached.dim)
    if store is None:
        store = MilvusVectorStore(
            uri=settings.milvus_uri,
            token=settings.milvus.token,
            collection=name,
            dim=cached.dim,
            timeout_s=settings.milvus.timeout_s,
        )
    created = store.ensure_collection()
    catalog = Catalog(catalog_path(settings, store.collection))
    shared = None if is_lite_uri(store.uri) else open_shared_catalog(settings, store)
    if created:
        forget_vectorless_catalog(catalog, store.collection, shared)
    generation = (
        None if shared is None else load_shared_catalog(catalog, shared, store, cached.passages_embedded)
    )
    background = background_of(settings, cached)
    engine = KnowledgeEngine(
        catalog,
        store,
        cached,
        reranker=reranker,
        rerank_top_n=settings.reranker.top_n,
        background=background,
    )
    return Runtime(settings, cached, store, catalog, engine, background, shared, generation)


def background_of(settings: Settings, embedder: CachedEmbedder) -> Background:
    """The background questions' vectors: shipped or encoded once per embedder, then read from the data directory.

    Read here, where the server opens the stack in a background thread, so that no lookup ever
    embeds more than its query.
    """
    return encode_background(embedder.inner, settings.data_dir / "background")


def open_shared_catalog(settings: Settings, store: MilvusVectorStore) -> SharedCatalog:
    """The catalog collection beside the vectors on a Milvus server (storage.shared_catalog)."""
    client = connect(store.uri, settings.milvus.token, settings.milvus.timeout_s)
    shared = SharedCatalog(client, store.collection + SUFFIX)
    shared.ensure(settings.milvus.timeout_s)
    return shared


def load_shared_catalog(
    catalog: Catalog, shared: SharedCatalog, store: MilvusVectorStore, embedded: int
) -> int | None:
    """Bring the local catalog to the shared one at start-up; the generation it now holds.

    A shared catalog nothing was ever committed to is first seeded, under the ingest lease, with
    this data directory's catalog: a deployment from before the shared catalog keeps its documents.
    """
    if shared.generation() is None:
        with SharedMirror(catalog, shared).exclusive():
            pass
    done = pull(catalog, shared, before_taking=store.catch_up)
    log_pull(done, embedded)
    return done.generation


def log_pull(done: Pulled, embedded: int) -> None:
    """One line per pull that changed something; it says what this process embedded (to show it is 0)."""
    if done.taken or done.dropped:
        logger.info(
            "shared catalog generation %s: took %d documents (%d chunks), dropped %d, in %.2f s; "
            "passages embedded by this process: %d",
            done.generation,
            done.taken,
            done.chunks,
            done.dropped,
            done.seconds,
            embedded,
        )


def forget_vectorless_catalog(catalog: Catalog, collection: str, shared: SharedCatalog | None = None) -> None:
    """Empty a catalog whose collection was only now created: none of its chunks has a vector.

    That happens when ``milvus.uri`` names another Milvus, or the collection or the Milvus Lite
    file was removed. The catalog would still list every document, so an ingest saw no changes
    and re-embedded nothing, and lookups found nothing: NO_MATCH where the answer was ingested.
    Emptied, lookups say the knowledge base is empty and the next ingest embeds everything.
    """
    forgotten = catalog.forget_all()
    if shared is not None and shared.generation() is not None:
        # The shared catalog names the same lost vectors, for every replica.
        shared.clear()
        logger.warning("collection %s was created again: the shared catalog is emptied too", collection)
    if forgotten:
        logger.warning(
            "collection %s did not exist in the configured Milvus, but the catalog listed %d documents "
            "in it: the catalog is emptied; run ingest to embed them again",
            collection,
            forgotten,
        )


def policy_from(settings: Settings) -> Policy:
    """The hot-reloadable part of the settings, as the lookup service reads it."""
    return Policy(
        tier_model=settings.tier_model,
        governance=settings.governance,
        hint_language=settings.relevance.hint_language,
        primary_max_chars=settings.retrieval.primary_max_chars,
        supplement_max_chars=settings.retrieval.supplement_max_chars,
        content=settings.retrieval.content,
        supplements=settings.retrieval.supplements,
    )


def action_memory(settings: Settings, **kwargs: Any) -> ActionMemory:
    """Session memory bounded by the settings' TTL and session cap."""
    return ActionMemory(
        ttl_seconds=settings.memory.ttl_seconds, max_sessions=settings.memory.max_sessions, **kwargs
    )


def lookup_service(
    runtime: Runtime,
    memory: ActionMemory | None = None,
    policy: Callable[[], Policy] | None = None,
    *,
    data_dir: Path | None = None,
    on_view: Callable[[int], None] | None = None,
) -> LookupService:
    """The lookup service over an opened stack; the policy is read fresh for every call.

    A lookup on an empty knowledge base names ``data_dir`` in its error (the CLI's; None for MCP
    clients, which learn nothing about the server's filesystem).
    """
    settings = runtime.settings
    return LookupService(
        runtime.engine,
        memory if memory is not None else action_memory(settings),
        policy or (lambda: policy_from(settings)),
        empty_message=empty_knowledge_base_message(data_dir),
        on_view=on_view,
    )


def described_map(knowledge_map: KnowledgeMap, data_dir: Path | None) -> KnowledgeMap:
    """The map, saying so and how to fill it when the knowledge base is empty (MCP and CLI alike)."""
    if knowledge_map.document_count:
        return knowledge_map
    message = empty_knowledge_base_message(data_dir)
    return knowledge_map.model_copy(update={"empty": True, "message": message})
