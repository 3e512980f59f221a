"""Action memory: the tracker API, TTL with an injected clock, LRU bounds, concurrency."""

from __future__ import annotations

import threading

import pytest

from retrieval.tracker import ActionMemory


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_mark_and_query_documents_and_domains() -> None:
    memory = ActionMemory(ttl_seconds=60, max_sessions=10)
    memory.mark_retrieved("s1", "infra", "infra/pool.md", "Pool")
    assert memory.is_doc_retrieved("s1", "infra/pool.md")
    assert memory.is_domain_retrieved("s1", "infra")
    assert not memory.is_doc_retrieved("s2", "infra/pool.md")
    assert memory.retrieved_domains("s1") == ["infra"]
    assert memory.clear("s1") is True
    assert not memory.is_doc_retrieved("s1", "infra/pool.md")
    assert memory.clear("s1") is False


def test_idle_sessions_expire_after_the_ttl() -> None:
    clock = FakeClock()
    memory = ActionMemory(ttl_seconds=30, max_sessions=10, clock=clock)
    memory.record_call(
        "s1", returned=[("api", "api/a.md", "A")], ran_retrieval=True, tokens=10, next_call="STOP"
    )
    clock.now += 29
    assert memory.snapshot("s1").next_call == "STOP"
    clock.now += 31
    snapshot = memory.snapshot("s1")
    assert snapshot.next_call is None and not snapshot.retrieved_doc_keys and snapshot.calls == 0


def test_activity_extends_the_ttl() -> None:
    clock = FakeClock()
    memory = ActionMemory(ttl_seconds=30, max_sessions=10, clock=clock)
    for _ in range(5):
        memory.mark_retrieved("s1", "api", "api/a.md")
        clock.now += 20
    assert memory.is_doc_retrieved("s1", "api/a.md")


def test_least_recently_used_session_is_evicted_beyond_the_maximum() -> None:
    clock = FakeClock()
    memory = ActionMemory(ttl_seconds=300, max_sessions=2, clock=clock)
    memory.mark_retrieved("a", "d", "x")
    clock.now += 1
    memory.mark_retrieved("b", "d", "x")
    clock.now += 1
    memory.mark_retrieved("a", "d", "y")  # a is now the most recent
    clock.now += 1
    memory.mark_retrieved("c", "d", "x")
    assert "b" not in memory
    assert "a" in memory and "c" in memory
    assert len(memory) == 2


def test_persistence_callback_sees_every_change_and_forgetting() -> None:
    seen: list[tuple[str, bool]] = []
    memory = ActionMemory(
        ttl_seconds=60, max_sessions=10, on_change=lambda k, m: seen.append((k, m is not None))
    )
    memory.mark_retrieved("s", "d", "x")
    memory.clear("s")
    assert seen == [("s", True), ("s", False)]


def test_concurrent_marks_are_all_kept() -> None:
    memory = ActionMemory(ttl_seconds=60, max_sessions=100)

    def work(worker: int) -> None:
        for i in range(200):
            memory.record_call(
                f"s{worker % 4}",
                returned=[("d", f"doc-{worker}-{i}", "")],
                ran_retrieval=True,
                tokens=1,
                next_call=None,
            )

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(len(memory.snapshot(f"s{k}").retrieved_doc_keys) for k in range(4))
    calls = sum(memory.snapshot(f"s{k}").calls for k in range(4))
    assert total == 8 * 200 and calls == 8 * 200


@pytest.mark.parametrize(("ttl", "maximum"), [(0, 1), (-1, 1), (1, 0)])
def test_invalid_bounds_are_rejected(ttl: float, maximum: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        ActionMemory(ttl_seconds=ttl, max_sessions=maximum)
