"""Read a knowledge base: conversion to markdown, YAML front matter, heading chunks, hashing.

Finding and reading the files is storage.discovery; cutting a body into chunks storage.chunking.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from storage.chunking import HEADING, Chunk, ChunkingRule, chunk_context, chunk_markdown
from storage.convert import CONVERTED_SUFFIXES, CONVERTER_VERSION, ConversionError, Converted, convert_bytes
from storage.discovery import Candidate, DocumentError, read_source
from storage.exports import has_notion_id, notion_links_as_text, without_notion_id
from storage.text import document_codes

# Converts one file's bytes (suffix given) to markdown: in this process, or in a bounded worker.
Convert = Callable[[bytes, str], Converted]
DEFAULT_DOMAIN = "general"
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)
_DOMAIN_ID = re.compile(r"^[\w][\w.\- ]{0,127}$")


@dataclass(frozen=True, kw_only=True)
class DocumentFields:
    """What a document says of itself, as it is read (``Document``) and as the catalog keeps it (``CatalogEntry``)."""

    doc_key: str
    content_hash: str
    title: str
    domain: str
    keywords: tuple[str, ...]
    summary: str
    domain_description: str
    when_to_retrieve: str
    body: str
    # Code-shaped identifiers named anywhere in the document, short ones where it defines them.
    identifiers: tuple[str, ...] = ()

    def fields(self) -> dict[str, Any]:
        """These fields by name, to build the other kind of record from this one."""
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(DocumentFields)}


@dataclass(frozen=True, kw_only=True)
class Document(DocumentFields):
    """A file read, converted and cut into chunks, ready to embed."""

    chunks: tuple[Chunk, ...]

    def embedding_texts(self) -> list[str]:
        """What each chunk is embedded as: the title and heading path give a section its context."""
        return [f"{chunk_context(self.title, chunk.heading)}\n{chunk.text}" for chunk in self.chunks]


def content_hash(raw: bytes, *, rule: ChunkingRule, doc_key: str = "") -> str:
    """Hash of the bytes and of how they became chunks, so a new chunk size or converter re-ingests."""
    digest = hashlib.sha256(raw)
    digest.update(f"|{rule.signature}".encode())
    if _converted(doc_key):
        digest.update(f"|convert={CONVERTER_VERSION}".encode())
    return digest.hexdigest()[:32]


def _converted(doc_key: str) -> bool:
    return Path(doc_key).suffix.lower() in CONVERTED_SUFFIXES


def load_document(
    candidate: Candidate, *, rule: ChunkingRule, raw: bytes | None = None, convert: Convert | None = None
) -> Document:
    """Read (unless raw is given), convert, validate and chunk one file, raising DocumentError naming the problem.

    HTML, PDF, Word and PowerPoint files are converted to markdown by ``convert`` (by default in
    this process; an ingest passes a bounded worker's); the markdown is what is chunked and stored.
    """
    key = candidate.doc_key
    raw = read_source(candidate) if raw is None else raw
    meta, body, found = _markdown(key, raw, convert or convert_bytes)
    body = body.strip()
    if has_notion_id(key):
        body = notion_links_as_text(body)
    stem = without_notion_id(Path(key).stem)
    title = _text_field(key, meta, "title") or found.title or _first_heading(body) or stem
    domain = _text_field(key, meta, "domain") or _text_field(key, meta, "category")
    domain = domain or _layout_domain(found.domain) or _folder_domain(key)
    if not _DOMAIN_ID.match(domain):
        raise DocumentError(key, f"invalid domain {domain!r}: use letters, digits, '-', '_', '.' or spaces")
    chunks = tuple(chunk_markdown(body, title=title, rule=rule))
    if not chunks:
        raise DocumentError(key, "empty document")
    keywords = _keywords(key, meta.get("keywords"))
    codes = document_codes(title, keywords, body)
    summary = _text_field(key, meta, "summary")
    return Document(
        doc_key=key,
        title=title,
        domain=domain,
        keywords=keywords,
        summary=summary,
        domain_description=_text_field(key, meta, "domain_description"),
        when_to_retrieve=_text_field(key, meta, "when_to_retrieve"),
        body=body,
        content_hash=content_hash(raw, rule=rule, doc_key=key),
        chunks=chunks,
        identifiers=tuple(codes),
    )


def _markdown(key: str, raw: bytes, convert: Convert) -> tuple[dict[str, Any], str, Converted]:
    """Front matter and markdown body of a file; what a converter found (title, domain) for the others."""
    suffix = Path(key).suffix.lower()
    if suffix in CONVERTED_SUFFIXES:
        try:
            converted = convert(raw, suffix)
        except ConversionError as exc:
            raise DocumentError(key, str(exc)) from exc
        return {}, converted.markdown, converted
    if b"\x00" in raw[:8192]:
        raise DocumentError(key, "binary file (contains NUL bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(key, f"not valid UTF-8 (byte {exc.start})") from exc
    meta, body = _split_front_matter(key, text)
    return meta, body, Converted(body)


def _layout_domain(name: str) -> str:
    """A domain named by an export (a Confluence space), reduced to the characters a domain may use."""
    return " ".join(re.sub(r"[^\w.\- ]+", " ", name).split())[:128].strip(" .-")


def _split_front_matter(key: str, text: str) -> tuple[dict[str, Any], str]:
    match = _FRONT_MATTER.match(text)
    if not match:
        return {}, text
    try:
        meta = yaml.safe_load(match.group(1))
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        raise DocumentError(key, f"broken YAML front matter{where}: {problem}") from exc
    if meta is None:
        meta = {}
    if not isinstance(meta, dict):
        raise DocumentError(key, f"front matter must be a mapping, not {type(meta).__name__}")
    return meta, text[match.end() :]


def _text_field(key: str, meta: dict[str, Any], name: str) -> str:
    value = meta.get(name)
    if value is None:
        return ""
    if isinstance(value, str | int | float):
        return str(value).strip()
    raise DocumentError(key, f"front matter field {name!r} must be text, not {type(value).__name__}")


def _keywords(key: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [part for part in re.split(r"[,，]", value)]
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise DocumentError(key, "front matter field 'keywords' must be a list of strings")
    seen: dict[str, None] = {}
    for item in value:
        word = str(item).strip()
        if word:
            seen.setdefault(word, None)
    return tuple(seen)


def _first_heading(body: str) -> str:
    for line in body.splitlines():
        match = HEADING.match(line)
        if match:
            return match.group(2).strip()
    return ""


def _folder_domain(key: str) -> str:
    """The top folder; a top-level Notion page shares the domain of its sub-pages' folder."""
    parts = key.split("/")
    if len(parts) > 1:
        return without_notion_id(parts[0])
    return without_notion_id(Path(key).stem) if has_notion_id(key) else DEFAULT_DOMAIN
