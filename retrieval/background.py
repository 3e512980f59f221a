"""A background of generic questions no team's knowledge base answers, as evidence against on-topic.

``background_questions.jsonl`` (package data) holds everyday questions, Chinese and English:
sport, food, travel, history, health, programming trivia, office life. A question that sits
as close to them as to the knowledge base is likely off-topic, whatever document happens to
be nearest. Their vectors are encoded once per embedder and kept in the data directory; a
lookup then costs one product of its vector with them (about 0.05 ms for 1,200 at 384
dimensions), never another embedding. For the default embedder the vectors also ship with the
package (``background_vectors/``, written by ``scripts/background_vectors.py``): encoding 1,635
questions takes e5-small about 30 s, which every new data directory would otherwise pay before
its first lookup.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Protocol

import numpy as np

from storage.text import NAME_WORD

logger = logging.getLogger(__name__)

QUESTIONS_FILE = "background_questions.jsonl"
# A query's background score is the mean cosine of its nearest few background questions: one
# alone is noisy (a question may happen to share a word with one generic question).
NEAREST = 3
_BATCH = 64
SHIPPED_DIR = "background_vectors"
# Encoded backgrounds by (embedder name, dimension, questions digest), for this process: every
# server a process opens over another data directory (tests open hundreds) reuses them.
_ENCODED: dict[tuple[str, int, str], np.ndarray] = {}


class QueryEncoder(Protocol):
    name: str
    dim: int

    def embed_queries(self, texts: list[str]) -> np.ndarray: ...


def load_questions() -> tuple[str, ...]:
    """The shipped background questions."""
    text = resources.files("retrieval").joinpath(QUESTIONS_FILE).read_text(encoding="utf-8")
    return tuple(json.loads(line)["query"] for line in text.splitlines() if line.strip())


@dataclass(frozen=True)
class Background:
    """The background questions' unit vectors for one embedder."""

    questions: tuple[str, ...]
    vectors: np.ndarray  # (questions, dim), float32, unit rows
    # The same, one row per dimension: einsum's own loop over it takes about 0.1 ms for 1,600
    # questions, where BLAS's matrix-vector product took 2-3 ms on a busy machine (its threads).
    _columns: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_columns", np.ascontiguousarray(self.vectors.T, dtype=np.float32))

    @cached_property
    def words(self) -> frozenset[str]:
        """The Latin words the questions use, lower-cased: everyday words, not names."""
        return frozenset(w.lower() for question in self.questions for w in NAME_WORD.findall(question))

    def similarity(self, vector: np.ndarray) -> float:
        """Mean cosine of the query's NEAREST background questions."""
        if not len(self.vectors):
            return 0.0
        scores = np.einsum("d,dq->q", np.asarray(vector, dtype=np.float32), self._columns)
        k = min(NEAREST, len(scores))
        return float(np.partition(scores, len(scores) - k)[-k:].mean())

    def left_out(self) -> np.ndarray:
        """Each background question's score against the others (calibration asks them as queries)."""
        scores = self.vectors @ self.vectors.T
        np.fill_diagonal(scores, -np.inf)
        k = min(NEAREST, max(len(scores) - 1, 1))
        return np.asarray(np.sort(scores, axis=1)[:, -k:].mean(axis=1))


def encode_background(
    embedder: QueryEncoder, cache_dir: Path | None, questions: tuple[str, ...] | None = None
) -> Background:
    """The background encoded by ``embedder``: read from ``cache_dir`` when encoded there before.

    The cache file is named by the embedder and a digest of the questions, so a new background
    file or another embedder is encoded afresh.
    """
    questions = load_questions() if questions is None else questions
    digest = questions_digest(questions)
    path = cache_dir / f"{embedder.name}-{digest}.npy" if cache_dir is not None else None
    if path is not None and path.exists():
        vectors = np.load(path)
        if vectors.shape[0] == len(questions):
            return Background(questions, vectors.astype(np.float32))
        logger.warning("background cache %s does not match the questions: encoding again", path)
    shipped = _shipped(embedder, questions, digest)
    if shipped is not None:
        return Background(questions, shipped)
    parts = [
        embedder.embed_queries(list(questions[i : i + _BATCH])) for i in range(0, len(questions), _BATCH)
    ]
    vectors = np.vstack(parts).astype(np.float32) if parts else np.zeros((0, 0), np.float32)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, vectors)
    return Background(questions, vectors)


def questions_digest(questions: tuple[str, ...]) -> str:
    """A short digest naming one set of background questions in cache and shipped file names."""
    return hashlib.sha256("\n".join(questions).encode("utf-8")).hexdigest()[:16]


def shipped_name(embedder_name: str, digest: str) -> str:
    """The file name of an embedder's shipped background vectors for one set of questions."""
    return f"{embedder_name}-{digest}.npy"


def _shipped(embedder: QueryEncoder, questions: tuple[str, ...], digest: str) -> np.ndarray | None:
    """The packaged vectors for these questions and this embedder, if they ship.

    Nothing is encoded to check them, so warm-up never calls the model:
    tests/test_background.py re-encodes shipped rows with the real model and fails when the
    model no longer makes them (run scripts/background_vectors.py then).
    """
    entry = resources.files("retrieval").joinpath(SHIPPED_DIR, shipped_name(embedder.name, digest))
    if not entry.is_file():
        return None
    with entry.open("rb") as handle:
        vectors: np.ndarray = np.asarray(np.load(handle), dtype=np.float32)
    if vectors.shape != (len(questions), embedder.dim):
        logger.warning("the shipped background vectors do not fit %s: encoding them again", embedder.name)
        return None
    return vectors
