"""``eval TRACE.jsonl [--baseline] [--json]``: replay a trace and print what the agent received."""

from __future__ import annotations

import argparse
from typing import Any

from retrieval.embedders import CachedEmbedder, EmbedderError
from server.cli.errors import CommandError
from server.cli.replay import (
    ReplayError,
    TraceError,
    read_trace,
    render_calls,
    render_comparison,
    render_counts,
    replay,
    to_json,
)
from server.config.settings import Settings
from server.stack import load_embedder
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
        return 0
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
    return 0
