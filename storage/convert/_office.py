"""Word (.docx, through mammoth to HTML) and PowerPoint (.pptx, through python-pptx) to markdown.

Both are zip files: their parts are checked before anything is unpacked, so a zip bomb
disguised as a .docx is refused by its declared sizes instead of filling the memory (the
worker's memory limit stops one whose sizes lie).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from typing import Any
from xml.etree import ElementTree

import mammoth
from bs4 import BeautifulSoup
from pptx import Presentation

from storage.convert._html import fragment_to_markdown, markdown_table
from storage.convert._types import ConversionError, Converted

# A part expanding past this many times the whole file, and past _MIN_BOMB bytes, is a zip bomb:
# real documents compress their XML about 5 to 20 times.
_MAX_RATIO = 100
_MIN_BOMB = 50 * 1024 * 1024
_DC_TITLE = "{http://purl.org/dc/elements/1.1/}title"
# Word's own heading styles are mapped by mammoth; its Title style is the document's H1.
_STYLE_MAP = "p[style-name='Title'] => h1:fresh\np[style-name='Subtitle'] => h2:fresh"


def _open_zip(raw: bytes, kind: str, required: str) -> zipfile.ZipFile:
    """The zip of an Office file, refused when damaged, missing its main part, or a zip bomb."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
    except zipfile.BadZipFile as exc:
        raise ConversionError(f"not a valid {kind} file (damaged or truncated zip: {exc})") from exc
    names = set(archive.namelist())
    if required not in names:
        raise ConversionError(f"not a valid {kind} file (no {required} in the zip)")
    expanded = sum(info.file_size for info in archive.infolist())
    if expanded > _MIN_BOMB and expanded > _MAX_RATIO * len(raw):
        raise ConversionError(
            f"refused as a zip bomb: {len(raw) / 1e6:.1f} MB expanding to {expanded / 1e6:.0f} MB"
        )
    return archive


def _core_title(archive: zipfile.ZipFile) -> str:
    """The title in docProps/core.xml, "" when it has none."""
    try:
        root = ElementTree.fromstring(archive.read("docProps/core.xml"))
    except (KeyError, ElementTree.ParseError, zipfile.BadZipFile):
        return ""
    found = root.find(_DC_TITLE)
    return (found.text or "").strip() if found is not None else ""


def _read_failed(kind: str, exc: Exception) -> ConversionError:
    return ConversionError(f"not a readable {kind} file ({type(exc).__name__}: {exc})")


def docx_to_markdown(raw: bytes) -> Converted:
    """A Word document as markdown: headings, lists, tables; the title from its properties."""
    archive = _open_zip(raw, ".docx", "word/document.xml")
    try:
        html = mammoth.convert_to_html(io.BytesIO(raw), style_map=_STYLE_MAP).value
    except (zipfile.BadZipFile, KeyError, ValueError, ElementTree.ParseError, EOFError) as exc:
        raise _read_failed(".docx", exc) from exc
    soup = BeautifulSoup(html, "lxml")
    return Converted(fragment_to_markdown(soup.body or soup), title=_core_title(archive))


def pptx_to_markdown(raw: bytes) -> Converted:
    """A presentation as markdown: one ``##`` section per slide, its text, tables and notes."""
    archive = _open_zip(raw, ".pptx", "ppt/presentation.xml")
    try:
        deck = Presentation(io.BytesIO(raw))
        slides = ["\n\n".join(_slide(slide, number)) for number, slide in enumerate(deck.slides, 1)]
    except (zipfile.BadZipFile, KeyError, ValueError, ElementTree.ParseError, EOFError) as exc:
        raise _read_failed(".pptx", exc) from exc
    return Converted("\n\n".join(s for s in slides if s), title=_core_title(archive))


def _slide(slide: Any, number: int) -> Iterator[str]:
    title_shape = slide.shapes.title
    title = " ".join(title_shape.text_frame.text.split()) if title_shape is not None else ""
    title_id = title_shape.shape_id if title_shape is not None else None
    yield f"## {title or f'Slide {number}'}"
    for shape in _shapes(slide.shapes):
        if shape.shape_id == title_id:
            continue
        if getattr(shape, "has_table", False):
            yield markdown_table([[cell.text for cell in row.cells] for row in shape.table.rows])
        elif getattr(shape, "has_text_frame", False) and shape.text_frame.text.strip():
            yield "\n".join(_paragraphs(shape.text_frame, bullets=_is_body(shape)))
    if slide.has_notes_slide and slide.notes_slide.notes_text_frame is not None:
        notes = slide.notes_slide.notes_text_frame.text.strip()
        if notes:
            yield f"Notes: {notes}"


def _shapes(shapes: Any) -> Iterator[Any]:
    """Shapes top to bottom, then left to right, with groups opened."""
    ordered = sorted(shapes, key=lambda s: (s.top or 0, s.left or 0))
    for shape in ordered:
        if shape.shape_type is not None and getattr(shape, "shapes", None) is not None:
            yield from _shapes(shape.shapes)
        else:
            yield shape


def _is_body(shape: Any) -> bool:
    """A placeholder for the slide's body text, whose paragraphs are bullet points."""
    return bool(getattr(shape, "is_placeholder", False))


def _paragraphs(frame: Any, *, bullets: bool) -> Iterator[str]:
    for paragraph in frame.paragraphs:
        text = " ".join("".join(run.text for run in paragraph.runs).split())
        if text:
            yield f"{'  ' * paragraph.level}- {text}" if bullets else text
