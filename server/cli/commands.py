"""The knowledge-base commands: ``ingest``, ``lookup`` and ``map``.

Each takes (args, settings, config_path, overrides) and returns an exit code; a command that
cannot run raises CommandError.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from retrieval.embedders import EmbedderError
from retrieval.ingest import IngestError
from retrieval.requests import LookupRequest
from retrieval.service import UnknownDomainError
from server.cli.errors import CommandError
from server.cli.progress import ProgressBar
from server.config.data_dir import DataDirError
from server.config.settings import Settings
from server.inputs import Domain, InputError, Query, TopK, parse
from server.rendering import render_lookup, render_map
from server.stack import Runtime, lookup_service, open_runtime
from server.watch import ingest_lock
from storage.vector_store import StoreError

logger = logging.getLogger(__name__)


def _open(settings: Settings) -> Runtime:
    try:
        return open_runtime(settings)
    except (StoreError, EmbedderError, DataDirError) as exc:
        raise CommandError(str(exc)) from exc


def cmd_ingest(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    runtime = _open(settings)
    bar = ProgressBar()
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


def _request(args: argparse.Namespace, settings: Settings) -> LookupRequest:
    """The lookup's arguments, checked as the MCP tool checks them."""
    try:
        return LookupRequest(
            query=parse(Query, args.query, "query"),
            domain=parse(Domain, args.domain, "--domain"),
            top_k=parse(TopK, args.top_k or settings.retrieval.default_top_k, "--top-k"),
        )
    except InputError as exc:
        raise CommandError(str(exc)) from exc


async def cmd_lookup(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    request = _request(args, settings)
    runtime = _open(settings)
    try:
        outcome = await lookup_service(runtime).lookup(request, session_key=None, scope="none")
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
