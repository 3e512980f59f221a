"""The CLI commands. Each takes (args, settings, config_path, overrides) and returns an exit code."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from server.settings import Settings

logger = logging.getLogger(__name__)


class CommandError(RuntimeError):
    """A command cannot run; the message says why."""


def _open(settings: Settings):  # type: ignore[no-untyped-def]
    from retrieval.embedders import EmbedderError
    from server.data_dir import DataDirError
    from server.runtime import open_runtime
    from storage.vector_store import StoreError

    try:
        return open_runtime(settings)
    except (StoreError, EmbedderError, DataDirError) as exc:
        raise CommandError(str(exc)) from exc


class _ProgressBar:
    """A one-line progress bar with an ETA on a TTY stderr; silent otherwise."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, enabled: bool | None = None) -> None:
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._clock = clock
        self._started: float | None = None
        self._first_done = 0

    def __call__(self, done: int, total: int, current: str) -> None:
        if not self.enabled or total <= 0:
            return
        if self._started is None:
            # The first report arrives once the first batch is embedded, with no start time before
            # it: the rate (and so the ETA) is measured from this report on.
            self._started = self._clock()
            self._first_done = done
        width = 30
        filled = int(width * done / total)
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} chunks  "
            f"{self.eta(done, total):<10} {current[:40]:<40}"
        )
        sys.stderr.flush()

    def eta(self, done: int, total: int) -> str:
        """Time left at the rate since the first report: chunks embedded per second so far."""
        if self._started is None or done <= self._first_done:
            return "ETA --"
        rate = (done - self._first_done) / max(self._clock() - self._started, 1e-9)
        left = int((total - done) / rate)
        return f"ETA {left // 60}m{left % 60:02d}s"

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def cmd_ingest(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    from retrieval.ingest import IngestError
    from server.watch import ingest_lock

    runtime = _open(settings)
    bar = _ProgressBar()
    try:
        # Servers on this data directory keep serving; they see the new content once it commits.
        with ingest_lock(settings.data_dir):
            report = runtime.ingestor().run(args.directory, progress=bar)
    except IngestError as exc:
        raise CommandError(str(exc)) from exc
    finally:
        bar.close()
        runtime.close()
    for doc_key, reason in report.failed:
        print(f"failed: {doc_key}: {reason}", file=sys.stderr)
    print(report.summary())
    return 1 if report.failed else 0


def _service(settings: Settings):  # type: ignore[no-untyped-def]
    from retrieval.service import LookupService
    from retrieval.tracker import ActionMemory
    from server.runtime import policy_from

    runtime = _open(settings)
    memory = ActionMemory(ttl_seconds=settings.memory.ttl_seconds, max_sessions=settings.memory.max_sessions)
    return runtime, LookupService(runtime.engine, memory, lambda: policy_from(settings))


async def cmd_lookup(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    from retrieval.service import LookupRequest, UnknownDomainError
    from server.rendering import render_lookup

    if not args.query.strip():
        raise CommandError("query must not be blank")
    top_k = args.top_k or settings.retrieval.default_top_k
    if not 1 <= top_k <= 10:
        raise CommandError(f"--top-k must be between 1 and 10, got {top_k}")
    runtime, service = _service(settings)
    try:
        request = LookupRequest(query=args.query, domain=args.domain, top_k=top_k)
        outcome = await service.lookup(request, session_key=None, scope="none")
    except UnknownDomainError as exc:
        raise CommandError(str(exc)) from exc
    finally:
        runtime.close()
    if args.json:
        print(outcome.result.model_dump_json(indent=2))
    else:
        print(render_lookup(outcome.result), end="")
    logger.debug("lookup took %.1f ms; details %s", outcome.latency_ms, outcome.details)
    return 0


def cmd_map(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    from server.rendering import render_map

    runtime = _open(settings)
    try:
        knowledge_map = runtime.engine.knowledge_map()
    finally:
        runtime.close()
    print(
        knowledge_map.model_dump_json(indent=2) if args.json else render_map(knowledge_map),
        end="\n" if args.json else "",
    )
    return 0


def cmd_serve(
    args: argparse.Namespace, settings: Settings, config_path: Path | None, overrides: dict[str, Any]
) -> int:
    from server.serve import serve

    return serve(settings, config_path, overrides, transport=args.transport, stateless=args.stateless)


def cmd_stats(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    from server.stats_command import run_stats

    return run_stats(args, settings)


async def cmd_eval(
    args: argparse.Namespace, settings: Settings, config_path: Path | None, overrides: dict[str, Any]
) -> int:
    from server.eval_command import run_eval

    return await run_eval(args, settings)
