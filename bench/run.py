"""``make bench``: measure at realistic chunk lengths, write ``bench/results/*.json`` and ``docs/benchmarks.md``.

Order: load the model once; where embedding time goes at realistic lengths; chunk-level
incremental embedding (one part of a 12-part document edited); the sample knowledge base
ingested fresh (median of 3) against embedding its chunks alone; Chinese and English synthetic
chunks of the sample's lengths, likewise; the short-chunk corpus's ingestion (the second table).
Then for each size (1k -> 10k, nested, ingested incrementally) of a realistic-length corpus the
in-process lookup measurements; at the reference size also the profile, the cold starts and the
peak RSS of a real serving process; then the short-chunk lookups, the invocation-log commit,
the governance replay and the web console over a 100,000-row log. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import random
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import (
    console_bench,
    conversion_bench,
    embed_profile,
    governance_bench,
    incremental_bench,
    log_bench,
    machine,
)
from bench.coldstart import cold_start
from bench.corpus import (
    DEFAULT_SEED,
    DOMAINS,
    SyntheticChunk,
    corpus,
    fresh_queries,
    take,
    write_knowledge_base,
)
from bench.ingest_bench import ingest_ratio
from bench.lookup_bench import LookupBench, log, short_path_governance
from bench.realistic import HeadEmbedder, embedded_texts, realistic_corpus
from bench.report import render
from bench.store_ready import wait_until_indexed
from bench.targets import evaluate

ROOT = Path(__file__).resolve().parent.parent
SAMPLE_KB = ROOT / "examples" / "knowledge"
KINDS = ("realistic", "short")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", default=None, help="realistic corpus sizes in chunks, comma-separated (1000,10000)"
    )
    p.add_argument("--short-sizes", default=None, help="short-chunk corpus sizes for lookups (1000; 0: none)")
    p.add_argument("--reference-size", type=int, default=None, help="size the targets are judged at (10000)")
    p.add_argument("--quick", action="store_true", help="small sizes and few samples: a smoke run")
    p.add_argument("--domains", type=int, default=len(DOMAINS), help="domains of the synthetic corpus")
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--rounds", type=int, default=None, help="rounds per measurement (default 5)")
    p.add_argument("--per-round", type=int, default=None, help="fresh lookups per round (default 40)")
    p.add_argument(
        "--work-dir", type=Path, default=ROOT / ".data" / "bench", help="corpus and data directories"
    )
    p.add_argument(
        "--reuse-work", action="store_true", help="keep an existing work dir (ingests only what is new)"
    )
    p.add_argument("--keep-work", action="store_true", help="do not delete the work dir at the end")
    p.add_argument(
        "--results-dir", type=Path, default=None, help="default bench/results (bench/results/quick)"
    )
    p.add_argument("--docs", type=Path, default=None, help="default docs/benchmarks.md (none with --quick)")
    p.add_argument("--skip-cold-start", action="store_true")
    p.add_argument(
        "--render-only", action="store_true", help="only regenerate the docs page from --results-dir's JSON"
    )
    return p


def _sizes(text: str, flag: str) -> list[int]:
    try:
        sizes = sorted({int(s) for s in text.split(",") if int(s)})
    except ValueError as exc:
        raise SystemExit(f"error: {flag} must be comma-separated integers, got {text!r}") from exc
    if any(s < 50 for s in sizes):
        raise SystemExit(f"error: corpus sizes must be at least 50 chunks, got {sizes}")
    return sizes


def _load_results(results_dir: Path) -> dict[str, Any]:
    """A finished run's results, as written by main()."""
    summary = results_dir / "summary.json"
    if not summary.exists():
        raise SystemExit(f"error: no results to render: {summary} does not exist (run the benchmarks first)")
    results: dict[str, Any] = json.loads(summary.read_text(encoding="utf-8"))
    for kind in KINDS:
        results[f"lookup_{kind}"] = {
            str(size): json.loads((results_dir / f"lookup-{kind}-{size}.json").read_text(encoding="utf-8"))
            for size in results[f"sizes_{kind}"]
        }
    return results


class Clock:
    def __init__(self) -> None:
        self.started = time.perf_counter()

    def __call__(self, message: str) -> None:
        log(f"[{time.perf_counter() - self.started:7.1f}s] {message}")


