"""Fit the tier models on labelled questions, and measure them on knowledge bases held out from the fit.

A question file has one JSON object per line: ``{"query": ..., "doc": doc_key | null, "kind": ...,
"answer": ...}``. ``kind`` is code, paraphrase, cross, long, offtopic or near (offtopic and near
have no doc); ``answer`` is a short passage of the document that answers the question.

The figures docs/relevance.md quotes come from ``leave_one_out``: for each
knowledge base, the models are fitted on the others and scored on it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from retrieval.engine import Evidence, KnowledgeView
from retrieval.governance import GovernanceConfig
from retrieval.grade import Graded, grade_evidence
from retrieval.logistic import fit_logistic
from retrieval.models import Tier
from retrieval.plan import plan_answer
from retrieval.ranking import features, rank
from retrieval.relevance import DEFAULT_SUPPLEMENT_MARGIN, Logistic, TierModel
from retrieval.requests import LookupRequest, Policy
from storage.catalog import ChunkRecord

# The top_k a lookup gets when the agent names none: what a fresh agent is sent.
DEFAULT_TOP_K = LookupRequest("").top_k
KINDS = ("code", "paraphrase", "cross", "long", "offtopic", "near")
# The cross-language offsets tried, 0 to 0.1. Up to 0.03 the grid stopped short of what the
# ranking wanted: held out, the fits choose 0.04-0.06, which put 246 rather than 240 of 272
# answers in the top three (cross-language 53 -> 64 of 76, same-language paraphrases 162 -> 157
# of 170) and 189 rather than 187 first.
OFFSETS = tuple(i / 100 for i in range(11))
LEXICAL_WEIGHTS = (0.05, 0.1, 0.15, 0.2, 0.3)
# The query terms the knowledge base never names and the background of generic questions are
# evidence for the on-topic model (retrieval.ranking: unseen, unseen_name, background). Held out
# over the seven sets, with the three zones, far off-topic NO_MATCH went from 32 to 49 of 50 and
# near-domain HIGHLY_RELEVANT from 44 to 2 of 68 (docs/relevance.md).
ON_TOPIC_FEATURES = ("similarity", "support", "agree", "margin", "unseen", "unseen_name", "background")
TOP_RIGHT_FEATURES = ("margin", "gap", "similarity", "top_coverage", "agree", "top_unseen")
# The on-topic threshold keeps at least this share of answerable training questions above it:
# a false NO_MATCH loses knowledge the agent needed, a false REFERENCE costs it one read. Held
# out on the four evaluation sets, keeping 98% gave 8 of 340 false NO_MATCH (5 of 88 on one set)
# and 21 of 54 off-topic NO_MATCH; keeping every one gives 1 of 340 and 16 of 54.
ANSWERABLE_KEPT = 1.0


@dataclass(frozen=True)
class ZoneTargets:
    """What HIGHLY_RELEVANT must meet on the training questions; no far off-topic one may be graded so.

    - ``precision``: right this often, off-topic questions counted as wrong;
    - ``near``: at most this share of the near-domain questions (the domain, not its content);
    - ``background``: at most this share of the background questions.

    Chosen leave one set out on the five sets before the next two were scored (HR right of all
    HR, near-domain HR, held out): 0.90/0.20 gave 138/165 and 8/38, 0.92/0.10 100/114 and 4/38,
    0.95/0.10 86/96 and 5/38, 0.95/0.05 61/67 and 3/38, the only one at 90% and 10%. The rest
    go REFERENCE, which still sends the document and its neighbours.
    """

    precision: float = 0.95
    near: float = 0.05
    background: float = 0.005


# Candidate thresholds: quantiles of the answerable questions' probabilities, in this many steps.
_ZONE_STEPS = 61
# The kind of a background question in the training rows.
BACKGROUND = "background"


class CalibrationError(ValueError):
    """The question file is malformed; the message names the line."""


@dataclass(frozen=True)
class LabelledQuery:
    query: str
    doc: str | None
    kind: str = "paraphrase"
    answer: str | None = None

    @property
    def answerable(self) -> bool:
        return self.doc is not None


def read_queries(path: Path) -> list[LabelledQuery]:
    """Parse a question file, naming the line of any problem."""
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
        kind = item.get("kind") or ("paraphrase" if doc else "offtopic")
        if kind not in KINDS:
            raise CalibrationError(f"{path}:{number}: 'kind' must be one of {', '.join(KINDS)}")
        queries.append(LabelledQuery(item["query"], doc, kind, item.get("answer")))
    if not queries:
        raise CalibrationError(f"{path}: no queries")
    return queries


@dataclass(frozen=True)
class KnowledgeBase:
    """One ingested knowledge base with its questions and their evidence."""

    name: str
    view: KnowledgeView
    chunks: Mapping[str, list[ChunkRecord]]
    queries: Sequence[LabelledQuery]
    evidence: Sequence[Evidence]
    # The background questions (retrieval.background) asked of this knowledge base: negatives.
    background: Sequence[Evidence] = ()

    def chunks_of(self, doc_key: str) -> list[ChunkRecord]:
        return list(self.chunks.get(doc_key, []))


@dataclass
class Figures:
    """What one model does on one set of questions."""

    questions: int = 0
    codes: int = 0
    codes_precise: int = 0
    false_precise: int = 0
    answerable: int = 0  # paraphrase, cross and long
    hit_at_1: int = 0
    delivered: int = 0  # the right document is primary or a supplement
    documents_sent: int = 0  # documents sent for the answerable questions (what delivery costs)
    answer_in_content: int = 0  # the labelled answer is in the content the agent sees
    with_answer: int = 0
    false_no_match: int = 0  # over every answerable question, codes included
    all_answerable: int = 0
    offtopic: int = 0
    offtopic_no_match: int = 0
    far: int = 0  # off-topic questions of kind offtopic: far from every document
    far_no_match: int = 0
    far_highly_relevant: int = 0
    near: int = 0  # off-topic questions of kind near: the knowledge base's domain, not its content
    near_no_match: int = 0
    near_highly_relevant: int = 0
    highly_relevant: int = 0  # every question graded HIGHLY_RELEVANT, off-topic ones included
    highly_relevant_right: int = 0  # of them, those whose primary is the labelled document
    tiers: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, other: Figures) -> None:
        for name, value in vars(other).items():
            if isinstance(value, int):
                setattr(self, name, getattr(self, name) + value)
        for kind, counts in other.tiers.items():
            mine = self.tiers.setdefault(kind, {})
            for tier, count in counts.items():
                mine[tier] = mine.get(tier, 0) + count

    def as_dict(self) -> dict[str, object]:
        return {
            "questions": self.questions,
            "codes_precise": f"{self.codes_precise}/{self.codes}",
            "false_precise": self.false_precise,
            "hit_at_1": f"{self.hit_at_1}/{self.answerable}",
            "delivered": f"{self.delivered}/{self.answerable}",
            "delivered_share": round(self.delivered / self.answerable, 3) if self.answerable else None,
            "documents_per_answer": round(self.documents_sent / self.answerable, 2)
            if self.answerable
            else None,
            "answer_in_content": f"{self.answer_in_content}/{self.with_answer}",
            "false_no_match": f"{self.false_no_match}/{self.all_answerable}",
            "false_no_match_share": round(self.false_no_match / self.all_answerable, 3)
            if self.all_answerable
            else None,
            "offtopic_no_match": f"{self.offtopic_no_match}/{self.offtopic}",
            "hr_precision": f"{self.highly_relevant_right}/{self.highly_relevant}",
            "hr_precision_share": _share(self.highly_relevant_right, self.highly_relevant),
            "far_no_match": f"{self.far_no_match}/{self.far}",
            "near_no_match": f"{self.near_no_match}/{self.near}",
            "far_highly_relevant": f"{self.far_highly_relevant}/{self.far}",
            "near_highly_relevant": f"{self.near_highly_relevant}/{self.near}",
            "tiers": self.tiers,
        }


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 3) if whole else None


def evaluate(kb: KnowledgeBase, model: TierModel) -> Figures:
    """Run each question through grade and plan (no session), as a fresh agent would see it."""
    policy = Policy(tier_model=model, governance=GovernanceConfig(enabled=False))
    figures = Figures()
    for query, evidence in zip(kb.queries, kb.evidence, strict=True):
        graded = grade_evidence(evidence, kb.view, model)
        plan = plan_answer(
            graded, LookupRequest(query.query), None, kb.view, kb.chunks_of, policy, governed=False
        )
        documents = plan.documents(kb.view, policy)
        _count(
            figures,
            query,
            graded.tier,
            [d.doc_key for d in documents],
            [d.content for d in documents],
            graded,
        )
    return figures


def _count(
    figures: Figures,
    query: LabelledQuery,
    tier: Tier,
    delivered: list[str],
    contents: list[str],
    graded: Graded,
) -> None:
    figures.questions += 1
    counts = figures.tiers.setdefault(query.kind, {})
    counts[tier.value] = counts.get(tier.value, 0) + 1
    primary = delivered[0] if delivered else None
    if tier is Tier.PRECISE and primary != query.doc:
        figures.false_precise += 1
    if tier is Tier.HIGHLY_RELEVANT:
        figures.highly_relevant += 1
        figures.highly_relevant_right += query.answerable and primary == query.doc
    if not query.answerable:
        figures.offtopic += 1
        figures.offtopic_no_match += tier is Tier.NO_MATCH
        if query.kind == "near":
            figures.near += 1
            figures.near_no_match += tier is Tier.NO_MATCH
            figures.near_highly_relevant += tier is Tier.HIGHLY_RELEVANT
        else:
            figures.far += 1
            figures.far_no_match += tier is Tier.NO_MATCH
            figures.far_highly_relevant += tier is Tier.HIGHLY_RELEVANT
        return
    figures.all_answerable += 1
    figures.false_no_match += tier is Tier.NO_MATCH
    if query.kind == "code":
        figures.codes += 1
        figures.codes_precise += tier is Tier.PRECISE and primary == query.doc
        return
    figures.answerable += 1
    figures.hit_at_1 += bool(graded.ranked) and graded.ranked[0].doc_key == query.doc
    figures.delivered += query.doc in delivered
    figures.documents_sent += len(delivered)
    if query.answer:
        figures.with_answer += 1
        figures.answer_in_content += any(
            doc == query.doc and query.answer in content
            for doc, content in zip(delivered, contents, strict=True)
        )


def fit(bases: Sequence[KnowledgeBase], targets: ZoneTargets | None = None) -> TierModel:
    """The fusion that ranks best, then both logistic models and their three zones."""
    grid = [(o, w) for o in OFFSETS for w in LEXICAL_WEIGHTS]
    offset, weight = max(grid, key=lambda ow: (_ranking_hits(bases, *ow), -ow[0], -ow[1]))
    rows = _rows(bases, offset, weight)
    if not any(r.answerable for r in rows):
        raise CalibrationError("no answerable question: every question has doc null")
    on_model = _fit_or_constant([r.features for r in rows], [r.answerable for r in rows], ON_TOPIC_FEATURES)
    on_model = on_model.model_copy(
        update={
            "threshold": _keep_answerable(
                on_model.probability, [r.features for r in rows], [r.answerable for r in rows]
            )
        }
    )
    answerable = [r for r in rows if r.answerable and r.ranked]
    top_model = _fit_or_constant(
        [r.features for r in answerable], [r.right for r in answerable], TOP_RIGHT_FEATURES
    )
    confident, top_threshold = _zones(on_model, top_model, rows, targets or ZoneTargets())
    model = TierModel(
        on_topic=on_model,
        top_right=top_model.model_copy(update={"threshold": top_threshold}),
        confident=max(confident, on_model.threshold),
        cross_language_offset=offset,
        lexical_weight=weight,
    )
    return model.model_copy(update={"supplement_margin": _fit_supplement_margin(bases, model)})


@dataclass(frozen=True)
class _Row:
    """One training question's features and what it is: its kind, or background."""

    features: dict[str, float]
    kind: str
    answerable: bool
    right: bool  # answerable, and the first document is the labelled one
    ranked: bool  # anything was ranked at all


