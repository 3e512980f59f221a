"""Chunks of realistic length: the sample knowledge base's length distribution, synthetic text.

The short-chunk corpus (``bench.corpus``) has one- or two-sentence chunks of about 20 model
tokens; the sample knowledge base's chunks are ten times longer, and embedding cost grows
faster than length (attention is quadratic in it). Here chunk ``i`` takes the vocabulary of
``bench.corpus`` but draws its length, in model tokens of the text as embedded (title line
included), from the sample knowledge base's chunks under the configured chunking rule. It is
still one document per chunk, below ``chunking.max_tokens``, so counts stay exact and corpora
stay nested.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.corpus import _ACTIONS, _FOLLOW_UPS, DEFAULT_SEED, DOMAINS, SYMPTOMS, SyntheticChunk
from storage.chunking import ChunkingRule
from storage.discovery import discover
from storage.documents import load_document

TokenCounter = Callable[[str], int]


def embedded_texts(root: Path, rule: ChunkingRule) -> list[str]:
    """What the ingestor embeds for every chunk of a knowledge base, in order."""
    return [text for c in discover(root) for text in load_document(c, rule=rule).embedding_texts()]


def chunk_lengths(root: Path, rule: ChunkingRule, count_tokens: TokenCounter) -> list[int]:
    """Model tokens of each embedded chunk of a knowledge base (the distribution to imitate)."""
    return sorted(count_tokens(t) for t in embedded_texts(root, rule))


def _sentence(rng: random.Random, domain_index: int, language: str) -> str:
    domain = DOMAINS[domain_index]
    component, other = rng.choice(domain.components), rng.choice(domain.components)
    symptom, action = rng.choice(SYMPTOMS), rng.choice(_ACTIONS)
    param, value = rng.choice(domain.params), rng.randrange(2, 500)
    kind = rng.randrange(4)
    if language == "en":
        return (
            f"When the {component[0]} {symptom[0]}, {action[0]} {param} to {value}.",
            f"Before restarting the {component[0]}, read the {other[0]} logs for {param}.",
            f"The {other[0]} depends on the {component[0]}; a change to {param} reaches both.",
            rng.choice(_FOLLOW_UPS)[0],
        )[kind]
    return (
        f"{component[1]}{symptom[1]}时，{action[1]} {param} 到 {value}。",
        f"重启{component[1]}之前，先查看{other[1]}日志中的 {param}。",
        f"{other[1]}依赖{component[1]}，修改 {param} 会同时影响两者。",
        rng.choice(_FOLLOW_UPS)[1],
    )[kind]


def realistic_chunk(
    index: int,
    lengths: Sequence[int],
    count_tokens: TokenCounter,
    *,
    seed: int = DEFAULT_SEED,
    domains: int = len(DOMAINS),
    language: str | None = None,
) -> SyntheticChunk:
    """Chunk ``index``: its embedded text (title line + body) has about a length drawn from lengths."""
    rng = random.Random(f"{seed}:realistic:{index}")
    domain_index = index % domains
    domain = DOMAINS[domain_index]
    target = rng.choice(list(lengths))
    lang = language or ("zh" if rng.random() < 0.5 else "en")
    identifier = f"{domain.prefix}_{index:06d}"
    component = rng.choice(domain.components)
    title = f"{identifier} {component[0] if lang == 'en' else component[1]}"
    joiner = " " if lang == "en" else ""
    body = _sentence(rng, domain_index, lang)
    while True:
        longer = body + joiner + _sentence(rng, domain_index, lang)
        if count_tokens(f"{title}\n{longer}") > target:
            break
        body = longer
    return SyntheticChunk(index, domain.name, identifier, lang, title, body)


def realistic_corpus(
    n: int,
    lengths: Sequence[int],
    count_tokens: TokenCounter,
    *,
    seed: int = DEFAULT_SEED,
    domains: int = len(DOMAINS),
    language: str | None = None,
) -> list[SyntheticChunk]:
    """The first n realistic chunks (one language only, when given)."""
    return [
        realistic_chunk(i, lengths, count_tokens, seed=seed, domains=domains, language=language)
        for i in range(n)
    ]


def head(text: str, max_chars: int = 60) -> str:
    """The title line and the first sentence of an embedded text: a cheap stand-in to embed."""
    title, _, body = text.partition("\n")
    ends = [i for i in (body.find(". "), body.find("。")) if i >= 0]
    first = body[: min(ends) + 1] if ends else body
    return f"{title}\n{first[:max_chars]}"


class HeadEmbedder:
    """Embeds only each passage's title line and first sentence (queries as they are).

    For the lookup corpora: the store's search cost depends on the number of vectors, their
    dimension and the index, not on how long the passage behind a vector was, so 10k chunks of
    realistic text get real e5 vectors at the cost of short ones (their full-length embedding
    would take this machine over half an hour). The catalog and the lexical index hold the full
    text, so the lexical search runs on realistic lengths.
    """

    def __init__(self, inner: object) -> None:
        self.inner = inner
        self.name = inner.name  # type: ignore[attr-defined]
        self.dim = inner.dim  # type: ignore[attr-defined]

    def embed_queries(self, texts: Sequence[str]):  # type: ignore[no-untyped-def]
        return self.inner.embed_queries(texts)  # type: ignore[attr-defined]

    def embed_passages(self, texts: Sequence[str]):  # type: ignore[no-untyped-def]
        return self.inner.embed_passages([head(t) for t in texts])  # type: ignore[attr-defined]

    def count_tokens(self, text: str) -> int:
        return int(self.inner.count_tokens(text))  # type: ignore[attr-defined]
