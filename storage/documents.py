"""Read a knowledge base: discovery, conversion to markdown, YAML front matter, heading chunks, hashing."""

from __future__ import annotations

import functools
import hashlib
import os
import re
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from storage.convert import CONVERTED_SUFFIXES, CONVERTER_VERSION, ConversionError, Converted, convert_bytes
from storage.exports import (
    CONFLUENCE_SKIPPED_DIRS,
    has_notion_id,
    is_confluence_export,
    notion_links_as_text,
    without_notion_id,
)
from storage.text import RULES_VERSION, document_codes, text_language

TEXT_SUFFIXES = (".md", ".markdown", ".txt")
SUFFIXES = TEXT_SUFFIXES + CONVERTED_SUFFIXES
# Converts one file's bytes (suffix given) to markdown: in this process, or in a bounded worker.
Convert = Callable[[bytes, str], Converted]
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


TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class ChunkingRule:
    """How large a chunk may be: characters, and model tokens when the embedder can count them."""

    max_chars: int
    max_tokens: int | None = None
    count_tokens: TokenCounter | None = None

    def fits(self, context: str, text: str) -> bool:
        if len(text) > self.max_chars:
            return False
        if self.max_tokens is None or self.count_tokens is None:
            return True
        return self.count_tokens(f"{context}\n{text}") <= self.max_tokens

    @property
    def signature(self) -> str:
        """Part of the content hash: a new chunk size re-ingests."""
        tokens = f",tokens={self.max_tokens}" if self.count_tokens else ""
        return f"chunk={self.max_chars}{tokens},text-rules={RULES_VERSION}"


@dataclass(frozen=True)
class Chunk:
    index: int
    heading: str  # the heading path of the chunk's first section, "" before any heading
    text: str

    @property
    def language(self) -> str:
        return text_language(self.text)


def chunk_context(title: str, heading: str) -> str:
    """The line that gives a chunk its context when embedded and when shown: ``Title › Heading``."""
    return f"{title} › {heading}" if heading and heading != title else title


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
    # Code-shaped identifiers named anywhere in the document, short ones where it defines them.
    identifiers: tuple[str, ...] = ()

    def embedding_texts(self) -> list[str]:
        """What each chunk is embedded as: the title and heading path give a section its context."""
        return [f"{chunk_context(self.title, chunk.heading)}\n{chunk.text}" for chunk in self.chunks]


@dataclass(frozen=True)
class Candidate:
    """A file found under the root, or a path refused during discovery."""

    doc_key: str
    path: Path
    refusal: str | None = None


def discover(root: Path) -> Iterator[Candidate]:
    """Yield knowledge files under root, refusing links that loop or escape it and special files."""
    real_root = root.resolve()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        base = Path(dirpath)
        confluence = is_confluence_export(base)
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and not (confluence and d in CONFLUENCE_SKIPPED_DIRS)
        )
        for name in list(dirnames):
            link = base / name
            if link.is_symlink() and (refusal := _link_refusal(link, real_root)):
                yield Candidate(_key(link, root), link, refusal)
        for name in sorted(filenames):
            path = base / name
            if name.startswith(".") or path.suffix.lower() not in SUFFIXES:
                continue
            if confluence and name == "index.html":  # the export's list of pages, not a page
                continue
            yield Candidate(_key(path, root), path, _link_refusal(path, real_root) or _special(path))


def _link_refusal(path: Path, real_root: Path) -> str | None:
    """Why path cannot be read as a file of this knowledge base, when a link stands in the way."""
    try:
        real = path.resolve(strict=True)
    except FileNotFoundError:
        return "broken symlink (its target does not exist)"
    except (RuntimeError, OSError):  # Python 3.11 raises RuntimeError for a loop, later ones OSError
        return "symlink loop (the link leads back to itself)"
    return None if _inside(real, real_root) else "symlink escapes the knowledge base root"


