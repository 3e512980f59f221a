"""The grade step of a lookup: rank the evidence, compute the features, decide the tier.

Pure, apart from the cache of recent grades the service keeps. A targeted lookup is graded twice,
by its dimension and by its topic, and answered from the one that stays in the topic.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from retrieval.engine import Evidence, KnowledgeView
from retrieval.models import Tier
from retrieval.precise import at_most_reference, precise_doc, unseen_names
from retrieval.ranking import RankedDoc, features, rank
from retrieval.relevance import TierModel, grade

# A targeted lookup's dimension is ranked alone only when its best document is among this many
# of the topic's (query and dimension together). On targeted follow-ups for the four evaluation
# sets (scripts/targeted_followups.py: 36 short dimensions, 301 that are whole questions), the
# answer was in the content for 32 and 206 with 5, 32 and 224 ranked by the dimension alone,
# 30 and 191 with 3, 33 and 217 with 10; 0 and 2 ranked by the query alone. Chosen on answers
# alone, leave one set out, the dimension alone wins on every set (held out: 32 and 224). The
# guard costs whole questions, which stand on their own, and no short dimension; it is kept for
# generic dimensions: of 6 probes on the sample base ("示例", "more details"), it kept 3 in
# their topic, the dimension alone none, sending them to unrelated documents as HIGHLY_RELEVANT.
_TOPIC_DEPTH = 5


@dataclass(frozen=True)
class Graded:
    """The ranked candidates of one query and their tier, before memory and governance."""

    tier: Tier
    ranked: tuple[RankedDoc, ...]
    precise: str | None
    features: dict[str, float]
    codes: dict[str, tuple[str, ...]]  # doc_key -> the codes the query named in it
    l0_docs: tuple[str, ...]
    l0_titles: list[str]
    cosines: tuple[float, ...]


def grade_evidence(evidence: Evidence, view: KnowledgeView, model: TierModel) -> Graded:
    """Rank, compute features and grade; NO_MATCH keeps no candidates."""
    ranked = [
        d
        for d in rank(
            evidence,
            model.cross_language_offset,
            model.lexical_weight,
            model.sparse_weight,
            model.rerank_weight,
        )
        if d.doc_key in view.entries
    ]
    feats = features(evidence, ranked)
    # Read once: both the PRECISE rules and the HIGHLY_RELEVANT cap veto on it.
    names = unseen_names(evidence)
    precise = precise_doc(evidence, ranked, feats, model, view.entries, names)
    # Nothing ranked is NO_MATCH whatever the model says of all-zero features (a zero background
    # score reads as far from the background, which the on-topic model counts for the question).
    tier = grade(feats, model, precise=precise is not None) if ranked else Tier.NO_MATCH
    tier = at_most_reference(tier, names)
    if precise is not None:
        ranked.sort(key=lambda d: d.doc_key != precise)
    codes: dict[str, list[str]] = {}
    for hit in evidence.l0:
        if hit.kind == "code":
            codes.setdefault(hit.doc_key, []).append(hit.term)
    l0_docs = tuple(sorted({h.doc_key for h in evidence.l0 if h.doc_key in view.entries}))
    return Graded(
        tier=tier,
        ranked=tuple(ranked),
        precise=precise,
        features=feats,
        codes={k: tuple(v) for k, v in codes.items()},
        l0_docs=l0_docs,
        l0_titles=[view.entries[k].title for k in l0_docs],
        cosines=tuple(h.cosine for h in evidence.dense),
    )


class GradeCache:
    """The grades of recent evidence, for the current view, per tier model.

    Agents repeat identical calls; the engine already keeps their evidence, and this keeps the
    ranking of it (about 1 ms at 10k chunks), so a repeat costs only the plan and the accounting.
    Keys are identities, checked on a hit: a reloaded tier model grades afresh. A new view
    (another catalog generation) empties the cache, which holds no view: a replaced view, with
    its chunk map and postings, is freed as soon as the lookups using it end.
    """

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._generation: int | None = None
        self._items: OrderedDict[tuple[int, int], tuple[Evidence, TierModel, Graded]] = OrderedDict()

    def grade(self, evidence: Evidence, view: KnowledgeView, model: TierModel) -> Graded:
        if view.generation != self._generation:
            self._items.clear()
            self._generation = view.generation
        key = (id(evidence), id(model))
        hit = self._items.get(key)
        if hit is not None and hit[0] is evidence and hit[1] is model:
            self._items.move_to_end(key)
            return hit[2]
        graded = grade_evidence(evidence, view, model)
        self._items[key] = (evidence, model, graded)
        if len(self._items) > self._size:
            self._items.popitem(last=False)
        return graded

    def grade_lookup(
        self, evidence: Evidence, topic: Evidence | None, view: KnowledgeView, model: TierModel
    ) -> Graded:
        """The grade a lookup is answered from; ``topic`` is a targeted lookup's query and dimension.

        A targeted lookup is ranked by its dimension while the dimension's best document stays in
        the topic; a dimension that matches nothing, or only elsewhere ("more details" names no
        topic), is ranked together with the query.
        """
        graded = self.grade(evidence, view, model)
        if topic is None:
            return graded
        around = self.grade(topic, view, model)
        return graded if _within_topic(graded, around) else around


def _within_topic(graded: Graded, topic: Graded) -> bool:
    """Whether a targeted lookup's dimension found a document that its topic ranks near the top."""
    if graded.tier is Tier.NO_MATCH or not graded.ranked:
        return False
    return graded.ranked[0].doc_key in {d.doc_key for d in topic.ranked[:_TOPIC_DEPTH]}
