"""HTML (and the HTML mammoth makes of a .docx) to markdown: BeautifulSoup cleans, markdownify writes.

What is dropped: scripts, styles, forms and embedded frames everywhere; navigation, sidebars and
the page's own header and footer (the chrome around the content). When the page has a ``main``,
an ``article`` or a Confluence ``#main-content``, only that is converted.
"""

from __future__ import annotations

import html
import re
from typing import Any

from bs4 import BeautifulSoup, Tag
from markdownify import MarkdownConverter

from storage.convert._types import Converted

# Never content, wherever they are.
_NEVER = "script, style, noscript, template, iframe, object, embed, svg, canvas, form, button, input, select"
_NEVER += ", nav, aside, link, meta"
_CHROME_ROLES = "[role=navigation], [role=banner], [role=contentinfo], [role=search], [aria-hidden=true]"
# The page's own header and footer: chrome only when they sit outside the content root.
_PAGE_CHROME = "header, footer"
# A Confluence space export page: breadcrumbs, title, metadata, and the attachments box below.
_CONFLUENCE_CHROME = "#breadcrumb-section, #main-header, .page-metadata, .pageSection, #footer"
_CONTENT_ROOTS = ("#main-content", "main", "article", "[role=main]", "body")
_BLANK_LINES = re.compile(r"\n{3,}")
_BRUSH = re.compile(r"brush:\s*([\w+#-]+)")


def _code_language(pre: Tag) -> str:
    """A fenced block's language from ``class="language-x"`` or Confluence's ``brush: x``."""
    code = pre.find("code")
    for element in (pre, code):
        if not isinstance(element, Tag):
            continue
        classes: Any = element.get("class") or []
        names: list[str] = [str(c) for c in classes] if isinstance(classes, list) else [str(classes)]
        for name in names:
            if name.startswith(("language-", "lang-")):
                return str(name.split("-", 1)[1])
        brush = _BRUSH.search(str(element.get("data-syntaxhighlighter-params") or ""))
        if brush:
            return brush.group(1)
    return ""


def _converter() -> MarkdownConverter:
    # Codes such as ERR_TIMEOUT or a*b must stay as they are for exact (L0) lookups: no escapes.
    options: dict[str, Any] = {
        "heading_style": "ATX",
        "bullets": "-",
        "escape_underscores": False,
        "escape_asterisks": False,
        "escape_misc": False,
        "table_infer_header": True,
        "code_language_callback": _code_language,
        "strip": ["img"],
    }
    return MarkdownConverter(**options)


def fragment_to_markdown(root: Tag) -> str:
    """Markdown of an already cleaned element."""
    text = _converter().convert_soup(root)
    return _BLANK_LINES.sub("\n\n", text).strip()


def _drop(root: Tag, selector: str) -> None:
    for element in root.select(selector):
        element.decompose()


def _text(element: Tag | None) -> str:
    return " ".join(element.get_text(" ").split()) if element is not None else ""


def _confluence_title_and_space(soup: BeautifulSoup) -> tuple[str, str]:
    """A Confluence page's title ``Space : Page`` and its space, from the breadcrumb or the title."""
    title = _text(soup.select_one("#title-text"))
    space = _text(soup.select_one("#breadcrumbs li a"))
    if " : " in title:
        prefix, title = title.split(" : ", 1)
        space = space or prefix.strip()
    return title.strip(), space


def html_to_markdown(raw: bytes) -> Converted:
    """The content of an HTML page as markdown, with its title and, for Confluence, its space."""
    soup = BeautifulSoup(raw, "lxml")
    title, space = _confluence_title_and_space(soup)
    if not title:
        title = _text(soup.title) if soup.title else ""
    root = next((found for sel in _CONTENT_ROOTS if (found := soup.select_one(sel)) is not None), soup)
    _drop(root, _NEVER)
    _drop(root, _CHROME_ROLES)
    _drop(root, _CONFLUENCE_CHROME)
    if root.name == "body" or root is soup:
        _drop(root, _PAGE_CHROME)
    return Converted(fragment_to_markdown(root), title=title, domain=space)


def markdown_table(rows: list[list[str]]) -> str:
    """Rows of cell texts (a PDF's or a slide's table) as a markdown table, the first row its header."""
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return fragment_to_markdown(BeautifulSoup(f"<table>{cells}</table>", "lxml"))
