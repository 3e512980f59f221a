"""Which document a code names when several documents hold it (``retrieval.precise``).

A code held by one document names it. Held by several, it names the one named for it (its
title, a heading or its front-matter summary), else the one defining it (a table's row, a list
lead, a heading's start, its front-matter keywords), else the one defining it in its text. Where
that leaves several, or none defines it, the ranking decides for a letters-only code or a number
(weak evidence that needs the ranking anyway) and for a code no document defines; a code with
letters and a digit that several define names none, unless it follows another code of the
question to a document that defines it too.
"""

from __future__ import annotations

from collections.abc import Mapping

from storage.catalog_records import CatalogEntry
from storage.numeric_codes import defined_numbers
from storage.text import code_label, defined_codes, heading_codes, identifiers


def by_codes(
    by_code: Mapping[str, set[str]], entries: Mapping[str, CatalogEntry], first: str | None
) -> str | None:
    """The one document every named code points at; ``first`` is the document the ranking puts
    first. A code no single document owns names none, unless the others name one document that
    defines it too: "BCP-03 L2" asks about level L2 of procedure BCP-03, whose page defines the
    levels as the branch manual does."""
    owners = {code: _owner(code, docs, entries, first) for code, docs in by_code.items()}
    owning = set(owners.values()) - {None}
    if len(owning) != 1:
        return None
    doc = owning.pop()
    unowned = [code for code, owner in owners.items() if owner is None]
    return doc if all(doc in by_code[code] and defines(entries[doc], code) for code in unowned) else None


def _owner(code: str, docs: set[str], entries: Mapping[str, CatalogEntry], first: str | None) -> str | None:
    """The document a code names: the only one containing it; else the only one named for it (its
    title, a heading or its summary holds it); else the only one defining it, else the only one
    defining it in its title or text. Else the ranking decides (``first``, the document it puts
    first): for a letters-only code, among those named for it or defining it; for another, among
    all holding it where none is named for it or defines it.

    A runbook that handles a code often lists it among its front-matter keywords, beside the table
    that defines every code of its kind: the keyword tags what the runbook is for, the table row
    says what the code is, so the table is what the code names. A document named for the code,
    in its title or a heading ("浇灌令（ZL-F06）"), or in the summary it gives of itself ("…登记表
    CK-05…"), is about it, where a handbook's list of forms only names it in a row. Where several
    documents are equally the code's, the question's other words decide, as the ranking weighs
    them ("馆藏代码 YD 是什么书": the cataloguing rules over the library system's quick reference,
    whose tables both define YD)."""
    if len(docs) == 1:
        return next(iter(docs))
    held = [d for d in sorted(docs) if d in entries]
    named = [d for d in held if named_for(entries[d], code)]
    if len(named) == 1:
        return named[0]
    declaring = [d for d in held if defines(entries[d], code)]
    defining = [d for d in declaring if defines(entries[d], code, keywords=False)]
    if len(declaring) == 1:
        return declaring[0]
    if len(defining) == 1:
        return defining[0]
    if code.isalpha() or code.isdigit():
        # A letters-only code or a number names a document only where the ranking puts it first.
        return first if first in (named or declaring) else None
    # Where several define a code with a digit (P1 as a severity in every runbook, L2 among the
    # keywords of every on-call page), it is context for the question's other words, which often
    # ask about something else; where none does, the code is still a name, cited in passing
    # ("JH-R-D03" in a fleet table's last column).
    return first if not (named or declaring) and first in held else None


def named_for(entry: CatalogEntry, code: str) -> bool:
    """Whether a document is named for the code: its title, one of its headings or its summary holds
    it. Short codes (L4, P1) do not count in a summary: one that names a scale names every level
    of it ("L1–L4 四级分类标准"), and a question asking about one level asks about something else."""
    return (
        code in identifiers(entry.title)
        or code in heading_codes(entry.body)
        or code in identifiers(entry.summary)
    )


def defines(entry: CatalogEntry, code: str, *, keywords: bool = True) -> bool:
    """Whether a document defines the code, rather than only mentioning it (``keywords``: its
    front-matter keywords count as a definition)."""
    if code.isdigit():
        return code in defined_numbers(entry.body, entry.keywords if keywords else ())
    return (
        code in identifiers(entry.title)
        or (keywords and any(code_label(k) == code for k in entry.keywords))
        or code in defined_codes(entry.body)
    )
