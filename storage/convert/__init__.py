"""Turn HTML, PDF, Word and PowerPoint files into the markdown the loader chunks.

Each format goes through the well-kept library for it: BeautifulSoup (lxml) and markdownify for
HTML, mammoth for .docx (to HTML, then the same path), pdfplumber (on pdfminer.six) for PDF,
python-pptx for .pptx. The result keeps what retrieval needs: headings as markdown headings,
tables as markdown tables, lists and code blocks. docs/formats.md says why these and not
markitdown, which wraps the same libraries.

``convert_bytes`` runs in the calling process; ``storage.convert.worker`` runs it in a child
process bounded in time and memory, which is what an ingest uses.
"""

from __future__ import annotations

from storage.convert._types import CONVERTER_VERSION, ConversionError, Converted

CONVERTED_SUFFIXES = (".html", ".htm", ".pdf", ".docx", ".pptx")

__all__ = ["CONVERTED_SUFFIXES", "CONVERTER_VERSION", "ConversionError", "Converted", "convert_bytes"]


def convert_bytes(raw: bytes, suffix: str) -> Converted:
    """The markdown, title and layout domain of one file's bytes; ConversionError naming the problem."""
    # Imported here: a knowledge base of markdown alone never loads the converters.
    if suffix in (".html", ".htm"):
        from storage.convert._html import html_to_markdown

        return html_to_markdown(raw)
    if suffix == ".pdf":
        from storage.convert._pdf import pdf_to_markdown

        return pdf_to_markdown(raw)
    if suffix == ".docx":
        from storage.convert._office import docx_to_markdown

        return docx_to_markdown(raw)
    if suffix == ".pptx":
        from storage.convert._office import pptx_to_markdown

        return pptx_to_markdown(raw)
    raise ConversionError(f"no converter for {suffix!r} files")
