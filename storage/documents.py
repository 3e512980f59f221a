"""Read a markdown knowledge base: discovery, YAML front matter, heading-based chunking, hashing."""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SUFFIXES = (".md", ".markdown", ".txt")
DEFAULT_DOMAIN = "general"
_FRONT_MATTER = re.compile(r"\A---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)", re.DOTALL)
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_DOMAIN_ID = re.compile(r"^[\w][\w.\- ]{0,127}$")


class DocumentError(ValueError):
    """A file that cannot be ingested; ``reason`` says why."""

    def __init__(self, doc_key: str, reason: str) -> None:
        super().__init__(f"{doc_key}: {reason}")
        self.doc_key = doc_key
        self.reason = reason


@dataclass(frozen=True)
class Chunk:
    index: int
    heading: str
    text: str

    @property
    def language(self) -> str:
        return text_language(self.text)


_CJK_CHAR = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_LATIN_WORD = re.compile(r"[A-Za-z]{2,}")
# A Chinese word is about 1.7 characters; Chinese prose full of English identifiers stays "zh".
_CJK_CHARS_PER_WORD = 1.7


def text_language(text: str) -> str:
    """zh or en when one language clearly dominates the text, mixed otherwise."""
    zh_words = len(_CJK_CHAR.findall(text)) / _CJK_CHARS_PER_WORD
    en_words = len(_LATIN_WORD.findall(text))
    share = zh_words / (zh_words + en_words) if zh_words + en_words else 0.0
    if share >= 0.7:
        return "zh"
    return "en" if share <= 0.1 else "mixed"


@dataclass(frozen=True)
class Document:
    doc_key: str
    title: str
    domain: str
    keywords: tuple[str, ...]
    summary: str
    domain_description: str
    when_to_retrieve: str
    body: str
    content_hash: str
    chunks: tuple[Chunk, ...]

    def embedding_texts(self) -> list[str]:
        """What each chunk is embedded as: the title gives a section its context."""
        return [
            f"{self.title}\n{chunk.text}" if chunk.heading != self.title else chunk.text
            for chunk in self.chunks
        ]


@dataclass(frozen=True)
class Candidate:
    """A file found under the root, or a path refused during discovery."""

    doc_key: str
    path: Path
    refusal: str | None = None


def discover(root: Path) -> Iterator[Candidate]:
    """Yield knowledge files under root, refusing anything that resolves outside it."""
    real_root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in list(dirnames):
            link = base / name
            if link.is_symlink() and not _inside(link.resolve(), real_root):
                yield Candidate(_key(link, root), link, "symlink escapes the knowledge base root")
        for name in sorted(filenames):
            path = base / name
            if name.startswith(".") or path.suffix.lower() not in SUFFIXES:
                continue
            if not _inside(path.resolve(), real_root):
                yield Candidate(_key(path, root), path, "symlink escapes the knowledge base root")
                continue
            yield Candidate(_key(path, root), path)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _key(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def content_hash(raw: bytes, *, max_chars: int) -> str:
    """Hash of the bytes and the chunking that produced the chunks, so a new chunk size re-ingests."""
    digest = hashlib.sha256(raw)
    digest.update(f"|chunk={max_chars}".encode())
    return digest.hexdigest()[:32]


def load_document(candidate: Candidate, *, max_chars: int) -> Document:
    """Read, validate and chunk one file, raising DocumentError naming the problem."""
    key = candidate.doc_key
    if candidate.refusal:
        raise DocumentError(key, candidate.refusal)
    try:
        raw = candidate.path.read_bytes()
    except OSError as exc:
        raise DocumentError(key, f"unreadable: {exc.strerror or exc}") from exc
    if b"\x00" in raw[:8192]:
        raise DocumentError(key, "binary file (contains NUL bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DocumentError(key, f"not valid UTF-8 (byte {exc.start})") from exc
    meta, body = _split_front_matter(key, text)
    body = body.strip()
    title = _text_field(key, meta, "title") or _first_heading(body) or Path(key).stem
    domain = _text_field(key, meta, "domain") or _text_field(key, meta, "category") or _folder_domain(key)
    if not _DOMAIN_ID.match(domain):
        raise DocumentError(key, f"invalid domain {domain!r}: use letters, digits, '-', '_', '.' or spaces")
    chunks = tuple(chunk_markdown(body, title=title, max_chars=max_chars))
    if not chunks:
        raise DocumentError(key, "empty document")
    keywords = _keywords(key, meta.get("keywords"))
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
        content_hash=content_hash(raw, max_chars=max_chars),
        chunks=chunks,
    )


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
        match = _HEADING.match(line)
        if match:
            return match.group(2).strip()
    return ""


def _folder_domain(key: str) -> str:
    parts = key.split("/")
    return parts[0] if len(parts) > 1 else DEFAULT_DOMAIN


def _sections(body: str) -> Iterator[tuple[str, str]]:
    """Split at headings (not inside code fences), yielding (heading, text-with-heading)."""
    heading, in_fence = "", False
    lines: list[str] = []
    for line in body.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else _HEADING.match(line)
        if match and any(s.strip() for s in lines):
            yield heading, "\n".join(lines).strip()
            lines = []
        if match:
            heading = match.group(2).strip()
        lines.append(line)
    if any(s.strip() for s in lines):
        yield heading, "\n".join(lines).strip()


def _split_long(text: str, max_chars: int) -> Iterator[str]:
    """Break an oversized section at paragraph, then line, then hard boundaries."""
    if len(text) <= max_chars:
        yield text
        return
    piece = ""
    for para in re.split(r"\n\s*\n", text):
        candidate = f"{piece}\n\n{para}" if piece else para
        if len(candidate) <= max_chars:
            piece = candidate
            continue
        if piece:
            yield piece
        while len(para) > max_chars:
            cut = para.rfind("\n", 0, max_chars)
            cut = cut if cut > max_chars // 2 else max_chars
            yield para[:cut].rstrip()
            para = para[cut:].lstrip()
        piece = para
    if piece:
        yield piece


def chunk_markdown(body: str, *, title: str, max_chars: int) -> Iterator[Chunk]:
    """Chunks that follow headings: small sections merge, large ones split, none exceeds max_chars."""
    index = 0
    pending_heading, pending = "", ""
    for heading, text in _sections(body):
        for part in _split_long(text, max_chars):
            merged = f"{pending}\n\n{part}" if pending else part
            if len(merged) <= max_chars:
                pending_heading = pending_heading or heading or title
                pending = merged
                continue
            if pending:
                yield Chunk(index, pending_heading, pending)
                index += 1
            pending_heading, pending = heading or title, part
    if pending:
        yield Chunk(index, pending_heading, pending)
