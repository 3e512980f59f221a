"""The persisted action memory of each session, in the invocation log's file (``session_memory``).

The tracker queues every change synchronously (``SessionMemoryStore.queue``); the latest state
per session rides in the transaction of the log's next row (``write``), so persistence adds no
commit of its own. At start-up ``load`` returns the sessions seen within the TTL and deletes the
others. Storage keeps each state as opaque JSON: the retrieval core owns its shape.
"""

from __future__ import annotations

from collections.abc import Callable

import aiosqlite

# A state replaces the session's previous one; also the end of call_write's upsert.
ON_CONFLICT = "ON CONFLICT (session_key) DO UPDATE SET state = excluded.state, last_seen = excluded.last_seen"
UPSERT = f"INSERT INTO session_memory (session_key, state, last_seen) VALUES (?, ?, ?) {ON_CONFLICT}"

# Queued action memory: session key -> (state, or None to forget it; when it was queued).
Pending = dict[str, tuple[str | None, float]]


class SessionMemoryStore:
    """The states queued since the last transaction that wrote them."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._pending: Pending = {}

    def queue(self, session_key: str, state: str | None) -> None:
        """Remember a session's latest state (None: forget it), for the next transaction."""
        self._pending[session_key] = (state, self._clock())

    def take(self) -> Pending:
        """The queued states, which the caller writes; the queue starts empty again."""
        pending, self._pending = self._pending, {}
        return pending

    def put_back(self, pending: Pending) -> None:
        """Queue again the states of a transaction that failed, unless newer ones were queued since."""
        self._pending = {**pending, **self._pending}


async def write(db: aiosqlite.Connection, pending: Pending) -> None:
    """Upsert or delete each queued state, inside the caller's transaction."""
    upserts = [(key, state, seen) for key, (state, seen) in pending.items() if state is not None]
    deletes = [(key,) for key, (state, _) in pending.items() if state is None]
    if upserts:
        await db.executemany(UPSERT, upserts)
    if deletes:
        await db.executemany("DELETE FROM session_memory WHERE session_key = ?", deletes)


async def load(db: aiosqlite.Connection, cutoff: float) -> list[tuple[str, str, float]]:
    """(session_key, state, last_seen) of the sessions seen since ``cutoff``; older rows are deleted."""
    rows = await db.execute_fetchall(
        "SELECT session_key, state, last_seen FROM session_memory WHERE last_seen >= ?", (cutoff,)
    )
    await db.execute("DELETE FROM session_memory WHERE last_seen < ?", (cutoff,))
    return [(str(key), str(state), float(seen)) for key, state, seen in rows]
