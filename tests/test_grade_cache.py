"""The grade cache: an identical repeat reuses the grade; any new input grades afresh."""

from __future__ import annotations

import weakref

from retrieval.engine import Evidence, KnowledgeView
from retrieval.grade import GradeCache
from retrieval.models import Tier
from server.config.loading import load_settings
from storage.keyword_index import KeywordIndex
from storage.lexical_index import LexicalIndex


def _evidence(query: str) -> Evidence:
    return Evidence(query, (), (), (), (), ())


def test_a_repeat_reuses_the_grade_and_a_new_model_view_or_evidence_does_not() -> None:
    model = load_settings(None).tier_model
    view = KnowledgeView(1, {}, KeywordIndex([]), {}, LexicalIndex([]))
    cache = GradeCache(size=2)
    evidence = _evidence("q")
    first = cache.grade(evidence, view, model)
    assert first.tier is Tier.NO_MATCH
    assert cache.grade(evidence, view, model) is first
    # Equal but not the same: a reloaded model, a new catalog view, a fresh retrieval.
    assert cache.grade(evidence, view, model.model_copy()) is not first
    assert (
        cache.grade(evidence, KnowledgeView(2, {}, KeywordIndex([]), {}, LexicalIndex([])), model)
        is not first
    )
    assert cache.grade(_evidence("q"), view, model) is not first


def test_the_cache_keeps_only_the_most_recent_grades() -> None:
    model = load_settings(None).tier_model
    view = KnowledgeView(1, {}, KeywordIndex([]), {}, LexicalIndex([]))
    cache = GradeCache(size=2)
    kept = [_evidence(f"q{i}") for i in range(3)]
    first = cache.grade(kept[0], view, model)
    cache.grade(kept[1], view, model)
    cache.grade(kept[2], view, model)
    assert cache.grade(kept[0], view, model) is not first


def test_a_new_view_empties_the_cache_which_keeps_no_view_alive() -> None:
    """A replaced view (its chunk map and postings) must be freed, not held by old grades."""
    model = load_settings(None).tier_model
    view = KnowledgeView(1, {}, KeywordIndex([]), {}, LexicalIndex([]))
    cache = GradeCache()
    evidence = _evidence("q")
    first = cache.grade(evidence, view, model)
    old = weakref.ref(view)
    del view
    newer = KnowledgeView(2, {}, KeywordIndex([]), {}, LexicalIndex([]))
    assert cache.grade(evidence, newer, model) is not first
    assert old() is None