def _ingest_step(
    kb: Path, data: Path, embedder: Any, chunks: list[SyntheticChunk], clock: Clock, label: str
) -> dict[str, Any]:
    from server.config.loading import load_settings
    from server.container import open_runtime

    written = write_knowledge_base(kb, chunks)
    runtime = open_runtime(load_settings(None, data_dir=data), embedder=embedder)
    size = len(chunks)
    last = [0.0]

    def progress(done: int, total: int, _: str) -> None:
        if time.perf_counter() - last[0] > 30 or done == total:
            last[0] = time.perf_counter()
            clock(f"  {label} ingest to {size}: {done}/{total} new chunks")

    try:
        started = time.perf_counter()
        report = runtime.ingestor().run(kb, progress=progress)
        seconds = time.perf_counter() - started
        # Let the index build finish before closing, so the server opens an indexed collection.
        ready = wait_until_indexed(runtime.store, seed=size)
        clock(f"  index ready after {ready['seconds']} s: {ready['batches_ms']} ms/search")
    finally:
        runtime.close()
    if report.failed:
        raise RuntimeError(f"synthetic documents failed to ingest: {report.failed[:3]}")
    return {
        "size": size,
        "files_written": written,
        "new_chunks": report.embedded,
        "seconds": round(seconds, 2),
        "chunks_per_s": round(report.embedded / seconds, 1) if report.embedded else None,
        "index_wait": ready,
    }


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def _cold_starts(
    data: Path, queries: Any, work: Path, *, size: int, quick: bool, clock: Clock
) -> dict[str, Any]:
    """Cold starts of a serving process on a copy of data, then lookups for its peak RSS."""
    cold_dir = work / "cold"
    shutil.rmtree(cold_dir, ignore_errors=True)
    shutil.copytree(data, cold_dir)
    starts = 2 if quick else 5
    rss_queries = 20 if quick else 100
    clock(f"cold starts at {size} chunks ({starts} starts, then {rss_queries} lookups for peak RSS)")
    try:
        return cold_start(
            cold_dir,
            take(queries, starts + rss_queries),
            starts=starts,
            rss_queries=rss_queries,
            log_path=work / "serve-stderr.log",
        )
    finally:
        shutil.rmtree(cold_dir, ignore_errors=True)


def _measure_at(
    kind: str,
    size: int,
    items: list[SyntheticChunk],
    data: Path,
    embedder: Any,
    queries: Any,
    args: argparse.Namespace,
    samples: dict[str, int],
    clock: Clock,
    *,
    profile_path: Path | None,
) -> dict[str, Any]:
    """Lookups over one ingested size; with a profile (the reference size) also the log-off what-if."""
    from server.config.loading import load_settings

    rounds = samples["rounds"]
    governance = short_path_governance()
    settings = load_settings(None, data_dir=data, governance=governance)
    rng = random.Random(f"{args.seed}:repeat:{kind}:{size}")
    # Exact (identifier) lookups for the repeated and blocked paths, spread over the corpus.
    repeat_items = [items[i] for i in rng.sample(range(size), rounds * (4 if args.quick else 10))]
    bench = LookupBench(settings, embedder, queries, size)
    clock(f"{kind} lookups at {size} chunks")
    measured = asyncio.run(
        bench.run(
            rounds=rounds,
            per_round=samples["per_round"],
            warmup=samples["warmup"],
            repeat_items=repeat_items,
            profile_path=profile_path,
            profile_queries=20 if args.quick else 60,
        )
    )
    if profile_path is not None:
        # What-if, same run: the short paths with the invocation log off, to show its share.
        clock(f"repeated and blocked paths at {size} chunks with the invocation log off")
        no_log = load_settings(None, data_dir=data, log={"enabled": False}, governance=governance)
        bench_no_log = LookupBench(no_log, embedder, queries, size)
        measured["repeat_and_blocked_log_off"] = asyncio.run(
            bench_no_log.run_short_paths(rounds=rounds, repeat_items=repeat_items)
        )
    return measured


def _lookups(
    kind: str,
    sizes: list[int],
    chunks_of: Any,
    ingest_embedder: Any,
    embedder: Any,
    args: argparse.Namespace,
    results: dict[str, Any],
    results_dir: Path,
    clock: Clock,
    *,
    reference: int | None,
) -> None:
    """Build one corpus size by size and measure lookups at each; at reference also profile and cold start."""
    work: Path = args.work_dir
    kb, data = work / f"kb-{kind}", work / f"data-{kind}"
    queries = fresh_queries(seed=args.seed, domains=args.domains)
    results[f"ingest_steps_{kind}"] = []
    results[f"lookup_{kind}"] = {}
    for size in sizes:
        clock(f"{kind} corpus to {size} chunks")
        items = chunks_of(size)
        step = _ingest_step(kb, data, ingest_embedder, items, clock, kind)
        results[f"ingest_steps_{kind}"].append(step)
        clock(f"  ingested {step['new_chunks']} new chunks in {step['seconds']} s")
        at_reference = size == reference
        profile_path = results_dir / "profile-lookup.txt" if at_reference else None
        measured = _measure_at(
            kind,
            size,
            items,
            data,
            embedder,
            queries,
            args,
            results["samples"],
            clock,
            profile_path=profile_path,
        )
        if "profile" in measured:
            results["profile"] = measured.pop("profile")
            results["profile"]["path"] = os.path.relpath(results["profile"]["path"], ROOT)
        results[f"lookup_{kind}"][str(size)] = measured
        _write_json(results_dir / f"lookup-{kind}-{size}.json", measured)

        if at_reference and not args.skip_cold_start:
            results["cold_start"] = _cold_starts(
                data, queries, work, size=size, quick=args.quick, clock=clock
            )
            _write_json(results_dir / "coldstart.json", results["cold_start"])


