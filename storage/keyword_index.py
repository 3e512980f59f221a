"""L0: exact matching of document keywords, titles and identifiers against a query.

Latin and identifier terms match whole tokens, case-insensitively (``err_timeout`` matches
``ERR_TIMEOUT`` but ``TIMEOUT`` does not match ``ERR_TIMEOUT_X``). Terms containing CJK match
as substrings, since Chinese has no spaces. Lookups are dictionary probes over the query's
token n-grams and CJK substrings, so the cost does not grow with the number of documents.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

_TOKEN = re.compile(r"[0-9A-Za-z_]+")
_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_IDENTIFIER = re.compile(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b")
# Terms shorter than this (in characters) would match too much to be "exact".
_MIN_LATIN = 2
_MIN_CJK = 2


@dataclass(frozen=True)
class KeywordEntry:
    doc_key: str
    domain: str
    title: str
    keywords: tuple[str, ...]


def _latin_tokens(text: str) -> tuple[str, ...]:
    return tuple(t.lower() for t in _TOKEN.findall(text))


class KeywordIndex:
    """Maps terms to documents and finds which documents a query names exactly."""

    def __init__(self, entries: Iterable[KeywordEntry]) -> None:
        self._latin: dict[tuple[str, ...], set[str]] = defaultdict(set)
        self._cjk: dict[str, set[str]] = defaultdict(set)
        self._domain: dict[str, str] = {}
        self._title: dict[str, str] = {}
        for entry in entries:
            self._domain[entry.doc_key] = entry.domain
            self._title[entry.doc_key] = entry.title
            terms = [*entry.keywords, entry.title, *_IDENTIFIER.findall(entry.title)]
            for term in terms:
                self._add(term, entry.doc_key)
        self._max_ngram = max((len(k) for k in self._latin), default=0)
        self._cjk_lengths = sorted({len(k) for k in self._cjk})

    def _add(self, term: str, doc_key: str) -> None:
        term = term.strip().lower()
        if _CJK.search(term):
            if len(term) >= _MIN_CJK:
                self._cjk[term].add(doc_key)
            return
        tokens = _latin_tokens(term)
        if tokens and len("".join(tokens)) >= _MIN_LATIN:
            self._latin[tokens].add(doc_key)

    def __len__(self) -> int:
        return len(self._domain)

    def title(self, doc_key: str) -> str:
        return self._title.get(doc_key, doc_key)

    def match(self, query: str, domain: str | None = None) -> list[str]:
        """Documents named exactly by the query, sorted; restricted to domain when given."""
        found: set[str] = set()
        tokens = _latin_tokens(query)
        for size in range(1, min(self._max_ngram, len(tokens)) + 1):
            for start in range(len(tokens) - size + 1):
                docs = self._latin.get(tokens[start : start + size])
                if docs:
                    found |= docs
        lowered = query.lower()
        for length in self._cjk_lengths:
            for start in range(len(lowered) - length + 1):
                docs = self._cjk.get(lowered[start : start + length])
                if docs:
                    found |= docs
        if domain is not None:
            found = {key for key in found if self._domain.get(key) == domain}
        return sorted(found)
