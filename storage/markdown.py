"""Markdown's marks that the text rules read: a table's delimiter row and the quotes of a label."""

from __future__ import annotations

import re

# A table's delimiter row (|---|:--:|): the row above it is the header, which names columns.
TABLE_DELIMITER_ROW = re.compile(r"\s*\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?\s*")
# Emphasis and quotes a label may be written in (**NRF**, `BR-3`, 「W」).
LABEL_QUOTES = "*`\"'“”‘’「」"


def unquoted(text: str) -> str:
    """A label without its emphasis or quotes (**NRF**, `BR-3`)."""
    return text.strip().strip(LABEL_QUOTES).strip()