def _rows(bases: Sequence[KnowledgeBase], offset: float, weight: float) -> list[_Row]:
    rows = []
    for kb in bases:
        for query, evidence in zip(kb.queries, kb.evidence, strict=True):
            ranked = rank(evidence, offset, weight)
            right = query.answerable and bool(ranked) and ranked[0].doc_key == query.doc
            rows.append(_Row(features(evidence, ranked), query.kind, query.answerable, right, bool(ranked)))
        for evidence in kb.background:
            ranked = rank(evidence, offset, weight)
            rows.append(_Row(features(evidence, ranked), BACKGROUND, False, False, bool(ranked)))
    return rows


def _zones(
    on_model: Logistic, top_model: Logistic, rows: Sequence[_Row], targets: ZoneTargets
) -> tuple[float, float]:
    """The on-topic confidence and top-document threshold that allow the most right HIGHLY_RELEVANT.

    Subject to the targets on the training questions. (1.0, 1.0) when nothing meets them: then
    nothing is HIGHLY_RELEVANT.
    """
    p_on = np.array([on_model.probability(r.features) for r in rows])
    p_top = np.array([top_model.probability(r.features) for r in rows])
    kinds = np.array([r.kind for r in rows])
    right = np.array([r.right for r in rows])
    labelled, near, far = kinds != BACKGROUND, kinds == "near", kinds == "offtopic"
    background = kinds == BACKGROUND
    answerable = np.array([r.answerable for r in rows])
    steps = np.linspace(0, 1, _ZONE_STEPS)
    best: tuple[int, float, float] | None = None
    for c in np.unique(np.quantile(p_on[answerable], steps)):
        confident = (p_on >= max(c, on_model.threshold)) & labelled
        for t in np.unique(np.quantile(p_top[answerable], steps)):
            graded = confident & (p_top >= t)
            count = int(graded.sum())
            good = int((graded & right).sum())
            bg = int(((p_on >= max(c, on_model.threshold)) & (p_top >= t) & background).sum())
            if (
                not count
                or good < targets.precision * count
                or (graded & far).any()
                or (graded & near).sum() > targets.near * near.sum()
                or bg > targets.background * background.sum()
            ):
                continue
            if best is None or (good, -c, -t) > (best[0], -best[1], -best[2]):
                best = (good, float(c), float(t))
    if best is None:
        return 1.0, 1.0
    return round(best[1], 4), round(best[2], 4)