def _render_only(args: argparse.Namespace) -> int:
    """Regenerate the docs page from a finished run's JSON, measuring nothing."""
    results_dir = args.results_dir or ROOT / "bench" / "results"
    results = _load_results(results_dir)
    docs_path = args.docs or ROOT / "docs" / "benchmarks.md"
    docs_path.write_text(render(results, evaluate(results)), encoding="utf-8")
    log(f"wrote {docs_path} from {results_dir}")
    return 0


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    """The sizes and samples of this run, from the flags (checked before anything is deleted)."""
    quick = args.quick
    sizes = _sizes(args.sizes or ("300,1000" if quick else "1000,10000"), "--sizes")
    short_sizes = _sizes(args.short_sizes or ("0" if quick else "1000"), "--short-sizes")
    reference = args.reference_size or (10000 if 10000 in sizes else sizes[-1])
    if reference not in sizes:
        raise SystemExit(f"error: --reference-size {reference} is not one of --sizes {sizes}")
    return {
        "sizes_realistic": sizes,
        "sizes_short": short_sizes,
        "reference_size": reference,
        "quick": quick,
        "samples": {
            "rounds": args.rounds or (3 if quick else 5),
            "per_round": args.per_round or (12 if quick else 40),
            "warmup": 5 if quick else 20,
        },
    }


def _describe_corpora(
    results: dict[str, Any], args: argparse.Namespace, embedder: Any, settings: Any
) -> tuple[list[str], list[int]]:
    """The sample knowledge base's chunk lengths and the short corpus's; the sample's texts and lengths."""
    from server.container import chunking_rule

    rule = chunking_rule(settings, embedder)
    count_tokens = embedder.count_tokens
    sample_texts = embedded_texts(SAMPLE_KB, rule)
    lengths = sorted(count_tokens(t) for t in sample_texts)
    results["sample_kb"] = {
        "documents": sum(1 for _ in SAMPLE_KB.rglob("*") if _.is_file()),
        "chunks": len(lengths),
        "mean_tokens": round(statistics.mean(lengths), 1),
        "median_tokens": statistics.median(lengths),
        "max_tokens": max(lengths),
        "max_tokens_setting": settings.chunking.max_tokens,
    }
    short_sample = corpus(500, seed=args.seed, domains=args.domains)
    results["corpus"] = {
        "seed": args.seed,
        "domains": args.domains,
        "short_mean_tokens": round(statistics.mean(count_tokens(c.text) for c in short_sample), 1),
        "zh_share": round(sum(c.language == "zh" for c in short_sample) / len(short_sample), 2),
    }
    return sample_texts, lengths


def _ingest_ratios(
    args: argparse.Namespace, embedder: Any, lengths: list[int], clock: Clock
) -> dict[str, Any]:
    """Fresh ingests against embed-only: the sample, Chinese and English at its lengths, short chunks."""
    quick, work = args.quick, args.work_dir
    ingest: dict[str, Any] = {}
    clock(f"sample knowledge base: fresh ingest against embed-only ({1 if quick else 3} runs)")
    ingest["sample"] = ingest_ratio(SAMPLE_KB, work, embedder, runs=1 if quick else 3, label="sample")
    per_language = 30 if quick else 60
    for language in ("zh", "en"):
        kb = work / f"ratio-kb-{language}"
        chunks = realistic_corpus(
            per_language,
            lengths,
            embedder.count_tokens,
            seed=args.seed,
            domains=args.domains,
            language=language,
        )
        write_knowledge_base(kb, chunks)
        clock(
            f"{per_language} synthetic {language} chunks of the sample's lengths: ingest against embed-only"
        )
        ingest[language] = ingest_ratio(kb, work, embedder, runs=1, label=language)
    short_kb = work / "ratio-kb-short"
    write_knowledge_base(short_kb, corpus(150 if quick else 500, seed=args.seed, domains=args.domains))
    clock("short chunks: ingest against embed-only")
    ingest["short"] = ingest_ratio(short_kb, work, embedder, runs=2, label="short")
    return ingest


