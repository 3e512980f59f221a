"""An optional cross-encoder stage: FlagEmbedding's ``FlagReranker`` (e.g. bge-reranker-v2-m3).

Off by default. A cross-encoder reads the query and a passage together, so it judges a pair
better than two independently embedded vectors can, at the price of one forward pass per
pair: the engine gives it only the best few candidate chunks of each query. Scores are
normalised by a sigmoid (``normalize=True``) into 0..1, which the ranking adds to the fused
chunk score with the tier model's ``rerank_weight``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, Protocol

from retrieval.embedders import EmbedderError
from retrieval.model_files import load_model


class RerankerError(EmbedderError):
    """The reranker model could not be loaded or failed to score."""


class PassageReranker(Protocol):
    def score(self, query: str, passages: Sequence[str]) -> list[float]: ...


class FlagPassageReranker:
    """``FlagReranker`` behind a lock (one model, not safe to call from two threads at once)."""

    def __init__(self, model_path: str, *, device: str = "cpu", batch_size: int = 16) -> None:
        try:
            from FlagEmbedding import FlagReranker
        except ImportError as exc:
            raise RerankerError(
                "the reranker needs the optional extra: pip install 'lookup-knowledge-mcp[bge-m3]'"
            ) from exc
        self._model: Any = load_model(
            lambda source: FlagReranker(source, devices=device, use_fp16=False, batch_size=batch_size),
            model_path,
            "reranker model",
            RerankerError,
        )
        self._lock = threading.Lock()

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """Each passage's relevance to the query, 0..1."""
        if not passages:
            return []
        with self._lock:
            scores = self._model.compute_score([(query, p) for p in passages], normalize=True)
        return [float(s) for s in scores]


def create_reranker(model_path: str, *, device: str = "cpu", batch_size: int = 16) -> FlagPassageReranker:
    """Load the reranker (slow: call it in a thread)."""
    return FlagPassageReranker(model_path, device=device, batch_size=batch_size)
