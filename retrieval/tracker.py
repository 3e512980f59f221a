"""Action memory: what each session has already been given (session -> domain -> doc_keys).

Bounded by an idle TTL and a maximum session count with LRU eviction. The clock is
injectable so tests never sleep. A lock makes every operation atomic, because the
HTTP transports run requests of many sessions concurrently.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

Clock = Callable[[], float]


@dataclass
class SessionMemory:
    """Everything remembered about one session."""

    domains: dict[str, set[str]] = field(default_factory=dict)
    titles: dict[str, str] = field(default_factory=dict)
    calls: int = 0
    retrievals: int = 0
    tokens: int = 0
    # The governance decision of the last lookup; "STOP" keeps the circuit open.
    next_call: str | None = None
    last_seen: float = 0.0

    def doc_keys(self) -> set[str]:
        return {key for keys in self.domains.values() for key in keys}


class MemoryPersistence(Protocol):
    """Where memory survives restarts (the SQLite log implements it)."""

    def save(self, session_key: str, memory: SessionMemory) -> None: ...

    def delete(self, session_key: str) -> None: ...


@dataclass(frozen=True)
class MemorySnapshot:
    """An immutable view handed to the lookup path."""

    retrieved_doc_keys: frozenset[str]
    retrieved_domains: tuple[str, ...]
    titles: dict[str, str]
    calls: int
    retrievals: int
    tokens: int
    next_call: str | None


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
        # Called after every change with the new state (None: forgotten); used for persistence.
        self._on_change = on_change

    # -- internal --------------------------------------------------------------------
    def _get(self, session_key: str) -> SessionMemory | None:
        memory = self._sessions.get(session_key)
        if memory is not None and self._clock() - memory.last_seen > self.ttl_seconds:
            # Idle past the TTL: the session starts fresh (this also reopens a STOP circuit).
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

    # -- the tracker API of the reference design --------------------------------------
    def mark_retrieved(self, session_key: str, domain: str, doc_key: str, title: str = "") -> None:
        """Record that doc_key (in domain) was returned to the session."""
        with self._lock:
            memory = self._touch(session_key)
            memory.domains.setdefault(domain, set()).add(doc_key)
            memory.titles[doc_key] = title or doc_key
            self._notify(session_key, memory)

    def is_doc_retrieved(self, session_key: str, doc_key: str) -> bool:
        with self._lock:
            memory = self._get(session_key)
            return memory is not None and any(doc_key in keys for keys in memory.domains.values())

    def is_domain_retrieved(self, session_key: str, domain: str) -> bool:
        with self._lock:
            memory = self._get(session_key)
            return memory is not None and domain in memory.domains

    def retrieved_domains(self, session_key: str) -> list[str]:
        with self._lock:
            memory = self._get(session_key)
            return sorted(memory.domains) if memory else []

    def clear(self, session_key: str) -> bool:
        """Forget the session; returns whether there was anything to forget."""
        with self._lock:
            existed = self._sessions.pop(session_key, None) is not None
            self._notify(session_key, None)
            return existed

    # -- what the lookup path needs ----------------------------------------------------
    def snapshot(self, session_key: str) -> MemorySnapshot:
        """The session's state at the start of a call (TTL applied)."""
        with self._lock:
            memory = self._get(session_key) or SessionMemory()
            return MemorySnapshot(
                retrieved_doc_keys=frozenset(memory.doc_keys()),
                retrieved_domains=tuple(sorted(memory.domains)),
                titles=dict(memory.titles),
                calls=memory.calls,
                retrievals=memory.retrievals,
                tokens=memory.tokens,
                next_call=memory.next_call,
            )

    def record_call(
        self,
        session_key: str,
        *,
        returned: Iterable[tuple[str, str, str]],
        ran_retrieval: bool,
        tokens: int,
        next_call: str | None,
    ) -> MemorySnapshot:
        """Count one lookup and remember the (domain, doc_key, title) triples it returned."""
        with self._lock:
            memory = self._touch(session_key)
            for domain, doc_key, title in returned:
                memory.domains.setdefault(domain, set()).add(doc_key)
                memory.titles[doc_key] = title or doc_key
            memory.calls += 1
            memory.retrievals += int(ran_retrieval)
            memory.tokens += tokens
            memory.next_call = next_call
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

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def __contains__(self, session_key: object) -> bool:
        with self._lock:
            return isinstance(session_key, str) and self._get(session_key) is not None
