"""Text facts shared by every layer: CJK detection, language, identifiers and lexical terms.

Each rule is defined here once, so the chunker, the keyword index, the lexical index and the
relevance grading always agree on what is Chinese, what is an identifier and what is a term.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal

from storage.markdown import TABLE_DELIMITER_ROW, unquoted
from storage.numeric_codes import defined_numbers

Language = Literal["en", "zh"]
ChunkLanguage = Literal["en", "zh", "mixed"]

# CJK ideographs (unified, extension A and compatibility). Kana and Hangul are not Chinese and
# are treated like other scripts.
_CJK_CHARACTER = r"[\u3400-\u9fff\uf900-\ufaff]"
CJK = re.compile(_CJK_CHARACTER)
_CJK_RUN = re.compile(_CJK_CHARACTER + "+")
_LATIN_WORD = re.compile(r"[A-Za-z]{2,}")
# A Latin word as a name is written: a letter, then letters or digits (Potain, PS5).
NAME_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]+")
_WORD = re.compile(r"[0-9A-Za-z_]+")
# Code-shaped identifiers: ERR_TIMEOUT, KAFKA_E503_REBALANCE, KFK-4012, AL-1107, AADSTS50105,
# HTTP 504. Upper-case segments joined by '_' or '-', letters followed by digits, or HTTP + status.
_IDENTIFIER = re.compile(
    r"(?<![\w-])(?:[A-Z][A-Z0-9]*(?:[_-][A-Z0-9]+)+|[A-Z]{2,}\d{3,}|HTTP[ _-]?[1-5]\d\d)(?![\w-])",
    re.IGNORECASE,
)
# The version of the rules in this module: part of every document's content hash, so a change
# here rewrites the catalog's terms and identifiers on the next ingest (vectors are kept).
RULES_VERSION = "8"
# Shorter codes (BR-3, PR-A, C5) are too ambiguous in running text to name one document: they
# count only where a document defines them (``defined_codes``).
MIN_CODE_CHARS = 4
# A label a document can define: upper-case letters first, then letters and digits, segments
# joined by '-' or '_', with a digit or a separator (BR-3, PR-A, C5, TK-MIN-01; not "API").
_LABEL = re.compile(r"[A-Z][A-Z0-9]*(?:[_-][A-Z0-9]+)*")
# A letters-only label (HD, NRF, BAR, STAFF): two to eight capitals. Capitals alone are also how
# English writes acronyms (PDF, VPN, CEO), which name a topic, not one document, so such a label
# is a code only where a body lists it as one (``defined_codes``): never in running text, a
# table's header row, a heading with more words after it, or front-matter keywords.
_LETTER_LABEL = re.compile(r"[A-Z]{2,8}")
# A one-letter label (a status W, F or M in a table of statuses) is defined only in a table's body
# row or a list lead in bold or code quotes: "- A: ..." leads the answer of a FAQ, and "## A" an
# index section. A query names it only where it stands apart (``standalone_letters``).
_ONE_LETTER = re.compile(r"[A-Z]")
_ONE_LETTER_PLACES = ("cell", "bold", "quoted")
# Capitals that are words, not labels: the English pronoun.
_LETTER_WORDS = frozenset("I")
# Where a sentence starts, a capital is the sentence's, not a label.
_SENTENCE_ENDS = ".!?。！？"
# Where a document defines a label: the first cell of a table row, the first word of a heading,
# or the lead of a list item (bold, code-quoted, or followed by a colon or dash).
_DEFINITION = re.compile(
    r"^\s*(?:\|\s*(?P<cell>[^|]+?)\s*\||#{1,6}\s+(?P<heading>[^\s:：]+)(?P<rest>[^\n]*)"
    r"|[-*+]\s+(?:\*\*(?P<bold>[^*]+)\*\*|`(?P<quoted>[^`]+)`|(?P<lead>\S+?)\s*[:：—–]))",
    re.MULTILINE,
)
_DEFINED = ("cell", "heading", "bold", "quoted", "lead")
# What must follow a letters-only label for a heading to define it: a colon or dash and its
# meaning ("## NRF: non-refundable"); "## FAQ" or "## API keys" is a section about a topic.
_HEADING_MEANING = re.compile(r"\s*[:：—–-]\s*\S.*")
# A Chinese word is about 1.7 characters; Chinese prose full of English identifiers stays "zh".
_CJK_CHARS_PER_WORD = 1.7

# Common function words that carry no topic; terms are matched after lower-casing.
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "how",
        "i",
        "in",
        "is",
        "it",
        "of",
        "on",
        "or",
        "our",
        "should",
        "the",
        "this",
        "to",
        "we",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
        "my",
        "me",
        "there",
        "their",
        "its",
        "if",
        "then",
        "than",
        "into",
        "about",
        "any",
        "all",
        "use",
        "used",
        "using",
        "get",
        "set",
    ]
)


# Characters that end a Chinese compound rather than belong to one: particles, pronouns,
# prepositions, auxiliaries and question words ("的", "里", "在", "要", "多久"). A string, for
# ``str.strip`` and ``in`` alike.
CJK_FUNCTION_CHARS = (
    "的地得了着过在里和与及或把被给从向对就都也还要能会可让是有吗呢吧啊么这那哪个一我你他她它们"
    "将已每各该不没很最更再又才先后前上下中内外时多少几怎什为请如"
)
# Chinese function words: bigrams every question has ("怎么", "哪个"), which would otherwise
# count as lexical evidence for whichever chunk happens to contain them.
_CJK_STOP_BIGRAMS = frozenset(
    [
        "怎么",
        "什么",
        "哪个",
        "哪些",
        "如何",
        "为什么",
        "是否",
        "可以",
        "需要",
        "应该",
        "我们",
        "你们",
        "他们",
        "这个",
        "那个",
        "一个",
        "多少",
        "怎样",
        "是什",
        "么是",
        "么样",
        "么办",
        "怎么办",
        "有没",
        "没有",
        "的话",
        "时候",
        "吗",
        "呢",
        "请问",
        "一下",
        "以及",
        "或者",
        "还是",
        "如果",
        "因为",
        "所以",
        "但是",
        "就是",
        "哪里",
        "这些",
        "那些",
        "已经",
        "能否",
        "能不",
        "不能",
        "一般",
        "之后",
        "之前",
        "的时",
        "候会",
        "会不",
        "不会",
        "是哪",
        "个是",
    ]
)


def detect_language(text: str) -> Language:
    """zh when the text contains CJK ideographs, else en (for queries and hints)."""
    return "zh" if CJK.search(text) else "en"


def text_language(text: str) -> ChunkLanguage:
    """zh or en when one language clearly dominates the text, mixed otherwise (for chunks)."""
    zh_words = len(CJK.findall(text)) / _CJK_CHARS_PER_WORD
    en_words = len(_LATIN_WORD.findall(text))
    share = zh_words / (zh_words + en_words) if zh_words + en_words else 0.0
    if share >= 0.7:
        return "zh"
    return "en" if share <= 0.1 else "mixed"


def _is_code(token: str) -> bool:
    """An identifier has a digit or a separator; 'HTTP' alone or 'UTF' is a word, not a code."""
    return any(c.isdigit() for c in token) or "_" in token or "-" in token


# Labels as a query writes them: letters only in capitals (ECR, CPP), or capitals and digits with
# both (W805, 32A, P7, L1). Running text indexes such a label only where a document defines it.
LETTER_LABEL = re.compile(r"[A-Z]{2,8}")
MIXED_LABEL = re.compile(r"(?=[0-9A-Z]*[0-9])(?=[0-9A-Z]*[A-Z])[0-9A-Z]{2,8}")
# A word as codes are written: letters, digits, "-" and "_" (JH-R-D03).
CODE_WORD = re.compile(r"[0-9A-Za-z_-]+")
_FAMILY = re.compile(r"[A-Za-z]+")


def query_labels(text: str) -> list[str]:
    """The words of ``text`` shaped as a label (``LETTER_LABEL`` or ``MIXED_LABEL``), in order.

    A word joined to others by '-' or '_' is part of a code (JH-R-D03), not a label of its own."""
    words = (w for w in CODE_WORD.findall(text) if LETTER_LABEL.fullmatch(w) or MIXED_LABEL.fullmatch(w))
    return list(dict.fromkeys(words))


def standalone_letters(text: str) -> set[str]:
    """The single capitals of ``text`` that stand as labels ("状态是F", "item status M"): a word
    of one letter, not "I", and not where a sentence starts ("A patron lost ...")."""
    return {
        match.group(0)
        for match in CODE_WORD.finditer(text)
        if _ONE_LETTER.fullmatch(match.group(0))
        and match.group(0) not in _LETTER_WORDS
        and not _starts_sentence(text, match.start())
    }


def _starts_sentence(text: str, at: int) -> bool:
    """Whether only spaces stand between ``at`` and the text's start or a sentence's end."""
    before = at
    while before > 0 and text[before - 1].isspace():
        before -= 1
    return before == 0 or text[before - 1] in _SENTENCE_ENDS


def identifiers(text: str) -> list[str]:
    """Code-shaped identifiers in text, normalised to upper case with single separators."""
    found: dict[str, None] = {}
    for match in _IDENTIFIER.finditer(text):
        raw = match.group(0)
        if not _is_code(raw) and not raw.upper().startswith("HTTP"):
            continue
        if sum(c.isalnum() for c in raw) < MIN_CODE_CHARS:
            continue
        if raw.upper().startswith("HTTP"):
            normal = "HTTP " + raw[-3:]
        else:
            normal = raw.upper()
            # Lower-case words joined by '-' ("follow-up") are prose, not codes.
            if not (any(c.isdigit() for c in raw) or "_" in raw or raw.isupper()):
                continue
        found.setdefault(normal, None)
    return list(found)


def code_label(text: str) -> str | None:
    """``text`` as a code label (upper case), or None if it is a word, a number or prose.

    Short labels qualify (BR-3, PR-A, C5), so only a place that defines a label may call this.
    """
    token = unquoted(text)
    if not _LABEL.fullmatch(token) or sum(c.isalnum() for c in token) < 2:
        return None
    return token if any(c.isdigit() for c in token) or "_" in token or "-" in token else None


def code_family(code: str) -> str:
    """The letters a code starts with, before its first digit or separator (PC of PC-5, P of P0)."""
    match = _FAMILY.match(code)
    return match.group(0).upper() if match else ""


def defined_codes(text: str) -> list[str]:
    """The code labels a markdown text defines: first table cells, heading starts, list item leads.

    A table of codes, a section per code or a list of codes is where a document says what a
    code means; elsewhere a code is only mentioned. A letters-only label (NRF) counts in a body
    row of a table, a list lead, or a heading that is the label and its meaning only.
    """
    found: dict[str, None] = {}
    for match in _DEFINITION.finditer(text):
        place = next(g for g in _DEFINED if match.group(g) is not None)
        label = code_label(match.group(place)) or _letter_label(text, match, place)
        if label is not None:
            found.setdefault(label, None)
    return list(found)


def _letter_label(text: str, match: re.Match[str], place: str) -> str | None:
    """The letters-only label a definition's lead is, unless it heads a table or a topic."""
    token = unquoted(match.group(place))
    one_letter = _ONE_LETTER.fullmatch(token) is not None and place in _ONE_LETTER_PLACES
    if not (_LETTER_LABEL.fullmatch(token) or one_letter):
        return None
    if place == "heading" and not _HEADING_MEANING.fullmatch(match.group("rest")):
        return None
    if place == "cell":
        line_end = text.find("\n", match.end())
        following = text[line_end + 1 :].split("\n", 1)[0] if line_end >= 0 else ""
        if TABLE_DELIMITER_ROW.fullmatch(following):
            return None
    return token