def _fit_supplement_margin(bases: Sequence[KnowledgeBase], model: TierModel) -> float:
    """The smallest margin that sends the answer with every HIGHLY_RELEVANT training question.

    Where such a question's first document is not the answer but the answer is among the other
    top_k, the answer goes as a supplement only if it scores within the margin. Covering every
    training case mirrors the NO_MATCH rule: a document left out is knowledge lost, one more
    document costs a read.
    """
    gaps = []
    for kb in bases:
        for query, evidence in zip(kb.queries, kb.evidence, strict=True):
            if not query.answerable or query.kind == "code":
                continue
            graded = grade_evidence(evidence, kb.view, model)
            keys = [d.doc_key for d in graded.ranked[:DEFAULT_TOP_K]]
            if graded.tier is Tier.HIGHLY_RELEVANT and query.doc in keys[1:]:
                gaps.append(graded.ranked[0].score - graded.ranked[keys.index(query.doc)].score)
    if not gaps:
        return DEFAULT_SUPPLEMENT_MARGIN
    return round(max(gaps) + 1e-4, 4)


def _fit_or_constant(
    rows: Sequence[Mapping[str, float]], labels: Sequence[bool], names: Sequence[str]
) -> Logistic:
    """A fitted model, or, when the questions show only one outcome, a constant one saying so.

    Small evaluation sets can have every top document right (or no off-topic question): there
    is nothing to separate, and the honest model is the observed rate.
    """
    if len(set(labels)) == 2:
        return fit_logistic(rows, labels, names)
    rate = (sum(labels) + 0.5) / (len(labels) + 1)
    return Logistic(weights={}, bias=round(math.log(rate / (1 - rate)), 4), threshold=0.5)


