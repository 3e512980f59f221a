"""The layouts of exported wikis: a Confluence HTML space export and a Notion markdown export.

Confluence (Space tools → Export → HTML) writes one folder per space: ``index.html`` (the list
of pages, not a page), one ``<Title>_<id>.html`` per page, and ``attachments/``, ``images/`` and
``styles/`` beside them. A page's breadcrumb names its space, which becomes its domain
(storage.convert._html reads it). Attachments, images and styles are skipped, and so is index.html.

Notion (Export → Markdown & CSV) writes ``<Title> <32 hex id>.md`` per page and a folder of the
same name for its sub-pages; a database is a ``.csv`` table plus one page per row in its
folder. The id is stripped from titles and domains (the doc_key keeps the path as it is), links
between pages keep their text and drop the target, and the database CSVs are skipped: every row
is a page of its own already.
"""

from __future__ import annotations

import re
from pathlib import Path

# Folders of a Confluence export that hold no pages.
CONFLUENCE_SKIPPED_DIRS = frozenset({"attachments", "images", "styles"})
_NOTION_ID = re.compile(r"\s+[0-9a-f]{32}$")
# A markdown link whose target carries a Notion id: [text](Some%20Page%20<id>.md)
_NOTION_LINK = re.compile(r"(?<!!)\[([^\]\n]+)\]\((?:[^()\s]|%20)*?[0-9a-f]{32}[^()\s]*\)")


def is_confluence_export(directory: Path) -> bool:
    """A folder laid out as a Confluence HTML space export."""
    return (directory / "index.html").is_file() and (
        (directory / "attachments").is_dir() or (directory / "styles" / "site.css").is_file()
    )


def without_notion_id(name: str) -> str:
    """``Onboarding 1a2b…c3d4`` -> ``Onboarding``; any other name as it is."""
    return _NOTION_ID.sub("", name)


def has_notion_id(doc_key: str) -> bool:
    return any(_NOTION_ID.search(Path(part).stem if "." in part else part) for part in doc_key.split("/"))


def notion_links_as_text(body: str) -> str:
    """Links to other pages of the export keep their text; their targets name files, not knowledge."""
    return _NOTION_LINK.sub(r"\1", body)
