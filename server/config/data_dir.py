"""The data directory: checked before serving, created private (0700), and described when empty.

Everything the server keeps (the Milvus Lite file, the catalogs, the invocation log with its
queries and session memory) lives here, so the directory is created readable by its owner only.
A directory that cannot be used stops ``serve`` with one line naming the path and the cause,
instead of a traceback from whichever component first touched it.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import tempfile
from pathlib import Path

from storage.schema import SchemaVersionError, migrate

# Subdirectories the server creates on its own.
SUBDIRECTORIES = ("catalog",)
PRIVATE_DIR_MODE = 0o700


class DataDirError(ValueError):
    """The data directory cannot be used; the message names the path and the cause."""


def _ensure_dir(path: Path) -> None:
    if path.exists() and not path.is_dir():
        raise DataDirError(f"data directory {str(path)!r} is unusable: it exists and is not a directory")
    if not path.exists():
        try:
            path.mkdir(parents=True, mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            pass  # created meanwhile (another process)
        except OSError as exc:
            raise DataDirError(
                f"data directory {str(path)!r} is unusable: cannot create it: {exc.strerror or exc}"
            ) from exc
        else:
            # mkdir's mode is filtered by the umask; the directory must not be group/world readable.
            os.chmod(path, PRIVATE_DIR_MODE)
    try:
        # Probe with a real file: permission bits alone are wrong for root and read-only mounts.
        handle, probe = tempfile.mkstemp(prefix=".write-probe-", dir=path)
    except OSError as exc:
        raise DataDirError(
            f"data directory {str(path)!r} is unusable: cannot write in it: {exc.strerror or exc}"
        ) from exc
    os.close(handle)
    os.unlink(probe)


def prepare_data_dir(data_dir: Path) -> None:
    """Create the data directory (0700) and its subdirectories, and prove they are writable."""
    _ensure_dir(data_dir)
    for name in SUBDIRECTORIES:
        _ensure_dir(data_dir / name)


def check_invocation_log(path: Path) -> None:
    """Prove the invocation log can be opened: a regular file (or none yet) holding an SQLite database.

    Opening it is the first thing the server does after ``initialize``; a directory or a file
    that is not a database would otherwise fail there, as a traceback on stdio and as
    "Application startup failed" over HTTP. The pending migrations are applied here.
    """
    where = f"data directory {str(path.parent)!r} is unusable: its invocation log {path.name!r}"
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise DataDirError(f"{where} cannot be read: {exc.strerror or exc}") from exc
    if mode is not None and not stat.S_ISREG(mode):
        kind = (
            "a directory" if stat.S_ISDIR(mode) else "a symlink" if stat.S_ISLNK(mode) else "a special file"
        )
        raise DataDirError(f"{where} is {kind}, not a file; move it away and start again")
    try:
        migrate(path)
    except sqlite3.DatabaseError as exc:
        raise DataDirError(
            f"{where} is not a usable SQLite database ({exc}); move it away and start again"
        ) from exc
    except (SchemaVersionError, OSError) as exc:
        raise DataDirError(f"{where} cannot be opened: {exc}") from exc


def empty_knowledge_base_message(data_dir: Path | None) -> str:
    """What a lookup on an empty knowledge base says: where the data is, and how to fill it.

    ``None`` for MCP clients, which learn nothing about the server's filesystem: the path is
    in the server's start-up warning, and in the CLI's own messages.
    """
    if data_dir is None:
        return (
            "the knowledge base is empty: no document has been ingested into the server's data "
            "directory (its path is in the server's start-up log). Run `lookup-knowledge-mcp ingest "
            "<dir> --data-dir <that directory>` and call again; until then no lookup can find anything."
        )
    return (
        f"the knowledge base is empty: no document has been ingested into the data directory "
        f"{str(data_dir)!r}. Run `lookup-knowledge-mcp ingest <dir> --data-dir {data_dir}` "
        "and call again; until then no lookup can find anything."
    )
