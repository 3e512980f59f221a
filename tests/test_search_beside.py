"""The store searches on a thread of its own while the engine does the text-only work: same evidence."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import pytest

from retrieval.embedders import CachedEmbedder
from retrieval.engine import KnowledgeEngine
from server.container import open_runtime

QUERIES = ["ERR_TIMEOUT 是什么", "webhook retries", "connection pool size", "how do I bake bread"]


class InTurn(Executor):
    """Runs each task at once, on the calling thread: the order the engine once had."""

    def __init__(self) -> None:
        self.tasks = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.tasks += 1
        future: Future[Any] = Future()
        future.set_result(fn(*args, **kwargs))
        return future


def test_evidence_is_identical_whether_the_store_searches_beside_the_text_work_or_in_turn(
    make_settings: Callable[..., Any], e5_embedder: CachedEmbedder
) -> None:
    runtime = open_runtime(make_settings(), embedder=e5_embedder)
    in_turn = InTurn()
    try:
        beside, inline = (
            KnowledgeEngine(
                runtime.catalog, runtime.store, e5_embedder, background=runtime.background, search_pool=pool
            )
            for pool in (None, in_turn)
        )
        for query in QUERIES:
            for domain in (None, "api"):
                assert beside.retrieve(query, domain) == inline.retrieve(query, domain)
        assert in_turn.tasks == beside.searches == inline.searches == 2 * len(QUERIES)
        assert any(e.dense and e.lexical for e in (inline.retrieve(q, None) for q in QUERIES))
        beside.close()
    finally:
        runtime.close()


def test_a_failing_store_search_fails_the_retrieval(
    make_settings: Callable[..., Any], e5_embedder: CachedEmbedder
) -> None:
    class Broken:
        def search(self, *args: Any, **kwargs: Any) -> Any:
            raise ConnectionError("store unreachable")

    runtime = open_runtime(make_settings(), embedder=e5_embedder)
    try:
        engine = KnowledgeEngine(runtime.catalog, Broken(), e5_embedder)
        with pytest.raises(ConnectionError, match=r"^store unreachable$"):
            engine.retrieve("webhook retries", None)
        assert engine.searches == 0
        engine.close()
    finally:
        runtime.close()
