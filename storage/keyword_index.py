"""L0: exact matching of document titles, keywords and identifiers against a query.

Latin and identifier terms match whole tokens, case-insensitively (``err_timeout`` matches
``ERR_TIMEOUT`` but ``TIMEOUT`` does not match ``ERR_TIMEOUT_X``). Terms containing CJK match
as substrings, since Chinese has no spaces. Lookups are dictionary probes over the query's
token n-grams and CJK substrings, so the cost does not grow with the number of documents.

Identifiers come from the whole document, body included: real knowledge bases list their codes
in tables, not in front matter. A letters-only code (``NRF``) matches only a query token written
the same way, in capitals.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from storage.numeric_codes import standalone_numbers
from storage.text import CJK, code_family, identifiers, standalone_letters

_TOKEN = re.compile(r"[0-9A-Za-z_]+")
# Terms shorter than this (in characters) would match too much to be "exact".
_MIN_LATIN = 2
_MIN_CJK = 2

MatchKind = Literal["code", "title", "keyword"]


@dataclass(frozen=True)
class KeywordEntry:
    doc_key: str
    domain: str
    title: str
    keywords: tuple[str, ...]
    identifiers: tuple[str, ...] = ()


@dataclass(frozen=True)
class L0Hit:
    doc_key: str
    kind: MatchKind
    term: str


def _latin_tokens(text: str) -> tuple[str, ...]:
    return tuple(t.lower() for t in _TOKEN.findall(text))


class KeywordIndex:
    """Maps terms to documents and finds which documents a query names exactly."""

    def __init__(self, entries: Iterable[KeywordEntry]) -> None:
        self._latin: dict[tuple[str, ...], set[tuple[str, MatchKind, str]]] = defaultdict(set)
        self._cjk: dict[str, set[tuple[str, MatchKind, str]]] = defaultdict(set)
        self._domain: dict[str, str] = {}
        self._codes: set[str] = set()
        for entry in entries:
            self._domain[entry.doc_key] = entry.domain
            self._add(entry.title, entry.doc_key, "title")
            for keyword in entry.keywords:
                self._add(keyword, entry.doc_key, "keyword")
            for code in {*entry.identifiers, *identifiers(entry.title)}:
                self._add(code, entry.doc_key, "code")
                self._codes.add(code.upper())
        # The letters codes with a digit start with (PC of PC-1, P of P0): the knowledge base's
        # families of numbered codes.
        self.families = frozenset(code_family(c) for c in self._codes if any(ch.isdigit() for ch in c))
        self._max_ngram = max((len(k) for k in self._latin), default=0)
        self._cjk_lengths = sorted({len(k) for k in self._cjk})

    def _add(self, term: str, doc_key: str, kind: MatchKind) -> None:
        term = term.strip()
        lowered = term.lower()
        if CJK.search(lowered):
            if len(lowered) >= _MIN_CJK:
                self._cjk[lowered].add((doc_key, kind, term))
            return
        tokens = _latin_tokens(lowered)
        # A one-letter code (a status W) is indexed only as a code: the query must write it apart.
        one_letter = kind == "code" and len(term) == 1 and term.isupper()
        if tokens and (len("".join(tokens)) >= _MIN_LATIN or one_letter):
            self._latin[tokens].add((doc_key, kind, term))

    def holds_code(self, code: str) -> bool:
        """Whether some document holds ``code`` (upper case) as a code."""
        return code in self._codes

    def __len__(self) -> int:
        return len(self._domain)

    def match(self, query: str, domain: str | None = None) -> list[L0Hit]:
        """What the query names exactly, sorted; restricted to domain when given."""
        found: set[tuple[str, MatchKind, str]] = set()
        tokens = _latin_tokens(query)
        for size in range(1, min(self._max_ngram, len(tokens)) + 1):
            for start in range(len(tokens) - size + 1):
                found |= self._latin.get(tokens[start : start + size], set())
        lowered = query.lower()
        for length in self._cjk_lengths:
            for start in range(len(lowered) - length + 1):
                found |= self._cjk.get(lowered[start : start + length], set())
        # A letters-only code (NRF) counts only written in capitals: "nrf" or "Bar" is a word; a
        # one-letter code only standing apart, not "I" nor a sentence's first letter; a number only
        # written apart, not "15 天" nor "09:00".
        written = _written_as_codes(query)
        hits = [
            L0Hit(doc_key, kind, term)
            for doc_key, kind, term in found
            if kind != "code" or not (term.isalpha() or term.isdigit()) or term in written
        ]
        if domain is not None:
            hits = [h for h in hits if self._domain.get(h.doc_key) == domain]
        return sorted(hits, key=lambda h: (h.doc_key, h.kind, h.term))


def _written_as_codes(query: str) -> set[str]:
    """The query's words that may name a letters-only code or a number: capitals as written (a
    one-letter one standing apart), and numbers written apart, not as a quantity, time or date."""
    capitals = {w for w in _TOKEN.findall(query) if len(w) > 1 and w.isalpha()}
    return capitals | standalone_letters(query) | standalone_numbers(query)
