"""A call's row and its session's memory state written by one statement: one round trip per call.

Through aiosqlite each statement and the commit is a round trip to the connection's thread; a
lookup's write (its row, its session's state, the commit) took three, each woken behind
whatever else the event loop and the machine were doing. The log's connection runs in
autocommit (``isolation_level=None``), where a single statement is its own transaction:
SQLite commits it when it ends, and a statement that fails leaves nothing behind, its
trigger's writes included. ``STATEMENT`` inserts into a view of this connection
(``call_write``) whose INSTEAD OF trigger writes the row and upserts the state, so the row and
its state stay one transaction and cost one round trip. Both are TEMP objects, created on
each connection (``SCRIPT``): nothing in the file's schema changes.

It applies to the common case only, at most one state to upsert and no gap (``parameters``);
other writes run the statements one by one between an explicit BEGIN and COMMIT.
"""

from __future__ import annotations

from typing import Any

from storage.invocation_record import COLUMNS
from storage.session_memory_store import ON_CONFLICT, Pending

__all__ = ["SCRIPT", "STATEMENT", "parameters"]

_MEMORY = ("memory_key", "memory_state", "memory_seen")

SCRIPT = f"""
CREATE TEMP VIEW call_write AS SELECT {", ".join(f"NULL AS {name}" for name in (*COLUMNS, *_MEMORY))};
CREATE TEMP TRIGGER call_write_insert INSTEAD OF INSERT ON call_write BEGIN
    INSERT INTO tool_invocation ({", ".join(COLUMNS)}) VALUES ({", ".join(f"NEW.{name}" for name in COLUMNS)});
    INSERT INTO session_memory (session_key, state, last_seen)
        SELECT NEW.memory_key, NEW.memory_state, NEW.memory_seen WHERE NEW.memory_key IS NOT NULL
        {ON_CONFLICT};
END;
"""

STATEMENT = f"INSERT INTO call_write VALUES ({', '.join('?' * (len(COLUMNS) + len(_MEMORY)))})"


def parameters(row: tuple[Any, ...], memory: Pending) -> tuple[Any, ...] | None:
    """``STATEMENT``'s values for a row and the queued states; None if they need more than one statement."""
    if not memory:
        return (*row, None, None, None)
    if len(memory) > 1:
        return None
    ((key, (state, seen)),) = memory.items()
    # A forgotten session (None) is a delete, which the trigger does not do.
    return None if state is None else (*row, key, state, seen)
