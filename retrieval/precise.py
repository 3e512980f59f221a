"""PRECISE: the one document a query names, by a code, its exact title or a specific keyword.

A name identifies a document only when nothing else in the knowledge base could be meant:

- a code (``KFK-4012``, ``BR-3``) that one document contains, or, when several mention it, the
  one document that defines it (a table of codes, a heading, a list of codes, its title or its
  front-matter keywords; the others only refer to it). Every code the query names must point
  at that document. A letters-only code (``NRF``, defined in a table's body row, a list lead or
  a heading of its own, and written in capitals in the query) counts only alone, for the
  document the ranking already puts first, beside no unseen name, in a question that looks
  on-topic: capitals alone are how English writes acronyms too. A letters-only label no other
  document holds counts as such a code where its document declares it as a name: among its
  front-matter keywords (``ECR``, an order type) or glossed in parentheses ("CPP (closed, partly
  paid)");
- a label of capitals and digits the code index does not hold (a one-letter code ``W805``, a
  pay grade ``P7``, digits first ``32A``): the one document whose text holds it, else the one
  listing it as a front-matter keyword (digits first, as quantities are written, only that),
  when the ranking or the dense channel puts it first and the question looks on-topic. A code
  running text would not count as one (``L1``, ``A320``: its index entry comes from a document
  defining it) that other documents' prose also holds needs that agreement too: "can L1 lower a
  severity" is about the severity matrix, not the rota that defines L1;
- the document's exact title, or a front-matter keyword no other document contains (then the
  dense channel must agree and the question must look answerable).

A name or a number the knowledge base never holds (``unseen_names``: a campus, a product, a
code, a model number: "visiting hours at the Hangzhou campus", "the HX-Edge 700" where only the
300, 500 and 900 are documented, "TG-60") says the question is about something else. It vetoes
a title or a keyword, and a short code (C5, S2) when the dense channel's first document is
another one too; a full code is specific enough to stand whatever else the query says. Chinese
has no capitals: there, such a name is an unseen compound qualifying a title or keyword the query
matches (``cjk_kinds``: "活性炭滤池" where only V-type filters are documented). Such a
question is not HIGHLY_RELEVANT either (``at_most_reference``): the knowledge base may be about
its topic, but not about the thing it names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from retrieval.code_owners import by_codes
from retrieval.engine import Evidence
from retrieval.models import Tier
from retrieval.places import HOME_PLACES
from retrieval.ranking import RankedDoc
from retrieval.relevance import TierModel, grade
from storage.catalog_records import CatalogEntry
from storage.text import (
    CJK,
    CJK_FUNCTION_CHARS,
    LETTER_LABEL,
    MIN_CODE_CHARS,
    MIXED_LABEL,
    identifiers,
    query_labels,
)

_WORD = re.compile(r"[0-9A-Za-z_]+")
# Over the eleven evaluation sets an unseen compound of two or more characters other than
# function characters (``CJK_FUNCTION_CHARS``) before a matched title or keyword was found in 5 of
# 1,107 questions: the near-domain "南山水厂的活性炭滤池多久更换一次炭" (the knowledge base has V-type
# sand filters only), and four answerable ones that stay as they were (three REFERENCE, one
# PRECISE by a full code).
_CJK_NAME_CHARS = 2
# Words that end a Chinese place or unit name: its kind (a city, a country, a branch, an airport,
# a campus, a site). Not 公司 alone, which is mostly the company itself ("来公司").
_CJK_PLACE = re.compile(
    "分公司|子公司|办事处|分行|支行|分部|分院|分校|校区|园区|厂区|机场|港口|省|市|县|区|镇|国"
)


def precise_doc(
    evidence: Evidence,
    ranked: Sequence[RankedDoc],
    feats: Mapping[str, float],
    model: TierModel,
    entries: Mapping[str, CatalogEntry],
    names: Sequence[str],
) -> str | None:
    """The one document the query names, or None; ``names`` is ``unseen_names(evidence)``."""
    visible = {d.doc_key for d in ranked}
    unseen_name = bool(names)
    by_code: dict[str, set[str]] = {}
    for hit in evidence.l0:
        if hit.kind == "code" and hit.doc_key in visible:
            by_code.setdefault(hit.term.upper(), set()).add(hit.doc_key)
    # Beside a code with letters and a digit or a separator, a letters-only one (ODS, DND) or a
    # number (5100) is context; alone, each is weaker evidence (``_by_letter_codes``).
    letters = {code: docs for code, docs in by_code.items() if code.isalpha() or code.isdigit()}
    by_code = {code: docs for code, docs in by_code.items() if code not in letters}
    for label, owner in _declared_letter_labels(evidence, entries).items():
        if owner in visible:
            letters.setdefault(label, {owner})
    if letters and not by_code:
        doc = _by_letter_codes(letters, ranked, feats, model, entries, unseen_name)
        if doc is not None:
            return doc
    elif not by_code and not unseen_name:
        unindexed = _by_unindexed_label(evidence, entries)
        if unindexed in visible and _ranking_agrees(ranked, unindexed) and _on_topic(feats, model):
            return unindexed
    if by_code:
        doc = by_codes(by_code, entries, _first(ranked))
        if doc is not None and unseen_name and all(_alnum(code) < MIN_CODE_CHARS for code in by_code):
            # A short code (C5, S2) beside a name the knowledge base lacks, and the dense channel
            # prefers another document: a Citroen C5, not cabinet C5.
            return doc if _dense_first(ranked) == doc else None
        if doc is not None and _held_elsewhere([c for c in by_code if not identifiers(c)], doc, evidence):
            # A label running text would not count as a code (L1, A320) is indexed only where a
            # document defines it, so its other documents' prose is unseen by the index: a
            # support level or an aircraft type named in many pages, which the question may be
            # about less than about what it qualifies ("can L1 lower a severity" is answered by
            # the severity matrix, not the rota that defines L1). It names its defining document
            # only where the ranking or the dense channel puts that document first. Over the
            # fourteen evaluation sets this took the two false PRECISE (L1, A320) to REFERENCE
            # and changed nothing else; E412 (also only a keyword's code) stays: no prose has it.
            return doc if _ranking_agrees(ranked, doc) else None
        return doc
    if unseen_name:
        return None
    titles = {h.doc_key for h in evidence.l0 if h.kind == "title"} & visible
    if len(titles) == 1:
        return next(iter(titles))
    return _by_keyword(evidence, ranked, feats, model, visible)


def unseen_names(evidence: Evidence) -> list[str]:
    """The query's terms the knowledge base never holds that name something: with a digit (a code,
    a number), capitalised after the first word (a proper noun), a listed place it writes in
    neither script (``retrieval.places``), or, in Chinese, which has no capitals, an unseen
    compound right before a term the query matches exactly (``cjk_kinds``) or a word for a kind
    of place (``cjk_places``)."""
    words = _WORD.findall(evidence.query)
    proper = {w.lower() for w in words[1:] if w[0].isupper()}
    # A place the knowledge base writes in the other script is no unseen name (Chengdu: 成都).
    written = {word for place, held in evidence.places if held for word in place.split()}
    latin = [t for t in evidence.unseen if (t in proper or any(c.isdigit() for c in t)) and t not in written]
    places = [place for place, held in evidence.places if not held and place not in HOME_PLACES]
    return sorted({*latin, *places, *evidence.names, *cjk_kinds(evidence), *cjk_places(evidence)})


def cjk_kinds(evidence: Evidence) -> list[str]:
    """Unseen Chinese compounds that qualify a title or keyword the query names: a kind of it the
    knowledge base lacks (活性炭滤池 where it documents only V型滤池, as "the HX-Edge 700").

    Walking back from the matched term, each character joins the compound while it is no function
    character and its bigram with the next is one the knowledge base never holds; two or more
    characters make a name. A single unseen bigram is usually a word boundary (家里|新装).
    """
    unseen = set(evidence.unseen)
    query = evidence.query
    found: dict[str, None] = {}
    for term in {h.term for h in evidence.l0 if h.kind != "code" and CJK.search(h.term)}:
        at = query.find(term)
        while at > 0:
            compound = _unseen_before(query, at, unseen, stop=CJK_FUNCTION_CHARS)
            if len(compound) >= _CJK_NAME_CHARS:
                found.setdefault(compound, None)
            at = query.find(term, at + 1)
    return list(found)


def cjk_places(evidence: Evidence) -> list[str]:
    """Unseen Chinese names of a place or an organisation's unit: the compound before a word that
    says what kind of place it is (成都|分公司, 日本|子公司, 首都|机场), two or more characters
    whose bigrams the knowledge base never holds. A branch, a city or an airport it never writes
    is one it has nothing specific on, as "the Hangzhou campus" is in English, which capitals mark."""
    unseen = set(evidence.unseen)
    query = evidence.query
    found: dict[str, None] = {}
    for match in _CJK_PLACE.finditer(query):
        # A function character may belong to a name here (成都, 首都): only a leading one is cut off.
        name = _unseen_before(query, match.start(), unseen, stop="").lstrip(CJK_FUNCTION_CHARS)
        if len(name) >= _CJK_NAME_CHARS:
            found.setdefault(name, None)
    return list(found)


def _unseen_before(query: str, at: int, unseen: set[str], *, stop: str) -> str:
    """The Chinese characters right before ``at`` that each form, with the character after them,
    a bigram the knowledge base never holds; the walk back ends at a character of ``stop``."""
    start = at
    while (
        start > 0
        and CJK.fullmatch(query[start - 1])
        and query[start - 1] not in stop
        and query[start - 1 : start + 1] in unseen
    ):
        start -= 1
    return query[start:at]


def at_most_reference(tier: Tier, names: Sequence[str]) -> Tier:
    """HIGHLY_RELEVANT becomes REFERENCE when the query names something the knowledge base lacks
    (``names``: ``unseen_names`` of its evidence).

    Held out over the nine evaluation sets this took 9 of 91 HIGHLY_RELEVANT results: 5 wrong
    (4 near-domain: "TG-60 on a new Vietnamese customer", "GS-8003") and 4 right, now REFERENCE.
    """
    return Tier.REFERENCE if tier is Tier.HIGHLY_RELEVANT and names else tier


def _by_letter_codes(
    by_code: Mapping[str, set[str]],
    ranked: Sequence[RankedDoc],
    feats: Mapping[str, float],
    model: TierModel,
    entries: Mapping[str, CatalogEntry],
    unseen_name: bool,
) -> str | None:
    # Letters only (NRF) is also how English writes an acronym (VPN, PDF), and the table that
    # defines one is often not what the question is about ("open a DND door" is answered by the
    # room-entry rules, not the room-status code table). Such codes name their document only when
    # the ranking already puts it first, beside no unseen name, in a question that looks on-topic.
    doc = by_codes(by_code, entries, _first(ranked))
    if doc is None or unseen_name or doc != _first(ranked):
        return None
    return doc if _on_topic(feats, model) else None


def _on_topic(feats: Mapping[str, float], model: TierModel) -> bool:
    """Whether the question looks on-topic: graded above NO_MATCH without PRECISE."""
    return grade(feats, model, precise=False) is not Tier.NO_MATCH


def _by_keyword(
    evidence: Evidence,
    ranked: Sequence[RankedDoc],
    feats: Mapping[str, float],
    model: TierModel,
    visible: set[str],
) -> str | None:
    # A keyword no other document contains is specific, but a question can still be off-topic
    # around it: no other document may be named too, it must be the dense channel's first
    # document, and the question must look answerable.
    keyword_docs = set(evidence.specific_keyword_docs) & visible
    named = {h.doc_key for h in evidence.l0 if h.kind != "code"} & visible
    if (
        len(keyword_docs) == 1
        and named == keyword_docs
        and _dense_first(ranked) in keyword_docs
        and grade(feats, model, precise=False) is Tier.HIGHLY_RELEVANT
    ):
        return next(iter(keyword_docs))
    return None


def _declared_letter_labels(evidence: Evidence, entries: Mapping[str, CatalogEntry]) -> dict[str, str]:
    """Letters-only labels in capitals (ECR) that one document alone holds and declares as a
    name: among its front-matter keywords, or glossed in parentheses ("CPP (closed, partly paid)").

    Such a label is how its document names a thing (an order type, a close reason) even where no
    table or list defines it; held by no other document, it is as specific as a code in a table's
    body row, and is treated as one (``_by_letter_codes``). An acronym the body only uses (PDF,
    JOIN) is not declared, and one the author lists in several documents names none. Over the
    fourteen evaluation sets this made three questions PRECISE, each on its labelled document: two
    codes (ECR, CPP and CWP) and "huawei RMA"; counting every capitals word one document holds
    instead made fourteen more, PDF and CT among them, and was not kept. The holders come from
    the full-text index, which splits codes at their separators: "PMS" is no declared label where
    other documents hold codes such as PMS-E104.
    """
    found: dict[str, str] = {}
    for label in (w for w in query_labels(evidence.query) if LETTER_LABEL.fullmatch(w)):
        holders = _holders(label, evidence, keywords=True)
        if len(holders) != 1 or holders[0] not in entries:
            continue
        entry = entries[holders[0]]
        glossed = re.search(rf"{_bounded(label)}\s?[(（]", entry.body) is not None
        if label in entry.keywords or glossed:
            found[label] = holders[0]
    return found


def _by_unindexed_label(evidence: Evidence, entries: Mapping[str, CatalogEntry]) -> str | None:
    """The one document every capitals-and-digits label in the query (W805, 32A) points at, for
    labels the code index does not hold: the only document whose text holds it, else the only
    one listing it among its front-matter keywords.

    Running text counts an identifier only from two letters and three digits (AL-1107, HX300), so
    a one-letter code (W805), a pay grade (P7), a bolt size (M16) or a code that starts with its
    digits (32A) is indexed only where a document defines it. Written in capitals with a digit it
    is still a name; held by one document, it names that one. Digits first is also how a quantity
    is written (200MB, 15GHz), so such a label counts only as a front-matter keyword. Being
    unindexed it is weaker evidence than a code: the caller needs the ranking's agreement too.
    Over the fourteen evaluation sets this made four questions PRECISE, each on its labelled
    document: two codes (W805, 32A) and "我是 P7" and "M16 压板螺丝"; with digits first held by the
    body alone, "under 200MB" became PRECISE too (right, but a size is no name).
    """
    labels = {w for w in query_labels(evidence.query) if MIXED_LABEL.fullmatch(w)}
    labels -= {h.term.upper() for h in evidence.l0 if h.kind == "code"}
    owners: set[str | None] = set()
    for label in labels:
        holders = [k for k in _holders(label, evidence, keywords=False) if k in entries]
        listing = [k for k in holders if label in entries[k].keywords]
        candidates = listing if label[0].isdigit() else holders
        owners.add(candidates[0] if len(candidates) == 1 else listing[0] if len(listing) == 1 else None)
    return owners.pop() if len(owners) == 1 else None


def _holders(label: str, evidence: Evidence, *, keywords: bool) -> list[str]:
    """The documents whose text holds ``label`` as a word (``Evidence.label_holders``: at most
    three, enough to tell one from several), or, with ``keywords``, list it among their front-matter
    keywords (the query's keyword hits)."""
    held = set(dict(evidence.label_holders).get(label, ()))
    if keywords:
        held.update(h.doc_key for h in evidence.l0 if h.kind == "keyword" and h.term.upper() == label)
    return sorted(held)


def _held_elsewhere(labels: Sequence[str], doc: str, evidence: Evidence) -> bool:
    """Whether a document other than ``doc`` holds one of ``labels`` in its body."""
    return any(key != doc for label in labels for key in _holders(label, evidence, keywords=False))


def _bounded(label: str) -> str:
    """A pattern for ``label`` as a whole word: 'W805' is not in 'W8050' nor in 'AW805'."""
    return rf"(?<![0-9A-Za-z_-]){re.escape(label)}(?![0-9A-Za-z_-])"


def _ranking_agrees(ranked: Sequence[RankedDoc], doc: str | None) -> bool:
    """Whether the ranking or the dense channel alone puts ``doc`` first."""
    return doc is not None and doc in ((ranked[0].doc_key if ranked else None), _dense_first(ranked))


def _first(ranked: Sequence[RankedDoc]) -> str | None:
    """The document the ranking puts first."""
    return ranked[0].doc_key if ranked else None


def _dense_first(ranked: Sequence[RankedDoc]) -> str | None:
    """The document the dense channel alone puts first."""
    scored = [d for d in ranked if d.similarity is not None]
    return min(scored, key=lambda d: -(d.similarity or 0.0)).doc_key if scored else None


def _alnum(code: str) -> int:
    return sum(c.isalnum() for c in code)
