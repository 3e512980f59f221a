"""The background of generic questions: shipped, encoded once, and a cheap score per query."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from retrieval.background import NEAREST, Background, encode_background, load_questions
from retrieval.embedders import CachedEmbedder


class Letters:
    """A toy query embedder: one dimension per letter a-z, counting its calls."""

    name = "letters"
    dim = 26

    def __init__(self) -> None:
        self.calls = 0

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        rows = np.zeros((len(texts), 26), np.float32)
        for i, text in enumerate(texts):
            for ch in text.lower():
                if "a" <= ch <= "z":
                    rows[i, ord(ch) - 97] += 1
        return rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-9)


def test_the_background_ships_with_the_package_in_both_languages() -> None:
    text = resources.files("retrieval").joinpath("background_questions.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert len(rows) >= 1000
    assert {r["lang"] for r in rows} == {"zh", "en"}
    assert len(load_questions()) == len(rows)
    pyproject = (Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    assert (
        'retrieval = ["*.json", "*.jsonl", "background_vectors/*.npy"]' in pyproject
    )  # installed with the package


def test_the_background_is_encoded_once_then_read_from_the_data_directory(tmp_path: Path) -> None:
    questions = ("aaa bbb", "ccc", "zzz yyy", "qqq")
    first = Letters()
    encoded = encode_background(first, tmp_path, questions)
    assert first.calls == 1 and len(list(tmp_path.glob("letters-*.npy"))) == 1
    again = Letters()
    assert np.array_equal(encode_background(again, tmp_path, questions).vectors, encoded.vectors)
    assert again.calls == 0


def test_a_query_scores_the_mean_of_its_nearest_background_questions() -> None:
    vectors = np.eye(4, dtype=np.float32)
    background = Background(("a", "b", "c", "d"), vectors)
    query = np.array([1.0, 1.0, 0.0, 0.0], np.float32) / np.sqrt(2)
    assert NEAREST == 3
    assert abs(background.similarity(query) - (2 / np.sqrt(2)) / 3) < 1e-6
    # Asked as a query, a background question does not find itself.
    assert np.allclose(background.left_out(), 0.0)


class Counting:
    """Counts the texts an embedder is asked to encode."""

    def __init__(self, inner: Any, name: str | None = None) -> None:
        self.inner = inner
        self.name = name or inner.name
        self.dim = inner.dim
        self.texts = 0

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        self.texts += len(texts)
        return np.asarray(self.inner.embed_queries(texts))


def test_the_default_embedders_background_ships_encoded_and_the_model_still_makes_it(
    e5_embedder: Any,
) -> None:
    embedder = Counting(e5_embedder.inner)
    background = encode_background(embedder, None)
    assert background.vectors.shape == (len(load_questions()), 384)
    assert embedder.texts == 0  # read from the package, not 1,635 questions encoded
    rows = [0, len(background.questions) // 2, len(background.questions) - 1]
    fresh = np.asarray(e5_embedder.inner.embed_queries([background.questions[i] for i in rows]))
    # Below this, the model changed: write the vectors again with scripts/background_vectors.py.
    assert np.min(np.sum(fresh * background.vectors[rows], axis=1)) > 0.999


def test_shipped_vectors_of_another_dimension_are_encoded_afresh() -> None:
    impostor = Counting(Letters(), name="e5-small")  # the default's name, another model
    background = encode_background(impostor, None)
    assert background.vectors.shape == (len(load_questions()), 26)
    assert impostor.texts == len(load_questions())


def test_calibration_reuses_the_background_encodings_instead_of_encoding_each_question_again() -> None:
    letters = Letters()
    background = encode_background(letters, None, ("where is the beach", "who won the cup"))
    cached = CachedEmbedder(letters, size=10)  # type: ignore[arg-type]
    cached.remember(background.questions, background.vectors)
    calls = letters.calls
    vector = cached.encode_query("who won the cup").vector
    assert letters.calls == calls and np.array_equal(vector, letters.embed_queries(["who won the cup"])[0])