def _ranking_hits(bases: Sequence[KnowledgeBase], offset: float, weight: float) -> int:
    """Answerable questions whose document ranks first, plus those whose document is in the top 3."""
    hits = 0
    for kb in bases:
        for query, evidence in zip(kb.queries, kb.evidence, strict=True):
            if query.answerable and query.kind != "code":
                top = [d.doc_key for d in rank(evidence, offset, weight)[:3]]
                hits += (top[:1] == [query.doc]) + (query.doc in top)
    return hits


def _keep_answerable(
    probability: Callable[[Mapping[str, float]], float],
    rows: Sequence[Mapping[str, float]],
    labels: Sequence[bool],
) -> float:
    """The highest threshold that keeps ANSWERABLE_KEPT of the answerable questions above it."""
    scores = sorted(probability(r) for r, answerable in zip(rows, labels, strict=True) if answerable)
    cut = scores[int(len(scores) * (1 - ANSWERABLE_KEPT))]
    return round(max(cut - 1e-4, 0.0), 4)


@dataclass(frozen=True)
class HeldOut:
    name: str
    model: TierModel
    figures: Figures


def leave_one_out(bases: Sequence[KnowledgeBase], targets: ZoneTargets | None = None) -> list[HeldOut]:
    """For each knowledge base: fit on the others, score on it."""
    out = []
    for kb in bases:
        model = fit([other for other in bases if other is not kb], targets)
        out.append(HeldOut(kb.name, model, evaluate(kb, model)))
    return out