def _ingest_benches(
    results: dict[str, Any],
    args: argparse.Namespace,
    embedder: Any,
    settings: Any,
    results_dir: Path,
    clock: Clock,
) -> list[int]:
    """The embedder profile, incremental embedding, ingest ratios and conversion; the sample's lengths."""
    quick, work = args.quick, args.work_dir
    sample_texts, lengths = _describe_corpora(results, args, embedder, settings)
    batch = settings.embedder.batch_size * 4

    clock("embedder profile at realistic lengths")
    results["embedder"] = embed_profile.measure(embedder.inner._model, embedder, sample_texts, batch=batch)
    _write_json(results_dir / "embedder.json", results["embedder"])

    clock("incremental: one part of the 12-part handbook edited")
    results["incremental"] = incremental_bench.measure(work, embedder)
    _write_json(results_dir / "incremental.json", results["incremental"])

    results["ingest"] = _ingest_ratios(args, embedder, lengths, clock)
    _write_json(results_dir / "ingest.json", results["ingest"])

    clock("HTML, PDF, Word and PowerPoint: conversion against embedding, and its share of a mixed ingest")
    results["conversion"] = conversion_bench.measure(
        work, embedder, per_format_files=4 if quick else 12, runs=1 if quick else 3
    )
    _write_json(results_dir / "conversion.json", results["conversion"])
    return lengths


def _serving_benches(
    results: dict[str, Any], args: argparse.Namespace, embedder: Any, results_dir: Path, clock: Clock
) -> None:
    """The invocation-log write, the governance replay and the web console on a long log."""
    quick, work = args.quick, args.work_dir
    clock("invocation-log write: durability modes, aiosqlite against plain sqlite3")
    results["log_commit"] = log_bench.measure(work, rounds=3 if quick else 5, per_round=20 if quick else 40)
    _write_json(results_dir / "log-commit.json", results["log_commit"])

    clock("governance replay")
    results["governance"] = governance_bench.measure(work, embedder)
    _write_json(results_dir / "governance.json", results["governance"])

    clock("web console on a long log")
    results["console"] = console_bench.measure(
        work,
        embedder,
        rows=10_000 if quick else 100_000,
        per_page=3 if quick else 10,
        lookups=12 if quick else console_bench.LOOKUPS,
    )
    _write_json(results_dir / "console.json", results["console"])


def _finish(results: dict[str, Any], results_dir: Path, docs: Path | None, clock: Clock) -> None:
    """Judge the targets, write summary.json and the docs page, and log the verdicts."""
    results["load"]["end"] = machine.load_average()
    results["total_seconds"] = round(time.perf_counter() - clock.started, 1)
    targets = evaluate(results)
    results["targets"] = targets
    _write_json(
        results_dir / "summary.json", {k: v for k, v in results.items() if not k.startswith("lookup_")}
    )
    if docs is not None:
        docs.parent.mkdir(parents=True, exist_ok=True)
        docs.write_text(render(results, targets), encoding="utf-8")
        clock(f"wrote {docs}")
    for row in targets:
        log(f"  {row['measure']}: {row['value']} (target {row['target']}) -> {row['met']}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quick = args.quick
    if args.render_only:
        return _render_only(args)
    plan = _plan(args)
    # A smoke run's figures are not results: they stay out of the tree.
    results_dir = args.results_dir or (
        ROOT / ".data" / "bench-quick" if quick else ROOT / "bench" / "results"
    )
    docs = args.docs or (None if quick else ROOT / "docs" / "benchmarks.md")
    work: Path = args.work_dir
    if work.exists() and not args.reuse_work:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)

    clock = Clock()
    results: dict[str, Any] = {
        "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine.describe(),
        "load": {"start": machine.load_average()},
        **plan,
    }
    sizes, samples = plan["sizes_realistic"], plan["samples"]
    clock(
        f"benchmarks: sizes {sizes} (short {plan['sizes_short']}), reference {plan['reference_size']}, "
        f"{samples['rounds']} rounds x {samples['per_round']}"
    )

    from retrieval.embedders import create_embedder
    from server.config.loading import load_settings

    # What the server loads: e5-small with the language means removed.
    embedder: Any = create_embedder("e5-small")
    settings = load_settings(None, data_dir=work / "unused")
    lengths = _ingest_benches(results, args, embedder, settings, results_dir, clock)

    def realistic(size: int) -> list[SyntheticChunk]:
        return realistic_corpus(size, lengths, embedder.count_tokens, seed=args.seed, domains=args.domains)

    def short(size: int) -> list[SyntheticChunk]:
        return corpus(size, seed=args.seed, domains=args.domains)

    reference = plan["reference_size"]
    shared = (args, results, results_dir, clock)
    _lookups("realistic", sizes, realistic, HeadEmbedder(embedder), embedder, *shared, reference=reference)
    _lookups("short", plan["sizes_short"], short, embedder, embedder, *shared, reference=None)
    _serving_benches(results, args, embedder, results_dir, clock)
    _finish(results, results_dir, docs, clock)
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    clock("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
