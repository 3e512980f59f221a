"""Heading chunks of a markdown body: sections by heading path, long sections cut where they fit."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from storage.text import RULES_VERSION, text_language

HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


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
        match = None if in_fence else HEADING.match(line)
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
