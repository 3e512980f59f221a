"""Names a query writes that the knowledge base lacks, beyond its unseen capitalised and numbered terms.

``Evidence.unseen`` lists the query's terms no chunk holds; ``retrieval.precise.unseen_names``
reads a name among them where a capital after the first word or a digit marks one. Two kinds of
name that reading misses:

- **a leading capitalised word** that no chunk holds and no generic question uses ("Potain crane
  anti-collision zone settings", "Kanopy 电影平台怎么登录"): a brand, a product or a vendor at the
  head of the question. An English question's first word is capitalised whatever it is, so a word
  the shipped background questions use ("Recommend", "How") is no name; in a Chinese question a
  Latin word is written as it is spelt.
- **a short code outside a family the knowledge base defines** ("PC-5" where its tables define
  PC-1 to PC-4, "P5" beside P0 to P3): shorter than an identifier, it is no lexical term, so it is
  never "unseen", but the knowledge base's own codes say it is not one of them.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from storage.keyword_index import KeywordIndex
from storage.text import CJK, CODE_WORD, MIN_CODE_CHARS, NAME_WORD, code_family, code_label

_LEADING_WORD = re.compile(rf"\s*({NAME_WORD.pattern})\b")


def names_beside_terms(
    query: str, unseen: Collection[str], codes: KeywordIndex, common: Collection[str]
) -> tuple[str, ...]:
    """The leading name and the short codes outside a defined family (lower-cased, as terms are)."""
    found = [*_leading_name(query, unseen, common), *_codes_outside_families(query, unseen, codes)]
    return tuple(dict.fromkeys(found))


def _leading_name(query: str, unseen: Collection[str], common: Collection[str]) -> list[str]:
    match = _LEADING_WORD.match(query)
    if match is None or not match.group(1)[0].isupper():
        return []
    word = match.group(1).lower()
    if word not in unseen or (word in common and not CJK.search(query)):
        return []
    return [word]


def _codes_outside_families(query: str, unseen: Collection[str], codes: KeywordIndex) -> list[str]:
    found = []
    for word in CODE_WORD.findall(query):
        label = code_label(word)
        if label is None or not any(c.isdigit() for c in label):
            continue  # a numbered family's member has a number (PC-5, not TE-P)
        if sum(c.isalnum() for c in label) >= MIN_CODE_CHARS:
            continue  # an identifier is a lexical term: ``unseen`` already says whether it is held
        if codes.holds_code(label) or code_family(label) not in codes.families:
            continue
        # Written without a separator (P5), it is a lexical term too: held by some chunk, it is seen.
        if label.isalnum() and label.lower() not in unseen:
            continue
        found.append(label.lower())
    return found
