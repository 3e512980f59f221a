"""PRECISE: the one document a query names, by a code, its exact title or a specific keyword.

A name identifies a document only when nothing else in the knowledge base could be meant:

- a code (``KFK-4012``, ``BR-3``) that one document contains, or, when several mention it, the
  one document that defines it (a table of codes, a heading, a list of codes, its title or its
  front-matter keywords; the others only refer to it). Every code the query names must point
  at that document. A letters-only code (``NRF``, defined in a table's body row, a list lead or
  a heading of its own, and written in capitals in the query) counts only alone, for the
  document the ranking already puts first, beside no unseen name, in a question that looks
  on-topic: capitals alone are how English writes acronyms too;
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

from retrieval.engine import Evidence
from retrieval.models import Tier
from retrieval.ranking import RankedDoc
from retrieval.relevance import TierModel, grade
from storage.catalog_records import CatalogEntry
from storage.text import CJK, MIN_CODE_CHARS, code_label, defined_codes, identifiers

_WORD = re.compile(r"[0-9A-Za-z_]+")
# Characters that end a Chinese compound rather than belong to one: particles, pronouns,
# prepositions, auxiliaries and question words ("的", "里", "在", "要", "多久"). Over the eleven
# evaluation sets an unseen compound of two or more other characters before a matched title or
# keyword was found in 5 of 1,107 questions: the near-domain "南山水厂的活性炭滤池多久更换一次炭"
# (the knowledge base has V-type sand filters only), and four answerable ones that stay as they
# were (three REFERENCE, one PRECISE by a full code).
_CJK_FUNCTION_CHARS = frozenset(
    "的地得了着过在里和与及或把被给从向对就都也还要能会可让是有吗呢吧啊么这那哪个一我你他她它们"
    "将已每各该不没很最更再又才先后前上下中内外时多少几怎什为请如"
)
_CJK_NAME_CHARS = 2


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
    # Beside a code with a digit or a separator, a letters-only one (ODS, DND) is context.
    letters = {code: docs for code, docs in by_code.items() if code.isalpha()}
    by_code = {code: docs for code, docs in by_code.items() if code not in letters}
    if letters and not by_code:
        doc = _by_letter_codes(letters, ranked, feats, model, entries, unseen_name)
        if doc is not None:
            return doc
    if by_code:
        doc = _by_codes(by_code, entries)
        if doc is not None and unseen_name and all(_alnum(code) < MIN_CODE_CHARS for code in by_code):
            # A short code (C5, S2) beside a name the knowledge base lacks, and the dense channel
            # prefers another document: a Citroen C5, not cabinet C5.
            return doc if _dense_first(ranked) == doc else None
        return doc
    if unseen_name:
        return None
    titles = {h.doc_key for h in evidence.l0 if h.kind == "title"} & visible
    if len(titles) == 1:
        return next(iter(titles))
    return _by_keyword(evidence, ranked, feats, model, visible)


def unseen_names(evidence: Evidence) -> list[str]:
    """The query's terms the knowledge base never holds that name something: with a digit (a code,
    a number), capitalised after the first word (a proper noun), or, in Chinese, which has no
    such mark, an unseen compound right before a term the query matches exactly (``cjk_kinds``)."""
    words = _WORD.findall(evidence.query)
    proper = {w.lower() for w in words[1:] if w[0].isupper()}
    latin = [t for t in evidence.unseen if t in proper or any(c.isdigit() for c in t)]
    return sorted([*latin, *cjk_kinds(evidence)])


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
            start = at
            while (
                start > 0
                and CJK.fullmatch(query[start - 1])
                and query[start - 1] not in _CJK_FUNCTION_CHARS
                and query[start - 1 : start + 1] in unseen
            ):
                start -= 1
            if at - start >= _CJK_NAME_CHARS:
                found.setdefault(query[start:at], None)
            at = query.find(term, at + 1)
    return list(found)


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
    doc = _by_codes(by_code, entries)
    if doc is None or unseen_name or not ranked or ranked[0].doc_key != doc:
        return None
    return doc if grade(feats, model, precise=False) is not Tier.NO_MATCH else None


def _by_codes(by_code: Mapping[str, set[str]], entries: Mapping[str, CatalogEntry]) -> str | None:
    """The one document every named code points at; a code no single document owns names none."""
    owners = {_owner(code, docs, entries) for code, docs in by_code.items()}
    return owners.pop() if len(owners) == 1 else None


def _owner(code: str, docs: set[str], entries: Mapping[str, CatalogEntry]) -> str | None:
    """The document a code names: the only one containing it, else the only one defining it."""
    if len(docs) == 1:
        return next(iter(docs))
    defining = [d for d in sorted(docs) if d in entries and defines(entries[d], code)]
    return defining[0] if len(defining) == 1 else None


def defines(entry: CatalogEntry, code: str) -> bool:
    """Whether a document defines the code, rather than only mentioning it."""
    return (
        code in identifiers(entry.title)
        or any(code_label(k) == code for k in entry.keywords)
        or code in defined_codes(entry.body)
    )


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


def _dense_first(ranked: Sequence[RankedDoc]) -> str | None:
    """The document the dense channel alone puts first."""
    scored = [d for d in ranked if d.similarity is not None]
    return min(scored, key=lambda d: -(d.similarity or 0.0)).doc_key if scored else None


def _alnum(code: str) -> int:
    return sum(c.isalnum() for c in code)