def _special(path: Path) -> str | None:
    """Only regular files are read: a FIFO would block the ingest forever, a device could be endless."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    return None if stat.S_ISREG(mode) else f"not a regular file (a {_file_kind(mode)})"


def _file_kind(mode: int) -> str:
    kinds = {stat.S_ISFIFO: "FIFO", stat.S_ISSOCK: "socket", stat.S_ISCHR: "character device"}
    kinds |= {stat.S_ISBLK: "block device", stat.S_ISDIR: "directory"}
    return next((name for test, name in kinds.items() if test(mode)), "special file")


def read_source(candidate: Candidate) -> bytes:
    """The bytes of a candidate: a regular file, opened without following a final link and without blocking.

    Discovery resolved the links already; a file swapped for a link or a FIFO since then fails
    here (ELOOP, or the fstat check) instead of being followed or blocking the ingest.
    """
    key = candidate.doc_key
    if candidate.refusal:
        raise DocumentError(key, candidate.refusal)
    try:
        fd = os.open(candidate.path.resolve(strict=True), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as file:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise DocumentError(key, f"not a regular file (a {_file_kind(mode)})")
            return file.read()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a link loop made since discovery
        raise DocumentError(key, f"unreadable: {getattr(exc, 'strerror', None) or exc}") from exc


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _key(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


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
        match = _HEADING.match(line)
        if match:
            return match.group(2).strip()
    return ""


def _folder_domain(key: str) -> str:
    """The top folder; a top-level Notion page shares the domain of its sub-pages' folder."""
    parts = key.split("/")
    if len(parts) > 1:
        return without_notion_id(parts[0])
    return without_notion_id(Path(key).stem) if has_notion_id(key) else DEFAULT_DOMAIN


def _sections(body: str) -> Iterator[tuple[str, str]]:
    """Split at headings (not inside code fences), yielding (heading path, text-with-heading).

    The path names the enclosing headings, ``Deploying › Rollback``, so a chunk deep in a long
    document still says where it belongs. The document's own H1 title is left out of the path.
    """
    stack: list[tuple[int, str]] = []
    in_fence = False
    lines: list[str] = []
    for line in body.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        match = None if in_fence else _HEADING.match(line)
        if match and any(s.strip() for s in lines):
            yield _path(stack), "\n".join(lines).strip()
            lines = []
        if match:
            level = len(match.group(1))
            stack = [(lvl, text) for lvl, text in stack if lvl < level]
            stack.append((level, match.group(2).strip()))
        lines.append(line)
    if any(s.strip() for s in lines):
        yield _path(stack), "\n".join(lines).strip()


def _path(stack: list[tuple[int, str]]) -> str:
    named = [text for level, text in stack if level > 1] or [text for _, text in stack]
    return " › ".join(named)


def _split_long(text: str, fits: Callable[[str], bool]) -> Iterator[str]:
    """Break an oversized section at paragraph, then line, then sentence or hard boundaries."""
    if fits(text):
        yield text
        return
    piece = ""
    for para in re.split(r"\n\s*\n", text):
        candidate = f"{piece}\n\n{para}" if piece else para
        if fits(candidate):
            piece = candidate
            continue
        if piece:
            yield piece
        while not fits(para):
            cut = _cut_point(para, fits)
            yield para[:cut].rstrip()
            para = para[cut:].lstrip()
        piece = para
    if piece:
        yield piece


def _cut_point(text: str, fits: Callable[[str], bool]) -> int:
    """The longest prefix that fits, ending at a line or sentence break when there is one."""
    low, high = 1, len(text)
    while low < high:  # binary search on the prefix length
        middle = (low + high + 1) // 2
        if fits(text[:middle]):
            low = middle
        else:
            high = middle - 1
    for breaks in ("\n", "。！？.!?；;"):
        cut = max(text.rfind(b, 0, low) for b in breaks)
        if cut > low // 2:
            return cut + 1
    return max(low, 1)


def chunk_markdown(body: str, *, title: str, rule: ChunkingRule) -> Iterator[Chunk]:
    """Chunks that follow headings: small sections merge, large ones split, none exceeds the rule."""
    index = 0
    pending_heading, pending = "", ""
    for heading, text in _sections(body):
        for part in _split_long(text, functools.partial(rule.fits, chunk_context(title, heading))):
            merged = f"{pending}\n\n{part}" if pending else part
            if pending and rule.fits(chunk_context(title, pending_heading), merged):
                pending = merged
                continue
            if pending:
                yield Chunk(index, pending_heading, pending)
                index += 1
            pending_heading, pending = heading, part
    if pending:
        yield Chunk(index, pending_heading, pending)
