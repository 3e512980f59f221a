"""Threshold calibration: hit@1, MRR and tier accuracy on labelled queries, and a grid search.

A line is ``{"query": ..., "doc": doc_key}`` or ``{"query": ..., "doc": null}`` (no answer).
The ideal tier of a line: NO_MATCH when it has no answer or the right document is not retrieved
at all; PRECISE when exactly one document matches exactly; HIGHLY_RELEVANT when the right
document ranks first; REFERENCE when it is retrieved but not first.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from retrieval.engine import Evidence
from retrieval.relevance import Thresholds, Tier, grade


class CalibrationError(ValueError):
    """The query file is malformed; the message names the line."""


@dataclass(frozen=True)
class LabelledQuery:
    query: str
    doc: str | None


@dataclass(frozen=True)
class Observation:
    query: LabelledQuery
    ranked: tuple[str, ...]
    l0: tuple[str, ...]
    top_similarity: float | None
    best_l0_similarity: float | None


def read_queries(path: Path) -> list[LabelledQuery]:
    queries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CalibrationError(f"{path}:{number}: not JSON: {exc.msg}") from exc
        if not isinstance(item, dict) or not isinstance(item.get("query"), str) or not item["query"].strip():
            raise CalibrationError(f"{path}:{number}: needs a non-empty string 'query'")
        doc = item.get("doc")
        if doc is not None and not isinstance(doc, str):
            raise CalibrationError(f"{path}:{number}: 'doc' must be a doc_key string or null")
        queries.append(LabelledQuery(item["query"], doc))
    if not queries:
        raise CalibrationError(f"{path}: no queries")
    return queries


def observe(query: LabelledQuery, evidence: Evidence) -> Observation:
    sims = dict(evidence.similarities)
    l0 = evidence.l0_doc_keys
    ranked = tuple(sorted(set(l0) | set(sims), key=lambda k: (k not in l0, -sims.get(k, 0.0), k)))
    l0_sims = [sims[k] for k in l0 if k in sims]
    top = evidence.similarities[0][1] if evidence.similarities else None
    return Observation(query, ranked, l0, top, max(l0_sims, default=None))


def ideal_tier(obs: Observation) -> Tier:
    if obs.query.doc is None or obs.query.doc not in obs.ranked:
        return Tier.NO_MATCH
    if len(obs.l0) == 1 and obs.l0[0] == obs.query.doc:
        return Tier.PRECISE
    return Tier.HIGHLY_RELEVANT if obs.ranked[0] == obs.query.doc else Tier.REFERENCE


def graded_tier(obs: Observation, thresholds: Thresholds) -> Tier:
    return grade(
        l0_match_count=len(obs.l0),
        best_l0_similarity=obs.best_l0_similarity,
        top_similarity=obs.top_similarity,
        thresholds=thresholds,
    )


@dataclass(frozen=True)
class Scores:
    hit_at_1: float
    mrr: float
    tier_accuracy: float
    confusion: dict[str, dict[str, int]]


def score(observations: Iterable[Observation], thresholds: Thresholds) -> Scores:
    obs = list(observations)
    answerable = [o for o in obs if o.query.doc is not None]
    hits = sum(1 for o in answerable if o.ranked and o.ranked[0] == o.query.doc)
    rr = sum(1 / (o.ranked.index(o.query.doc) + 1) for o in answerable if o.query.doc in o.ranked)
    pairs = Counter((ideal_tier(o).value, graded_tier(o, thresholds).value) for o in obs)
    confusion: dict[str, dict[str, int]] = {}
    for (ideal, got), count in sorted(pairs.items()):
        confusion.setdefault(ideal, {})[got] = count
    correct = sum(count for (ideal, got), count in pairs.items() if ideal == got)
    n = max(len(answerable), 1)
    return Scores(hits / n, rr / n, correct / max(len(obs), 1), confusion)


def propose(observations: list[Observation], *, step: float = 0.005) -> tuple[Thresholds, float]:
    """Grid-search the thresholds that maximise tier accuracy (ties: the higher, stricter pair)."""
    sims = [o.top_similarity for o in observations if o.top_similarity is not None]
    if not sims:
        raise CalibrationError("no query retrieved anything: ingest the knowledge base first")
    low = max(0.0, round(min(sims) - 0.05, 3))
    grid = [round(low + i * step, 4) for i in range(int((1.0 - low) / step) + 1)]
    best: tuple[float, float, float] = (-1.0, 0.0, 0.0)
    for ref in grid:
        for high in (h for h in grid if h >= ref):
            accuracy = score(observations, Thresholds(highly_relevant=high, reference=ref)).tier_accuracy
            if (accuracy, ref, high) > best:
                best = (accuracy, ref, high)
    return Thresholds(highly_relevant=best[2], reference=best[1]), best[0]


OFFSET_GRID: tuple[float, ...] = tuple(step / 100 for step in range(11))


def propose_all(
    queries: list[LabelledQuery], evidence: list[Evidence], *, offsets: tuple[float, ...] = OFFSET_GRID
) -> tuple[float, Thresholds, list[Observation]]:
    """The cross-language offset and thresholds that maximise tier accuracy (ties: higher MRR, smaller offset)."""
    best: tuple[float, float, float] | None = None
    chosen: tuple[float, Thresholds, list[Observation]] | None = None
    for offset in offsets:
        observations = [observe(q, e.rescored(offset)) for q, e in zip(queries, evidence, strict=True)]
        thresholds, accuracy = propose(observations)
        key = (accuracy, score(observations, thresholds).mrr, -offset)
        if best is None or key > best:
            best, chosen = key, (offset, thresholds, observations)
    if chosen is None:
        raise CalibrationError("no offsets to try")
    return chosen
