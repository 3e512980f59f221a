"""Action memory: passages per session, TTL with an injected clock, LRU bounds, concurrency, persistence."""

from __future__ import annotations

import threading

import anyio
import pytest

from retrieval.action_memory import ActionMemory, Delivery, SessionMemory


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def deliver(memory: ActionMemory, session: str, doc: str, *chunks: str, next_call: str | None = None) -> None:
    delivery = Delivery(doc, "d", doc.upper(), chunks or (f"{doc}#0",), tuple(f"§{c}" for c in chunks))
    memory.record_call(session, delivered=[delivery], ran_retrieval=True, tokens=10, next_call=next_call)


def test_memory_holds_passages_per_document_and_domains() -> None:
    memory = ActionMemory(ttl_seconds=60, max_sessions=10)
    deliver(memory, "s1", "a.md", "c1")
    deliver(memory, "s1", "a.md", "c2")
    snapshot = memory.snapshot("s1")
    assert snapshot.documents["a.md"].chunks == {"c1", "c2"} and not memory.snapshot("s2").documents
    assert snapshot.documents["a.md"].headings == ("§c1", "§c2")
    assert snapshot.retrieved_domains == ("d",) and snapshot.calls == 2
    assert memory.clear("s1") is True and memory.clear("s1") is False


def test_idle_sessions_expire_after_the_ttl() -> None:
    clock = FakeClock()
    memory = ActionMemory(ttl_seconds=30, max_sessions=10, clock=clock)
    deliver(memory, "s1", "a.md", next_call="STOP")
    clock.now += 29
    assert memory.snapshot("s1").next_call == "STOP"
    clock.now += 31
    snapshot = memory.snapshot("s1")
    assert snapshot.next_call is None and not snapshot.documents and snapshot.calls == 0


def test_activity_extends_the_ttl() -> None:
    clock = FakeClock()
    memory = ActionMemory(ttl_seconds=30, max_sessions=10, clock=clock)
    for i in range(5):
        deliver(memory, "s1", "a.md", f"c{i}")
        clock.now += 20
    assert "c0" in memory.snapshot("s1").documents["a.md"].chunks


def test_least_recently_used_session_is_evicted_beyond_the_maximum() -> None:
    clock = FakeClock()
    memory = ActionMemory(ttl_seconds=300, max_sessions=2, clock=clock)
    for session in ("a", "b", "a", "c"):  # a is used again before c arrives
        deliver(memory, session, "x.md")
        clock.now += 1
    held = {session: bool(memory.snapshot(session).documents) for session in ("a", "b", "c")}
    assert held == {"a": True, "b": False, "c": True}


def test_persistence_callback_sees_every_change_and_forgetting() -> None:
    seen: list[tuple[str, bool]] = []
    memory = ActionMemory(
        ttl_seconds=60, max_sessions=10, on_change=lambda k, m: seen.append((k, m is not None))
    )
    deliver(memory, "s", "x.md")
    memory.clear("s")
    assert seen == [("s", True), ("s", False)]


def test_state_round_trips_through_json() -> None:
    memory = ActionMemory(ttl_seconds=60, max_sessions=10)
    saved: list[SessionMemory | None] = []
    memory = ActionMemory(ttl_seconds=60, max_sessions=10, on_change=lambda _k, m: saved.append(m))
    deliver(memory, "s", "x.md", "c1", "c2", next_call="TARGETED_ONLY")
    assert saved[-1] is not None
    restored = SessionMemory.from_state(saved[-1].to_state())
    assert restored.documents["x.md"].chunks == {"c1", "c2"} and restored.next_call == "TARGETED_ONLY"
    with pytest.raises((ValueError, KeyError)):
        SessionMemory.from_state('{"calls": 1}')


def test_concurrent_records_are_all_kept() -> None:
    memory = ActionMemory(ttl_seconds=60, max_sessions=100)

    def work(worker: int) -> None:
        for i in range(200):
            deliver(memory, f"s{worker % 4}", f"doc-{worker}-{i}")

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(len(memory.snapshot(f"s{k}").documents) for k in range(4))
    calls = sum(memory.snapshot(f"s{k}").calls for k in range(4))
    assert total == 8 * 200 and calls == 8 * 200


async def test_the_session_lock_orders_one_session_and_leaves_others_concurrent() -> None:
    memory = ActionMemory(ttl_seconds=60, max_sessions=10)
    order: list[str] = []

    async def hold(session: str, name: str, seconds: float) -> None:
        async with memory.session_lock(session):
            order.append(f"{name}+")
            await anyio.sleep(seconds)
            order.append(f"{name}-")

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(hold, "a", "a1", 0.05)
            await anyio.sleep(0.01)
            tg.start_soon(hold, "a", "a2", 0.0)
            tg.start_soon(hold, "b", "b1", 0.0)
    assert order.index("a1-") < order.index("a2+")  # the same session waits
    assert order.index("b1-") < order.index("a1-")  # another session does not


@pytest.mark.parametrize(("ttl", "maximum"), [(0, 1), (-1, 1), (1, 0)])
def test_invalid_bounds_are_rejected(ttl: float, maximum: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        ActionMemory(ttl_seconds=ttl, max_sessions=maximum)
