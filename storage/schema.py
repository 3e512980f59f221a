"""Versioned migrations of the invocation log: ``storage/migrations/V001__name.sql``, ...

Applied at start-up, in order, each in its own transaction together with its row in
``schema_version``, so re-running is a no-op and a crash mid-migration leaves the previous
version intact. A database newer than the code is refused rather than written to.
"""

from __future__ import annotations

import re
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_NAME = re.compile(r"^V(\d{3})__([a-z0-9_]+)\.sql$")


class SchemaVersionError(RuntimeError):
    """The log database is at a schema version this code cannot use."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def known_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files, checked to be numbered 1, 2, 3, ... without gaps."""
    migrations = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if match is None:
            raise SchemaVersionError(f"migration file {path.name!r} is not named V<nnn>__<name>.sql")
        migrations.append(Migration(int(match.group(1)), match.group(2), path.read_text(encoding="utf-8")))
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise SchemaVersionError(
                f"migration V{migration.version:03d}__{migration.name} is out of sequence; expected V{expected:03d}"
            )
    return migrations


def latest_version() -> int:
    return len(known_migrations())


def _statements(sql: str) -> list[str]:
    """Split a script into statements (sqlite3's executescript would commit our transaction)."""
    statements, buffer = [], ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    leftover = [line for line in buffer.splitlines() if line.strip() and not line.strip().startswith("--")]
    if leftover:
        raise SchemaVersionError(f"migration ends with an incomplete statement: {buffer.strip()[:60]!r}")
    return statements


def current_version(conn: sqlite3.Connection) -> int:
    """The highest applied version, 0 for an empty database."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if not exists:
        return 0
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return int(row[0] or 0)


def _too_new(path: Path, version: int, latest: int) -> SchemaVersionError:
    return SchemaVersionError(
        f"log database {str(path)!r} is at schema version {version}, newer than this code knows "
        f"(latest {latest}); upgrade lookup-knowledge-mcp or use another data directory"
    )


def migrate(path: Path, *, target: int | None = None, busy_timeout_s: float = 5.0) -> int:
    """Bring the database at ``path`` to ``target`` (default: the latest); returns the version reached."""
    migrations = known_migrations()
    latest = len(migrations)
    target = latest if target is None else target
    if not 0 <= target <= latest:
        raise SchemaVersionError(f"target schema version {target} is unknown; this code knows 0..{latest}")
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, isolation_level=None, timeout=busy_timeout_s)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        for migration in migrations[:target]:
            # IMMEDIATE takes the write lock first, so two processes starting together apply
            # each migration once: the second sees the version row and skips it.
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = current_version(conn)
                if version > latest:
                    raise _too_new(path, version, latest)
                if version < migration.version:
                    for statement in _statements(migration.sql):
                        conn.execute(statement)
                    conn.execute(
                        "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)",
                        (migration.version, migration.name, time.time()),
                    )
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        version = current_version(conn)
        if version > latest:
            raise _too_new(path, version, latest)
        return version
    finally:
        conn.close()
