"""The values conversion passes around (kept apart so the worker child imports no converter twice)."""

from __future__ import annotations

from dataclasses import dataclass

# Part of every converted document's content hash: a change of the conversion re-ingests them.
CONVERTER_VERSION = "1"


class ConversionError(ValueError):
    """A file that cannot be converted; the message is the reason, shown after the file's path."""


@dataclass(frozen=True)
class Converted:
    markdown: str
    title: str = ""  # from the file's metadata or the export's page title; "" when it has none
    domain: str = ""  # from the export layout (a Confluence page's space); "" to use the folder