_HEADING_LINE = re.compile(r"^#{1,6}\s+(.+)$", re.MULTILINE)


def heading_codes(text: str) -> list[str]:
    """The identifiers the headings of a markdown text hold, anywhere in the heading
    ("## 一、浇灌令（ZL-F06）"): a section named for a code is about it."""
    return list(dict.fromkeys(code for line in _HEADING_LINE.findall(text) for code in identifiers(line)))


def short_codes(text: str) -> list[str]:
    """The labels ``text`` defines that running text would not count as identifiers: shorter
    than ``MIN_CODE_CHARS`` (BR-3, C5) or letters only (HD, NRF, STAFF).

    A longer label that running text misses (W805, PA66) is not one: in a table's first column
    it is as often a material, model or part (PA66 in a drying table) as a code, and counting
    it gave a false PRECISE for each code it found over the thirteen evaluation sets."""
    return [c for c in defined_codes(text) if sum(ch.isalnum() for ch in c) < MIN_CODE_CHARS or c.isalpha()]


def document_codes(title: str, keywords: Sequence[str], body: str) -> list[str]:
    """A document's identifiers: codes anywhere in it, short ones (BR-3, C5) where it defines them
    (a table of codes, a heading, a list of codes, or its own front-matter keywords), letters-only
    ones (NRF) where its body does, and numbers where it defines them as codes (5100 in a table
    of fault codes: ``storage.numeric_codes``)."""
    codes = identifiers("\n".join([title, *keywords, body]))
    labels = [
        *short_codes(body),
        *(c for k in keywords if (c := code_label(k)) is not None),
        *defined_numbers(body, keywords),
    ]
    return codes + [c for c in dict.fromkeys(labels) if c not in codes]


def terms(text: str) -> list[str]:
    """Lexical terms: lower-cased Latin words and identifiers, and CJK character bigrams.

    Chinese has no spaces, so overlapping bigrams stand in for words (a single character is too
    ambiguous to count). Identifiers are kept whole as well as split, so ``ERR_TIMEOUT`` matches
    both the code and the words ``err`` and ``timeout``.
    """
    out: list[str] = []
    for word in _WORD.findall(text):
        lowered = word.lower()
        if "_" in lowered:
            out.append(lowered)
            out.extend(p for p in lowered.split("_") if len(p) > 1 and p not in _STOPWORDS)
        elif len(lowered) > 1 and lowered not in _STOPWORDS:
            out.append(lowered)
    for run in _CJK_RUN.findall(text):
        if len(run) == 1:
            out.append(run)
        out.extend(b for i in range(len(run) - 1) if (b := run[i : i + 2]) not in _CJK_STOP_BIGRAMS)
    for code in identifiers(text):
        if "-" in code or " " in code:
            out.append(code.lower().replace("-", "_").replace(" ", "_"))
    return out
