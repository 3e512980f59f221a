"""The CLI commands. Each takes (args, settings, config_path, overrides) and returns an exit code."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

import yaml

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
    """A one-line progress bar on a TTY stderr; silent otherwise."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()

    def __call__(self, done: int, total: int, current: str) -> None:
        if not self.enabled or total <= 0:
            return
        width = 30
        filled = int(width * done / total)
        sys.stderr.write(
            f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} chunks  {current[:40]:<40}"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def cmd_ingest(args: argparse.Namespace, settings: Settings, *_: Any) -> int:
    from retrieval.ingest import IngestError

    runtime = _open(settings)
    bar = _ProgressBar()
    try:
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


def cmd_calibrate(args: argparse.Namespace, settings: Settings, config_path: Path | None, *_: Any) -> int:
    from retrieval.calibration import CalibrationError, observe, propose_all, read_queries, score

    if args.write and config_path is None:
        raise CommandError("--write needs --config FILE (or LOOKUP_KNOWLEDGE_CONFIG) to write into")
    try:
        queries = read_queries(args.queries)
    except (OSError, CalibrationError) as exc:
        raise CommandError(str(exc)) from exc
    runtime = _open(settings)
    try:
        # Raw evidence (no offset): the offset is applied offline for each candidate value.
        evidence = [runtime.engine.retrieve(q.query, None, 5) for q in queries]
    finally:
        runtime.close()
    embedder = settings.embedder.name
    current_offset = settings.relevance.cross_language_offset.get(embedder, 0.0)
    current = settings.thresholds
    now = score(
        [observe(q, e.rescored(current_offset)) for q, e in zip(queries, evidence, strict=True)], current
    )
    try:
        offset, proposed, observations = propose_all(queries, evidence)
    except CalibrationError as exc:
        raise CommandError(str(exc)) from exc
    after = score(observations, proposed)
    report = {
        "embedder": embedder,
        "queries": len(queries),
        "answerable": sum(1 for q in queries if q.doc),
        "current": _calibration_part(current, current_offset, now),
        "proposed": _calibration_part(proposed, offset, after),
    }
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        _print_calibration(report)
    if args.write and config_path is not None:
        _write_thresholds(config_path, embedder, proposed.model_dump(), offset)
        print(
            f"wrote relevance.thresholds.{embedder} and relevance.cross_language_offset.{embedder} "
            f"to {config_path}",
            file=sys.stderr,
        )
    return 0


def _calibration_part(thresholds: Any, offset: float, scores: Any) -> dict[str, Any]:
    return {
        "thresholds": thresholds.model_dump(),
        "cross_language_offset": offset,
        "hit_at_1": round(scores.hit_at_1, 4),
        "mrr": round(scores.mrr, 4),
        "tier_accuracy": round(scores.tier_accuracy, 4),
        "confusion": scores.confusion,
    }


def _print_calibration(report: dict[str, Any]) -> None:
    print(f"embedder {report['embedder']}: {report['queries']} queries ({report['answerable']} answerable)")
    for label in ("current", "proposed"):
        part = report[label]
        t = part["thresholds"]
        print(
            f"\n{label}: highly_relevant={t['highly_relevant']} reference={t['reference']} "
            f"cross_language_offset={part['cross_language_offset']}"
        )
        print(
            f"  hit@1 {part['hit_at_1']:.3f}   MRR {part['mrr']:.3f}   tier accuracy {part['tier_accuracy']:.3f}"
        )
        print("  confusion (ideal -> graded):")
        for ideal, row in part["confusion"].items():
            cells = ", ".join(f"{got} {n}" for got, n in row.items())
            print(f"    {ideal:<16} {cells}")


def _write_thresholds(path: Path, embedder: str, values: dict[str, float], offset: float) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else {}
    data = data or {}
    relevance = data.setdefault("relevance", {})
    relevance.setdefault("thresholds", {})[embedder] = values
    relevance.setdefault("cross_language_offset", {})[embedder] = offset
    path.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")


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
