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
from retrieval.models import KnowledgeMap
from retrieval.requests import LookupRequest
from retrieval.service import EmptyKnowledgeBaseError, UnknownDomainError
from server.cli.errors import CommandError
from server.cli.progress import ProgressBar
from server.config.data_dir import DataDirError, empty_knowledge_base_message
from server.config.settings import Settings
from server.container import Runtime, described_map, lookup_service, open_runtime
from server.inputs import Domain, InputError, Query, TopK, parse
from server.rendering import render_lookup, render_map
from server.watch import ingest_lock
from storage.vector_store import StoreError

logger = logging.getLogger(__name__)


def open_checked(settings: Settings) -> Runtime:
    """The retrieval stack, or a CommandError that says why it cannot open."""
    try:
        return open_runtime(settings)
    except (StoreError, EmbedderError, DataDirError) as exc:
        raise CommandError(str(exc)) from exc


def cmd_ingest(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    runtime = open_checked(settings)
    bar = ProgressBar()
    try:
        # Servers on this data directory keep serving; they see the new content once it commits.
        with ingest_lock(settings.data_dir):
            report = runtime.ingestor().run(args.directory, progress=bar, replace=args.replace)
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
    # `is None`, not falsiness: --top-k 0 is out of range and must be refused, not defaulted.
    top_k = settings.retrieval.default_top_k if args.top_k is None else args.top_k
    try:
        return LookupRequest(
            query=parse(Query, args.query, "query"),
            domain=parse(Domain, args.domain, "--domain"),
            top_k=parse(TopK, top_k, "--top-k"),
        )
    except InputError as exc:
        raise CommandError(str(exc)) from exc


async def cmd_lookup(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    request = _request(args, settings)
    if _never_created(settings):
        raise CommandError(empty_knowledge_base_message(settings.data_dir))
    runtime = open_checked(settings)
    try:
        service = lookup_service(runtime, data_dir=settings.data_dir)
        outcome = await service.lookup(request, session_key=None, scope="none")
    except (EmptyKnowledgeBaseError, UnknownDomainError) as exc:
        raise CommandError(str(exc)) from exc
    finally:
        runtime.close()
    if args.json:
        print(outcome.result.model_dump_json(indent=2))
    else:
        text = render_lookup(outcome.result)
        print(text, end="" if text.endswith("\n") else "\n")
    logger.debug("lookup took %.1f ms; details %s", outcome.latency_ms, outcome.details)
    return 0


def _never_created(settings: Settings) -> bool:
    """A Milvus Lite data directory that does not exist (often a mistyped --data-dir): it holds
    nothing, and saying so needs neither creating it nor loading the model. With a Milvus
    server the lookup connects first, so an unreachable server is what gets reported."""
    return settings.milvus.uri is None and not settings.data_dir.is_dir()


def cmd_map(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    knowledge_map = KnowledgeMap(domains=[], document_count=0)
    if not _never_created(settings):
        runtime = open_checked(settings)
        try:
            knowledge_map = runtime.engine.knowledge_map()
        finally:
            runtime.close()
    knowledge_map = described_map(knowledge_map, settings.data_dir)
    if args.json:
        print(knowledge_map.model_dump_json(indent=2))
        return 0
    print(render_map(knowledge_map), end="")
    if knowledge_map.message:
        print(knowledge_map.message)
    return 0
