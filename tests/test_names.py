"""Names a query writes that the knowledge base lacks beyond its unseen terms (retrieval.names)."""

from __future__ import annotations

from retrieval.names import names_beside_terms
from storage.keyword_index import KeywordEntry, KeywordIndex

CONDUCT = KeywordIndex(
    [
        KeywordEntry(
            "ops/conduct.md", "ops", "Patron conduct", (), ("PC-1", "PC-2", "PC-3", "P0", "P1", "TE-V")
        )
    ]
)
COMMON = frozenset({"recommend", "how", "what"})


def test_a_leading_capitalised_word_no_chunk_holds_is_a_name_unless_generic_questions_use_it() -> None:
    assert names_beside_terms("Potain crane anti-collision zone settings", {"potain"}, CONDUCT, COMMON) == (
        "potain",
    )
    # English capitalises a question's first word: one the background questions use is no name.
    assert names_beside_terms("Recommend a good novel", {"recommend", "novel"}, CONDUCT, COMMON) == ()
    # In a Chinese question a Latin word is written as it is spelt.
    assert names_beside_terms("Recommend 这个怎么用", {"recommend"}, CONDUCT, COMMON) == ("recommend",)
    # Held by some chunk, or in lower case: no name.
    assert names_beside_terms("Crane zones", set(), CONDUCT, COMMON) == ()
    assert names_beside_terms("potain crane", {"potain"}, CONDUCT, COMMON) == ()


def test_a_short_code_outside_a_numbered_family_the_knowledge_base_defines_is_a_name() -> None:
    assert names_beside_terms("PC-5 incident what ban applies", set(), CONDUCT, COMMON) == ("pc-5",)
    assert names_beside_terms("P5 级别的工单", {"p5"}, CONDUCT, COMMON) == ("p5",)
    # A member of the family, a family it does not define, a code without a number, or one a
    # chunk's text holds (P2, a lexical term that is seen): no name.
    assert names_beside_terms("what ban applies after PC-2", set(), CONDUCT, COMMON) == ()
    assert names_beside_terms("what is GA-7", set(), CONDUCT, COMMON) == ()
    assert names_beside_terms("what is TE-P", set(), CONDUCT, COMMON) == ()
    assert names_beside_terms("P2 级别的工单", set(), CONDUCT, COMMON) == ()
