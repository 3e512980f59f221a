"""In-process measurements at one corpus size: warm lookup through the SDK's MCP client, its floor
(query embedding alone + one raw search through the store's client, as the engine makes it), the
repeated and blocked paths, and the invocation-log commit per call. All ratios are computed from
samples of the same rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from mcp import Client
from mcp_types import RequestParamsMeta

from bench.corpus import SyntheticChunk, identifier_query, take
from bench.stats import ratio_summary, summarize
from bench.store_ready import wait_until_indexed
from retrieval.engine import DENSE_LIMIT
from server.config.settings import Settings
from server.container import Runtime
from server.protocol.app import app_resources, create_server
from storage.vector_store import SEARCH_FIELDS, VECTOR_FIELD, string_literal

TOOL = "lookup_knowledge"


def short_path_governance() -> dict[str, Any]:
    """Governance that closes a session on its second call: water by calls, HIGH from the second.

    The first (exact) lookup is at MEDIUM and allowed; the identical repeat is DEDUPED at HIGH,
    which stops and closes the session; the third call is then refused without retrieval. Fresh
    lookups each open a new session, so they run at MEDIUM, where every tier allows as at LOW.
    """
    return {"water_metric": "calls", "levels": {"calls": {"low_max": 0, "medium_max": 1}}}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


class _Timed:
    """Wraps an async callable and keeps how long each await took, in ms."""

    def __init__(self, inner: Callable[..., Any]) -> None:
        self.inner = inner
        self.samples: list[float] = []

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await self.inner(*args, **kwargs)
        finally:
            self.samples.append(_ms(started))


# The per-sample series of a fresh lookup, each summarized over the rounds.
_SERIES = ("lookup_ms", "embed_ms", "search_ms", "floor_ms", "lookup_main_thread_cpu_ms")


class LookupBench:
    """One server over one data directory, driven by the in-process client."""

    def __init__(self, settings: Settings, embedder: Any, queries: Iterator[str], size: int) -> None:
        self.settings = settings
        self.inner = embedder  # the uncached model: the floor's embedding must not hit the LRU
        self.queries = queries
        self.size = size
        self.resources = app_resources(settings, overrides={"data_dir": settings.data_dir}, embedder=embedder)
        self.server = create_server(self.resources)
        self._calls = 0
        # Session ids unique to this run: the server restores persisted action memory at start.
        self._run = uuid.uuid4().hex[:8]
        self.cpu_ms: list[float] = []  # main-thread CPU time of each call() (see call)

    async def call(self, client: Client, query: str, session: str) -> tuple[float, dict[str, Any]]:
        # The client and the server's handler share this thread, so its CPU time is what the call
        # cost here, outside the engine's worker threads, and is not inflated by waiting for a core.
        cpu = time.thread_time()
        started = time.perf_counter()
        result = await client.call_tool(
            TOOL, {"query": query}, meta=cast(RequestParamsMeta, {"session_id": session})
        )
        elapsed = _ms(started)
        self.cpu_ms.append((time.thread_time() - cpu) * 1000)
        if result.is_error or result.structured_content is None:
            raise RuntimeError(f"lookup_knowledge failed for {query!r}: {result.content}")
        return elapsed, result.structured_content

    def session(self, label: str) -> str:
        self._calls += 1
        return f"bench-{self._run}-{label}-{self.size}-{self._calls}"

    def _runtime(self) -> Runtime:
        """The server's runtime, open once the first lookup has run."""
        runtime = self.resources.runtime
        if runtime is None:
            raise RuntimeError("the server's runtime is not open: no lookup has run yet")
        return runtime

    # -- the store, raw ------------------------------------------------------------------
    def _raw_search(self, vector: list[float], domain: str | None = None) -> float:
        """One search on the store's client with exactly the engine's collection, limit and parameters."""
        runtime = self._runtime()
        limit = DENSE_LIMIT
        client = runtime.store._client  # the server's own client: the floor must not add a hop
        started = time.perf_counter()
        client.search(
            runtime.store.collection,
            data=[vector],
            limit=limit,
            filter=f"domain == {string_literal(domain)}" if domain else "",
            output_fields=SEARCH_FIELDS,
            search_params={"metric_type": "COSINE", "params": {"ef": max(64, limit)}},
        )
        return _ms(started)

    def settle(self) -> dict[str, Any]:
        """The server's store, searched until its index serves (see bench.store_ready)."""
        runtime = self._runtime()
        described = runtime.store._client.describe_index(runtime.store.collection, VECTOR_FIELD)
        return {
            "index": {
                k: described.get(k) for k in ("index_type", "state", "indexed_rows", "pending_index_rows")
            },
            **wait_until_indexed(runtime.store, seed=self.size),
        }

    # -- measurements ----------------------------------------------------------------------
    async def run(
        self,
        *,
        rounds: int,
        per_round: int,
        warmup: int,
        repeat_items: list[SyntheticChunk],
        profile_path: Path | None = None,
        profile_queries: int = 0,
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"chunks": self.size}
        async with Client(self.server, mode="legacy") as client:
            started = time.perf_counter()
            await self.call(client, next(self.queries), self.session("first"))
            out["first_lookup_in_process_ms"] = round(_ms(started), 1)
            service = await self.resources.lookup_service()
            engine = service.engine
            cached = self._runtime().embedder
            out["store"] = self.settle()
            log(
                f"  [{self.size}] store ready after {out['store']['seconds']} s: {out['store']['batches_ms']} ms/search"
            )
            commit = self._time_log_commits()
            for query in take(self.queries, warmup):
                await self.call(client, query, self.session("warm"))
            if commit is not None:
                commit.samples.clear()  # only the measured rounds count

            out.update(
                await self._fresh_rounds(client, engine, cached, commit, rounds=rounds, per_round=per_round)
            )
            out["repeat_and_blocked"] = await self._repeat_and_blocked(
                client, engine, cached, repeat_items, rounds
            )
            if profile_path is not None and profile_queries:
                out["profile"] = await self._profile(client, profile_path, profile_queries)
        return out

    async def _fresh_rounds(
        self, client: Client, engine: Any, cached: Any, commit: _Timed | None, *, rounds: int, per_round: int
    ) -> dict[str, Any]:
        """Fresh lookups against their floor, round by round: the series, tiers and any cache answer."""
        series: dict[str, list[list[float]]] = {name: [] for name in _SERIES}
        commits: list[list[float]] = []
        tiers: dict[str, int] = {}
        not_fresh: list[str] = []
        store_searches = 0
        for r in range(rounds):
            current: dict[str, list[float]] = {name: [] for name in _SERIES}
            for i, query in enumerate(take(self.queries, per_round)):
                before = (engine.searches, cached.misses)
                # Alternate the order so neither side always runs on a warmer cache.
                sample = await self._fresh_sample(client, query, lookup_first=(r + i) % 2 == 0)
                for name in _SERIES:
                    current[name].append(sample[name])
                tiers[sample["tier"]] = tiers.get(sample["tier"], 0) + 1
                searched, embedded = engine.searches - before[0], cached.misses - before[1]
                store_searches += searched
                if searched == 0 or embedded != 1:
                    # A cache answered: the sample is not a fresh lookup.
                    not_fresh.append(f"{query!r}: searches +{searched}, embeddings +{embedded}")
            for name in _SERIES:
                series[name].append(current[name])
            if commit is not None:
                commits.append(commit.samples[:])
                commit.samples.clear()
            log(
                f"  [{self.size}] round {r + 1}/{rounds}: lookup {statistics.median(current['lookup_ms']):.1f} ms, "
                f"embed {statistics.median(current['embed_ms']):.1f} ms, "
                f"search {statistics.median(current['search_ms']):.1f} ms"
            )
        return {
            **{name: summarize(values) for name, values in series.items()},
            "lookup_over_floor": ratio_summary(series["lookup_ms"], series["floor_ms"]),
            "store_searches_per_lookup": round(store_searches / (rounds * per_round), 2),
            "tiers": tiers,
            "fresh_violations": len(not_fresh),
            "fresh_violation_examples": not_fresh[:5],
            "log_commit_ms": summarize(commits) if any(commits) else {"note": "no invocation log"},
        }

    async def _fresh_sample(self, client: Client, query: str, *, lookup_first: bool) -> dict[str, Any]:
        """One fresh lookup through MCP and, next to it, its floor from the raw parts."""
        sample: dict[str, Any] = {}

        async def lookup() -> None:
            sample["lookup_ms"], result = await self.call(client, query, self.session("fresh"))
            sample["lookup_main_thread_cpu_ms"] = self.cpu_ms[-1]
            sample["tier"] = result["relevance_level"]

        def floor() -> None:
            started = time.perf_counter()
            vector = self.inner.embed_queries([query])[0].tolist()
            sample["embed_ms"] = _ms(started)
            sample["search_ms"] = self._raw_search(vector)
            sample["floor_ms"] = sample["embed_ms"] + sample["search_ms"]

        if lookup_first:
            await lookup()
            floor()
        else:
            floor()
            await lookup()
        return sample

    async def run_short_paths(self, *, rounds: int, repeat_items: list[SyntheticChunk]) -> dict[str, Any]:
        """Only the repeated and blocked paths (for a what-if configuration, such as the log off)."""
        async with Client(self.server, mode="legacy") as client:
            for query in take(self.queries, 3):
                await self.call(client, query, self.session("warm"))
            service = await self.resources.lookup_service()
            return await self._repeat_and_blocked(
                client, service.engine, self._runtime().embedder, repeat_items, rounds
            )

    def _time_log_commits(self) -> _Timed | None:
        """Time the invocation log's record() (the per-call commit) in place."""
        log_ = self.resources.log
        if log_ is None:
            return None
        timed = _Timed(log_.record)
        log_.record = timed  # type: ignore[method-assign]  # timed in place, on the server's own log
        return timed

    async def _repeat_and_blocked(
        self, client: Client, engine: Any, cached: Any, items: list[SyntheticChunk], rounds: int
    ) -> dict[str, Any]:
        """Per session: an exact lookup, the identical call again (DEDUPED), then any call (blocked).

        Blocked means refused without retrieval, which happens only once a session is closed at
        HIGH water: the settings given to this bench must make the repeat reach HIGH (see
        ``short_path_governance``).
        """
        per_round = max(1, len(items) // rounds)
        repeated: list[list[float]] = []
        blocked: list[list[float]] = []
        repeated_cpu: list[float] = []
        blocked_cpu: list[float] = []
        work = {"embeddings": 0, "searches": 0}
        unexpected: list[str] = []
        for r in range(rounds):
            rep, blk = [], []
            for item in items[r * per_round : (r + 1) * per_round]:
                session = self.session("repeat")
                query = identifier_query(item)
                _, first = await self.call(client, query, session)
                if first["relevance_level"] != "PRECISE":
                    unexpected.append(f"first {query!r}: {first['relevance_level']}")
                before = (engine.searches, cached.misses + cached.hits)
                elapsed, second = await self.call(client, query, session)
                rep.append(elapsed)
                repeated_cpu.append(self.cpu_ms[-1])
                if second["relevance_level"] != "DEDUPED":
                    unexpected.append(f"repeat {query!r}: {second['relevance_level']}")
                elapsed, third = await self.call(client, next(self.queries), session)
                blk.append(elapsed)
                blocked_cpu.append(self.cpu_ms[-1])
                if third.get("dedup_reason") != "circuit_open":
                    unexpected.append(f"blocked {query!r}: {third.get('dedup_reason')}")
                work["searches"] += engine.searches - before[0]
                work["embeddings"] += cached.misses + cached.hits - before[1]
            repeated.append(rep)
            blocked.append(blk)
        return {
            "repeated_ms": summarize(repeated),
            "blocked_ms": summarize(blocked),
            "repeated_main_thread_cpu_ms": summarize([repeated_cpu]),
            "blocked_main_thread_cpu_ms": summarize([blocked_cpu]),
            # Embedding calls (cached or not) and store searches made by the repeated and blocked calls.
            "work_done": work,
            "unexpected": unexpected[:10],
        }

    async def _profile(self, client: Client, path: Path, count: int) -> dict[str, Any]:
        """Profile fresh warm lookups with pyinstrument, worker-thread work run inline so it is sampled."""
        from pyinstrument import Profiler

        async def inline(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
            return func(*args, **kwargs)

        queries = take(self.queries, count)
        profiler = Profiler(interval=0.0005, async_mode="disabled")
        samples: list[float] = []
        # pyinstrument samples one thread: run the engine inline (it is normally in to_thread).
        with _patched(asyncio, "to_thread", inline):
            profiler.start()
            for query in queries:
                elapsed, _ = await self.call(client, query, self.session("profile"))
                samples.append(elapsed)
            profiler.stop()
        header = (
            f"# Warm lookup_knowledge through the in-process MCP client, {self.size} chunks, "
            f"{count} fresh queries (median {statistics.median(samples):.1f} ms under the profiler).\n"
            "# The engine's to_thread work (embedding, Milvus search) runs inline here so the sampler sees it.\n"
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            header + profiler.output_text(unicode=True, color=False, show_all=False, timeline=False),
            encoding="utf-8",
        )
        shares = _shares(profiler.last_session.root_frame() if profiler.last_session else None)
        return {
            "path": str(path),
            "queries": count,
            "median_ms_under_profiler": round(statistics.median(samples), 2),
            "shares": shares,
        }


# Where a lookup's time goes, by the outermost frame of each part (per cent of the profiled time).
_PARTS = {
    "query embedding": (("embed_queries", "embedders.py"),),
    # Over the socket (another process's Lite, a Milvus server), or in the process serving Lite.
    "Milvus search": (("search", "milvus_client.py"), ("local_search", "lite_share.py")),
    "lexical search": (("search", "lexical_index.py"),),
    "invocation log": (("record", "invocation_log.py"),),
}


def _shares(root: Any) -> dict[str, float]:
    if root is None or not root.time:
        return {}
    found = dict.fromkeys(_PARTS, 0.0)

    def walk(frame: Any) -> None:
        for part, matchers in _PARTS.items():
            for function, file_name in matchers:
                if frame.function == function and (frame.file_path or "").endswith(file_name):
                    found[part] += frame.time
                    return
        for child in frame.children:
            walk(child)

    walk(root)
    found["everything else (MCP, service, threads)"] = root.time - sum(found.values())
    return {part: round(100 * seconds / root.time, 1) for part, seconds in found.items()}


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(target, name)
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)
