"""PDF to markdown through pdfplumber (on pdfminer.six): text lines, font sizes and tables.

A PDF has no headings or paragraphs, only positioned words, so the structure is read from the
layout: the most common font size is the body text, larger sizes are headings (the largest
``#``, the next ``##``, ...), a short line wholly in bold is the lowest heading level, tables
found by pdfplumber become markdown tables in place, monospaced lines become code blocks, and
lines repeated at the top or bottom of most pages (running headers, footers, page numbers) are
dropped. A PDF with no text at all is a scan, refused rather than ingested empty.
"""

from __future__ import annotations

import io
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pdfplumber
from pdfminer.pdfdocument import PDFEncryptionError, PDFPasswordIncorrect
from pdfminer.psparser import PSException
from pdfplumber.utils.exceptions import PdfminerException

from storage.convert._html import markdown_table
from storage.convert._types import ConversionError, Converted

_HEADING_RATIO = 1.12  # a line this much larger than the body text is a heading
_MARGIN = 0.1  # the top and bottom tenth of a page, where running headers and footers sit
_MONOSPACE = re.compile(r"courier|mono|consol|menlo", re.IGNORECASE)
_BULLET = re.compile(r"^[•▪◦●■‣∙·–-]\s*")
_PAGE_NUMBER = re.compile(r"^(page\s*)?\d+(\s*(/|of)\s*\d+)?$|^第\s*\d+\s*页", re.IGNORECASE)


@dataclass(frozen=True)
class _Line:
    top: float
    text: str
    size: float
    bold: bool
    mono: bool
    gap: float  # space above the line, in points (0 for the first line of a page)
    margin: bool  # in the top or bottom margin of its page


@dataclass(frozen=True)
class _Table:
    top: float
    markdown: str


_Block = _Line | _Table


def _open(raw: bytes) -> Any:
    try:
        return pdfplumber.open(io.BytesIO(raw))
    except PdfminerException as exc:
        cause = exc.args[0] if exc.args else exc
        if isinstance(cause, PDFPasswordIncorrect | PDFEncryptionError):
            raise ConversionError("encrypted PDF (it needs a password): save a copy without one") from exc
        raise ConversionError(f"not a readable PDF ({type(cause).__name__}: {cause})") from exc


def pdf_to_markdown(raw: bytes) -> Converted:
    """The text of a PDF as markdown, with the title from its metadata."""
    with _open(raw) as pdf:
        try:
            pages = [list(_page_blocks(page)) for page in pdf.pages]
        except (PSException, ValueError, KeyError, TypeError) as exc:
            raise ConversionError(f"not a readable PDF ({type(exc).__name__}: {exc})") from exc
        title = str(pdf.metadata.get("Title") or "").strip()
    if not any(pages):
        raise ConversionError("PDF without a text layer (a scan?): run OCR on it first")
    lines = [b for page in pages for b in page if isinstance(b, _Line)]
    repeated = _repeated_chrome(pages)
    kept = [[b for b in page if not _is_chrome(b, repeated)] for page in pages]
    levels = _heading_levels(lines)
    body = _body_size(lines)
    markdown = "\n\n".join(_render(page, levels, body) for page in kept)
    return Converted(re.sub(r"\n{3,}", "\n\n", markdown).strip(), title=title)


def _page_blocks(page: Any) -> Iterator[_Block]:
    """The lines and tables of one page, top to bottom."""
    tables = page.find_tables()
    boxes = [t.bbox for t in tables]
    words = [
        w
        for w in page.extract_words(extra_attrs=["size", "fontname"], use_text_flow=True)
        if not any(
            x0 <= w["x0"] and w["x1"] <= x1 and top <= w["top"] and w["bottom"] <= bottom
            for x0, top, x1, bottom in boxes
        )
    ]
    blocks: list[_Block] = [_Table(t.bbox[1], _table(t.extract())) for t in tables]
    blocks += list(_lines(words, float(page.height)))
    yield from sorted(blocks, key=lambda b: b.top)


