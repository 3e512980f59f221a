"""What a tier model does on one knowledge base's questions, as a fresh agent would see it.

The figures docs/relevance.md quotes: codes PRECISE, delivery, answer in the content, false
NO_MATCH, HIGHLY_RELEVANT precision and how the off-topic questions are graded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from retrieval.calibration_sets import KnowledgeBase, LabelledQuery
from retrieval.governance import GovernanceConfig
from retrieval.grade import Graded, grade_evidence
from retrieval.models import Tier
from retrieval.plan import plan_answer
from retrieval.relevance import TierModel
from retrieval.requests import LookupRequest, Policy


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
