"""``eval TRACE.jsonl [--baseline] [--json]``: replay a trace and print what the agent received.

Exit code 0 when every call was answered, 1 when some call failed (an unknown domain, say; the
figures are printed all the same and the calls table names the error), 2 when the replay cannot run.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from retrieval.embedders import CachedEmbedder, EmbedderError
from server.cli.errors import CommandError
from server.cli.replay import (
    ReplayError,
    ReplayReport,
    TraceError,
    read_trace,
    render_calls,
    render_comparison,
    render_counts,
    replay,
    to_json,
)
from server.config.settings import Settings
from server.container import load_embedder
from storage.vector_store import StoreError


async def cmd_eval(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    """Replay args.trace governed (and, with --baseline, stateless) and print the figures."""
    try:
        steps = read_trace(args.trace)
    except TraceError as exc:
        raise CommandError(str(exc)) from exc
    try:
        # Load the model once for both runs; each run opens its own server over the same data.
        embedder = CachedEmbedder(load_embedder(settings), size=settings.embedder.query_cache_size)
        governed = await replay(settings, steps, embedder=embedder)
        baseline = await replay(settings, steps, baseline=True, embedder=embedder) if args.baseline else None
    except (ReplayError, EmbedderError, StoreError) as exc:
        raise CommandError(str(exc)) from exc
    if args.json:
        print(to_json(args.trace, governed, baseline))
        return _failed_calls(governed, baseline)
    sessions = len(governed.sessions)
    print(f"trace {args.trace}: {len(steps)} lookups in {sessions} session(s)")
    print("\ngoverned (per-session action memory and governance on):")
    print("\n".join(render_calls(governed)))
    print()
    print("\n".join(render_counts(governed)))
    if baseline is not None:
        print("\nbaseline (stateless: governance and dedup off, top_k documents per call):")
        print("\n".join(render_counts(baseline)))
        print()
        print("\n".join(render_comparison(governed, baseline)))
    return _failed_calls(governed, baseline)


def _failed_calls(*reports: ReplayReport | None) -> int:
    """1, with a line on stderr, when a replayed call failed: its figures do not measure the trace."""
    failed = [(r.mode, r.total.errors, r.total.calls) for r in reports if r is not None and r.total.errors]
    for mode, errors, calls in failed:
        print(f"error: {errors} of {calls} {mode} calls failed (see the calls' errors)", file=sys.stderr)
    return 1 if failed else 0
