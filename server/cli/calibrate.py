"""``calibrate``: ingest each evaluation set, fit the tier models, report held-out figures, write them.

An evaluation set is a directory with ``kb/`` (a knowledge base) and ``questions.jsonl``. Each set
is ingested into its own data directory under ``<data_dir>/calibration/<name>`` (incremental, so
a second run only reads). The figures are leave-one-knowledge-base-out: the models that score a
set were fitted on the other sets only. The model written with ``--write`` is fitted on all.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from retrieval.calibration import FitMemo, fit, leave_one_out
from retrieval.calibration_figures import Figures, evaluate
from retrieval.calibration_sets import CalibrationError, KnowledgeBase, read_queries
from retrieval.embedders import CachedEmbedder
from retrieval.engine import KnowledgeView
from server.cli.errors import CommandError
from server.config.settings import Settings
from server.config.yaml_entry import YamlEntryError, set_entry
from server.container import load_embedder, open_runtime

_COLUMNS = (
    ("codes PRECISE", "codes_precise"),
    ("false PRECISE", "false_precise"),
    ("hit@1", "hit_at_1"),
    ("delivered", "delivered"),
    ("docs/answer", "documents_per_answer"),
    ("answer in content", "answer_in_content"),
    ("false NO_MATCH", "false_no_match"),
    ("HR precision", "hr_precision"),
    ("far NO_MATCH", "far_no_match"),
    ("near NO_MATCH", "near_no_match"),
    ("far HR", "far_highly_relevant"),
    ("near HR", "near_highly_relevant"),
)


# Queries kept encoded while calibrating: the questions of every set and the background.
_QUERY_CACHE = 20_000

# An evaluation set's layout: a knowledge base, and the questions asked of it.
KB_DIR, QUESTIONS_FILE = "kb", "questions.jsonl"


def check_set(directory: Path) -> None:
    """Fail before any ingest if a path is not an evaluation set."""
    missing = [part for part in (KB_DIR, QUESTIONS_FILE) if not (directory / part).exists()]
    if directory.is_dir() and not missing:
        return
    if not directory.exists():
        why = "it does not exist"
    elif directory.is_dir():
        why = f"it has no {' and no '.join(missing)}"
    else:
        why = "it is not a directory"
    raise CalibrationError(
        f"{directory} is not an evaluation set ({why}): a set is a directory with {KB_DIR}/ and {QUESTIONS_FILE}"
    )


def load_set(
    directory: Path, settings: Settings, *, progress: bool = True, embedder: CachedEmbedder | None = None
) -> KnowledgeBase:
    """Ingest one evaluation set and gather the evidence of its questions and of the background's."""
    name = directory.name
    queries = read_queries(directory / QUESTIONS_FILE)
    local = settings.model_copy(update={"data_dir": settings.data_dir / "calibration" / name})
    runtime = open_runtime(local, embedder=embedder)
    if embedder is not None:
        # The background is encoded once per embedder (shipped, or kept in the data directory)
        # by the same model: asking its questions must not encode them again for every set.
        embedder.remember(runtime.background.questions, runtime.background.vectors)
    try:
        report = runtime.ingestor().run(directory / KB_DIR)
        if progress:
            print(f"{name}: {report.summary()}", file=sys.stderr)
        if report.failed:
            raise CalibrationError(
                f"{name}: {len(report.failed)} file(s) failed to ingest: {report.failed[0]}"
            )
        view = KnowledgeView.load(runtime.catalog)
        chunks = {key: runtime.catalog.chunks_of(key) for key in view.entries}
        evidence = [runtime.engine.retrieve(q.query, None) for q in queries]
        # Asked as queries, the background questions would find themselves in the background.
        background = [
            replace(runtime.engine.retrieve(question, None), background=float(score))
            for question, score in zip(
                runtime.background.questions, runtime.background.left_out(), strict=True
            )
        ]
    finally:
        runtime.close()
    return KnowledgeBase(name, view, chunks, queries, evidence, background)


def shared_embedder(settings: Settings) -> CachedEmbedder:
    """One embedder for every set, caching every query: the background is asked of each set."""
    return CachedEmbedder(load_embedder(settings), size=_QUERY_CACHE)


def cmd_calibrate(args: argparse.Namespace, settings: Settings, config_path: Path | None, *_: Any) -> int:
    if args.write and config_path is None:
        raise CommandError("--write needs --config FILE (or LOOKUP_KNOWLEDGE_CONFIG) to write into")
    try:
        for directory in args.sets:
            check_set(directory)
        embedder = shared_embedder(settings)
        bases = [load_set(directory, settings, embedder=embedder) for directory in args.sets]
        memo = FitMemo()  # each set's rankings, shared by the held-out fits and the fit on all
        held_out = leave_one_out(bases, memo=memo) if len(bases) > 1 else []
        # fit() chooses the offset, the lexical weight and the logistic models; the weights of
        # the BGE-M3 lexical match and the reranker are not fitted, so the configured ones stay.
        configured = settings.tier_model
        model = fit(bases, memo=memo).model_copy(
            update={"sparse_weight": configured.sparse_weight, "rerank_weight": configured.rerank_weight}
        )
    except (OSError, CalibrationError, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    current = [evaluate(kb, settings.tier_model) for kb in bases]
    report = _report(settings, bases, held_out, current, model)
    if args.json:
        print(json.dumps(report, indent=2, ensure_ascii=False))
    else:
        print_report(report)
    if args.write and config_path is not None:
        write_model(config_path, settings.embedder.name, model.model_dump())
        print(f"wrote relevance.models.{settings.embedder.name} to {config_path}", file=sys.stderr)
    return 0


def _report(
    settings: Settings,
    bases: list[KnowledgeBase],
    held_out: list[Any],
    current: list[Figures],
    model: Any,
) -> dict[str, Any]:
    total_held, total_current = Figures(), Figures()
    for h in held_out:
        total_held.add(h.figures)
    for figures in current:
        total_current.add(figures)
    return {
        "embedder": settings.embedder.name,
        "sets": [kb.name for kb in bases],
        "held_out": {h.name: h.figures.as_dict() for h in held_out},
        "held_out_total": total_held.as_dict() if held_out else None,
        "configured_model": {kb.name: f.as_dict() for kb, f in zip(bases, current, strict=True)},
        "configured_model_total": total_current.as_dict(),
        "fitted_on_all": model.model_dump(),
    }


def print_report(report: dict[str, Any]) -> None:
    """The figures as a table: one row per held-out set, then the total."""
    print(f"embedder {report['embedder']}; sets: {', '.join(report['sets'])}")
    for title, rows, total in (
        ("held out (fitted on the other sets)", report["held_out"], report["held_out_total"]),
        ("configured model (the settings in force)", report["configured_model"], None),
    ):
        if not rows:
            continue
        print(f"\n{title}")
        header = f"{'set':<18}" + "".join(f"{label:>18}" for label, _ in _COLUMNS)
        print(header)
        for name, figures in [*rows.items(), *([("total", total)] if total else [])]:
            print(f"{name:<18}" + "".join(f"{figures[key]!s:>18}" for _, key in _COLUMNS))
    print("\nfitted on all sets:", json.dumps(report["fitted_on_all"]))


def write_model(path: Path, embedder: str, model: dict[str, Any]) -> None:
    """Set relevance.models.<embedder> in the config file, keeping the rest of it and its comments."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    try:
        updated = set_entry(text, ["relevance", "models", embedder], model)
    except YamlEntryError as exc:
        raise CommandError(f"cannot write the model into {path}: {exc}") from exc
    path.write_text(updated, encoding="utf-8")
