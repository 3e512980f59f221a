"""A place the question names and the knowledge base writes in neither script is an unseen name:
such a question is at most REFERENCE. Chinese has no capitals, so places are listed, and a name
counts only as a word of its own."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from retrieval.embedders import CachedEmbedder
from retrieval.engine import Evidence
from retrieval.models import Tier
from retrieval.places import PLACES, places_named, spellings
from retrieval.precise import at_most_reference, cjk_places, unseen_names
from server.container import open_runtime


def _frequency(*held: str) -> Callable[[str], int]:
    """How many chunks hold a term, for a knowledge base holding exactly ``held``."""
    return lambda term: int(term in held)


def _evidence(
    query: str, unseen: tuple[str, ...] = (), places: tuple[tuple[str, bool], ...] = ()
) -> Evidence:
    return Evidence(query, (), (), (), (), (), unseen=unseen, places=places)


def test_a_listed_place_counts_only_as_a_word_of_its_own() -> None:
    held = _frequency("东西", "安抚", "门的", "调大", "连接")
    assert places_named("补的时候能多送点东西安抚一下吗", held) == []  # 东西|安抚 holds 西安
    assert places_named("调大连接池会怎样", held) == []  # and 调大|连接 holds 大连
    assert places_named("厦门的备件库在哪", held) == ["厦门"]  # 的 ends a word whatever it is held in
    assert places_named("印度尼西亚的仓库", held) == ["印度尼西亚"]  # the longest name, not 印度
    # A Latin name is written capitalised, as a whole word.
    assert places_named("the Chengdu campus, then Turkey", held) == ["chengdu", "turkey"]
    assert places_named("roast turkey for the Chengduese", held) == []


def test_each_place_is_listed_once_per_spelling_with_both_scripts() -> None:
    assert len({zh for zh, _ in PLACES}) >= 150
    assert sorted(spellings("成都")) == sorted(spellings("chengdu")) == ["chengdu", "成都"]
    assert set(spellings("英国")) == {"英国", "britain", "uk"}


def test_a_place_the_knowledge_base_writes_in_neither_script_is_an_unseen_name() -> None:
    xiamen = _evidence("厦门的备件库在哪", places=(("厦门", False),))
    assert unseen_names(xiamen) == ["厦门"]
    assert at_most_reference(Tier.HIGHLY_RELEVANT, unseen_names(xiamen)) is Tier.REFERENCE
    # Written in the other script (成都 for Chengdu): the capitalised word is no unseen name.
    chengdu = _evidence("deposit per night at the Chengdu hotel", ("chengdu",), (("chengdu", True),))
    assert unseen_names(chengdu) == []
    assert unseen_names(_evidence("deposit at the Chengdu hotel", ("chengdu",))) == ["chengdu"]
    # China itself a Chinese team's knowledge base takes as read.
    assert unseen_names(_evidence("中国区的报销标准是什么", places=(("中国", False),))) == []


def test_an_unseen_compound_before_a_word_for_a_place_is_an_unseen_name() -> None:
    branch = _evidence("成都分公司的集中定损点在哪里", ("成都", "都分", "点在", "在哪"))
    assert cjk_places(branch) == ["成都"]
    assert at_most_reference(Tier.HIGHLY_RELEVANT, unseen_names(branch)) is Tier.REFERENCE
    # Function characters inside a name (首都) are kept; a leading one (在) is cut off.
    assert cjk_places(_evidence("在首都机场怎么走", ("在首", "首都", "都机"))) == ["首都"]
    # A name the knowledge base holds (南山) is none, nor is the company itself (来公司).
    assert cjk_places(_evidence("南山分公司在哪", ("山分",))) == []
    assert cjk_places(_evidence("市场监管局的人突然来公司了", ("人突", "突然", "然来", "来公"))) == []


def test_the_engine_marks_each_place_a_question_names_as_written_or_not(
    make_settings: Callable[..., Any], e5_embedder: CachedEmbedder
) -> None:
    """On the sample knowledge base, which names no city: a bigram it holds (调大, 连接) keeps a
    name from being read out of the words around it."""
    runtime = open_runtime(make_settings(), embedder=e5_embedder)
    try:
        shanghai = runtime.engine.retrieve("上海机房的 MySQL 最大连接数是多少", None)
        english = runtime.engine.retrieve("What is max_connections on the Shanghai MySQL servers?", None)
        pool = runtime.engine.retrieve("调大连接池会怎样", None)
    finally:
        runtime.close()
    assert shanghai.places == (("上海", False),) and "上海" in unseen_names(shanghai)
    assert english.places == (("shanghai", False),) and "shanghai" in unseen_names(english)
    assert pool.places == ()
