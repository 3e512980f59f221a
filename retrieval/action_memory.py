"""Action memory: what each session has already been given (session -> domain -> document -> passages).

Memory is kept per passage (chunk id): another section of a document already delivered is new
content, and since chunk ids are content-addressed, an edited passage is new content too.

Bounded by an idle TTL and a maximum session count with LRU eviction. The clock is injectable
so tests never sleep. A lock makes every operation atomic; ordering whole lookups of one
session is the lookup service's job (``ActionMemory.session_lock``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

Clock = Callable[[], float]


@dataclass
class HeldDocument:
    """What a session holds of one document."""

    domain: str
    title: str
    chunks: set[str] = field(default_factory=set)
    headings: list[str] = field(default_factory=list)
    # Set once a lookup was refused because the session holds this document: the topic is
    # answered, so another section of it is sent only on a targeted lookup.
    closed: bool = False


@dataclass(frozen=True)
class Delivery:
    """Passages of one document handed to a session by one call."""

    doc_key: str
    domain: str
    title: str
    chunk_ids: tuple[str, ...]
    headings: tuple[str, ...]


@dataclass
class SessionMemory:
    """Everything remembered about one session."""

    documents: dict[str, HeldDocument] = field(default_factory=dict)
    calls: int = 0
    retrievals: int = 0
    tokens: int = 0
    # The governance decision of the last lookup (ALLOW, TARGETED_ONLY, STOP).
    next_call: str | None = None
    # True once the water level reached HIGH with a STOP: every later lookup is refused.
    closed: bool = False
    last_seen: float = 0.0

    def to_state(self) -> str:
        """JSON for persistence (last_seen is stored apart, as wall-clock time)."""
        return json.dumps(
            {
                "documents": {
                    key: {
                        "domain": d.domain,
                        "title": d.title,
                        "chunks": sorted(d.chunks),
                        "headings": d.headings,
                    }
                    for key, d in self.documents.items()
                },
                "calls": self.calls,
                "retrievals": self.retrievals,
                "tokens": self.tokens,
                "next_call": self.next_call,
                "closed": self.closed,
            },
            ensure_ascii=False,
        )

    @classmethod
    def from_state(cls, state: str) -> SessionMemory:
        """Inverse of to_state; raises ValueError, KeyError or TypeError on a damaged state."""
        data = json.loads(state)
        documents = {
            key: HeldDocument(
                str(d["domain"]),
                str(d["title"]),
                set(d["chunks"]),
                list(d["headings"]),
                bool(d.get("closed")),
            )
            for key, d in data["documents"].items()
        }
        return cls(
            documents=documents,
            calls=int(data["calls"]),
            retrievals=int(data["retrievals"]),
            tokens=int(data["tokens"]),
            next_call=data["next_call"],
            closed=bool(data.get("closed", False)),
        )


@dataclass(frozen=True)
class HeldView:
    doc_key: str
    domain: str
    title: str
    chunks: frozenset[str]
    headings: tuple[str, ...]
    closed: bool = False


@dataclass(frozen=True)
class MemorySnapshot:
    """An immutable view handed to the lookup path."""

    documents: dict[str, HeldView]
    calls: int
    retrievals: int
    tokens: int
    next_call: str | None
    closed: bool

    @property
    def retrieved_domains(self) -> tuple[str, ...]:
        return tuple(sorted({d.domain for d in self.documents.values()}))


EMPTY = MemorySnapshot({}, 0, 0, 0, None, False)


class ActionMemory:
    """Per-session retrieval memory with TTL and LRU bounds."""

    def __init__(
        self,
        *,
        ttl_seconds: float,
        max_sessions: int,
        clock: Clock = time.monotonic,
        on_change: Callable[[str, SessionMemory | None], None] | None = None,
    ) -> None:
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds!r}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be at least 1, got {max_sessions!r}")
        self.ttl_seconds = ttl_seconds
        self.max_sessions = max_sessions
        self._clock = clock
        self._sessions: OrderedDict[str, SessionMemory] = OrderedDict()
        self._lock = threading.RLock()
        # One asyncio lock per session key: a lookup reads memory, awaits retrieval and then
        # records, so two concurrent lookups of one session must run one after the other.
        self._session_locks: dict[str, asyncio.Lock] = {}
        # Called after every change with the new state (None: forgotten); used for persistence.
        self._on_change = on_change

    def session_lock(self, session_key: str) -> asyncio.Lock:
        """The lock that orders the lookups of one session; other sessions stay concurrent."""
        with self._lock:
            lock = self._session_locks.get(session_key)
            if lock is None:
                if len(self._session_locks) > 4 * self.max_sessions:
                    # Drop locks nobody holds or waits for, so the table stays bounded.
                    self._session_locks = {k: v for k, v in self._session_locks.items() if v.locked()}
                lock = self._session_locks[session_key] = asyncio.Lock()
            return lock

    # -- internal --------------------------------------------------------------------
    def _get(self, session_key: str) -> SessionMemory | None:
        memory = self._sessions.get(session_key)
        if memory is not None and self._clock() - memory.last_seen > self.ttl_seconds:
            # Idle past the TTL: the session starts fresh (this also reopens a closed session).
            del self._sessions[session_key]
            self._notify(session_key, None)
            return None
        return memory

    def _touch(self, session_key: str) -> SessionMemory:
        memory = self._get(session_key)
        if memory is None:
            memory = SessionMemory()
            self._sessions[session_key] = memory
            self._evict_over_capacity()
        memory.last_seen = self._clock()
        self._sessions.move_to_end(session_key)
        return memory

    def _evict_over_capacity(self) -> None:
        while len(self._sessions) > self.max_sessions:
            evicted, _ = self._sessions.popitem(last=False)
            self._notify(evicted, None)

    def _notify(self, session_key: str, memory: SessionMemory | None) -> None:
        if self._on_change is not None:
            self._on_change(session_key, memory)

    # -- the API -------------------------------------------------------------------------
    def clear(self, session_key: str) -> bool:
        """Forget the session; returns whether there was anything to forget."""
        with self._lock:
            existed = self._sessions.pop(session_key, None) is not None
            self._notify(session_key, None)
            return existed

    def snapshot(self, session_key: str) -> MemorySnapshot:
        """The session's state at the start of a call (TTL applied)."""
        with self._lock:
            memory = self._get(session_key)
            if memory is None:
                return EMPTY
            return MemorySnapshot(
                documents={
                    key: HeldView(key, d.domain, d.title, frozenset(d.chunks), tuple(d.headings), d.closed)
                    for key, d in memory.documents.items()
                },
                calls=memory.calls,
                retrievals=memory.retrievals,
                tokens=memory.tokens,
                next_call=memory.next_call,
                closed=memory.closed,
            )

    def record_call(
        self,
        session_key: str,
        *,
        delivered: Iterable[Delivery],
        ran_retrieval: bool,
        tokens: int,
        next_call: str | None,
        closes: bool = False,
        answered: Iterable[str] = (),
    ) -> MemorySnapshot:
        """Count one call, remember the passages it delivered and the held topics it refused.

        ``closes`` closes the whole session (HIGH water); ``answered`` names held documents whose
        topic a refused repeat showed to be answered.
        """
        with self._lock:
            memory = self._touch(session_key)
            for delivery in delivered:
                held = memory.documents.setdefault(
                    delivery.doc_key, HeldDocument(delivery.domain, delivery.title)
                )
                held.chunks.update(delivery.chunk_ids)
                held.headings.extend(h for h in delivery.headings if h not in held.headings)
            for doc_key in answered:
                if doc_key in memory.documents:
                    memory.documents[doc_key].closed = True
            memory.calls += 1
            memory.retrievals += int(ran_retrieval)
            memory.tokens += tokens
            memory.next_call = next_call
            memory.closed = memory.closed or closes
            self._notify(session_key, memory)
            return self.snapshot(session_key)

    def restore(self, session_key: str, memory: SessionMemory, *, age_seconds: float) -> None:
        """Load a persisted session; age_seconds is how long ago it was last seen."""
        if age_seconds > self.ttl_seconds:
            return
        with self._lock:
            memory.last_seen = self._clock() - age_seconds
            self._sessions[session_key] = memory
            self._sessions.move_to_end(session_key)
            self._evict_over_capacity()
