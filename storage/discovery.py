"""Finding a knowledge base's files and reading their bytes, refusing links and special files."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from storage.convert import CONVERTED_SUFFIXES
from storage.exports import CONFLUENCE_SKIPPED_DIRS, is_confluence_export

TEXT_SUFFIXES = (".md", ".markdown", ".txt")
SUFFIXES = TEXT_SUFFIXES + CONVERTED_SUFFIXES


class DocumentError(ValueError):
    """A file that cannot be ingested; ``reason`` says why."""

    def __init__(self, doc_key: str, reason: str) -> None:
        super().__init__(f"{doc_key}: {reason}")
        self.doc_key = doc_key
        self.reason = reason


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