def _lines(words: list[dict[str, Any]], height: float) -> Iterator[_Line]:
    """Words grouped into lines by their vertical position."""
    rows: list[list[dict[str, Any]]] = []
    for word in sorted(words, key=lambda w: (round(w["top"]), w["x0"])):
        if rows and abs(rows[-1][0]["top"] - word["top"]) <= 2:
            rows[-1].append(word)
        else:
            rows.append([word])
    previous_bottom = None
    for row in rows:
        row.sort(key=lambda w: w["x0"])
        top, bottom = row[0]["top"], max(w["bottom"] for w in row)
        fonts = [str(w["fontname"]) for w in row]
        yield _Line(
            top=top,
            text=" ".join(w["text"] for w in row),
            size=round(max(float(w["size"]) for w in row), 1),
            bold=all("bold" in f.lower() for f in fonts),
            mono=all(_MONOSPACE.search(f) for f in fonts),
            gap=top - previous_bottom if previous_bottom is not None else 0.0,
            margin=top < height * _MARGIN or bottom > height * (1 - _MARGIN),
        )
        previous_bottom = bottom


def _chrome_key(text: str) -> str:
    return re.sub(r"\d+", "#", text.lower())


def _repeated_chrome(pages: list[list[_Block]]) -> set[str]:
    """Margin lines that recur on most pages: running headers and footers."""
    if len(pages) < 3:
        return set()
    counts = Counter(
        key
        for page in pages
        for key in {_chrome_key(b.text) for b in page if isinstance(b, _Line) and b.margin}
    )
    return {key for key, n in counts.items() if n >= len(pages) * 0.6}


def _is_chrome(block: _Block, repeated: set[str]) -> bool:
    if not isinstance(block, _Line) or not block.margin:
        return False
    return _chrome_key(block.text) in repeated or bool(_PAGE_NUMBER.match(block.text.strip()))


def _body_size(lines: list[_Line]) -> float:
    sizes: Counter[float] = Counter()
    for line in lines:
        sizes[line.size] += len(line.text)
    return sizes.most_common(1)[0][0] if sizes else 0.0


def _heading_levels(lines: list[_Line]) -> dict[float, int]:
    """Font size -> heading level, the largest size first; at most five sizes."""
    body = _body_size(lines)
    larger = sorted({ln.size for ln in lines if ln.size >= body * _HEADING_RATIO}, reverse=True)
    return {size: level for level, size in enumerate(larger[:5], 1)}


def _heading(line: _Line, levels: dict[float, int], body: float) -> int:
    if line.size in levels and len(line.text) <= 150:
        return levels[line.size]
    short = len(line.text) <= 80 and not line.text.rstrip().endswith((".", ":", "。", "：", ","))
    if line.bold and short and line.size >= body:
        return len(levels) + 1
    return 0


def _render(blocks: list[_Block], levels: dict[float, int], body: float) -> str:
    """Markdown of one page: headings, paragraphs (split at larger gaps), lists, code, tables."""
    out: list[str] = []
    in_code = False
    for block in blocks:
        if isinstance(block, _Table):
            out += ["```"] if in_code else []
            out += ["", block.markdown, ""]
            in_code = False
            continue
        if block.mono != in_code:
            out += ["```"] if in_code else ["", "```"]
            in_code = block.mono
        if in_code:
            out.append(block.text)
            continue
        level = _heading(block, levels, body)
        if level:
            out += ["", f"{'#' * level} {block.text}", ""]
        elif _BULLET.match(block.text):
            out.append(_BULLET.sub("- ", block.text, count=1))
        else:
            out += [""] if block.gap > block.size * 0.8 else []
            out.append(block.text)
    out += ["```"] if in_code else []
    return "\n".join(out)


def _table(rows: list[list[str | None]]) -> str:
    return markdown_table([[" ".join((cell or "").split()) for cell in row] for row in rows if any(row)])
