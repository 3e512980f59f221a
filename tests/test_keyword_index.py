"""L0 exact matching: identifiers on token boundaries, case-insensitive; CJK as substrings."""

from __future__ import annotations

from storage.keyword_index import KeywordEntry, KeywordIndex, L0Hit


def _docs(hits: list[L0Hit]) -> list[str]:
    return sorted({h.doc_key for h in hits})


def _index() -> KeywordIndex:
    return KeywordIndex(
        [
            KeywordEntry("e/timeout.md", "error-codes", "ERR_TIMEOUT 超时错误", ("ERR_TIMEOUT", "超时错误")),
            KeywordEntry("e/pay.md", "error-codes", "Payment errors", ("PAY_E1042", "card declined")),
            KeywordEntry("i/pool.md", "infrastructure", "HikariCP 连接池配置", ("HikariCP", "连接池")),
            KeywordEntry("i/exhaust.md", "infrastructure", "Pool exhaustion", ("连接池耗尽",)),
        ]
    )


def test_identifier_matches_case_insensitively() -> None:
    assert _docs(_index().match("what does err_timeout mean")) == ["e/timeout.md"]
    assert _docs(_index().match("PAY_E1042?")) == ["e/pay.md"]


def test_identifier_does_not_match_inside_a_longer_token() -> None:
    assert _docs(_index().match("ERR_TIMEOUT_X and XERR_TIMEOUT")) == []
    assert _docs(_index().match("PAY_E10423")) == []


def test_multi_word_latin_keyword_matches_as_a_phrase() -> None:
    assert _docs(_index().match("my card declined today")) == ["e/pay.md"]
    assert _docs(_index().match("declined card")) == []


def test_cjk_keywords_match_as_substrings() -> None:
    assert _docs(_index().match("ERR_TIMEOUT 是什么")) == ["e/timeout.md"]
    assert _docs(_index().match("数据库连接池怎么配置")) == ["i/pool.md"]
    assert _docs(_index().match("连接池耗尽怎么排查")) == ["i/exhaust.md", "i/pool.md"]


def test_title_and_identifiers_in_titles_match() -> None:
    assert _docs(_index().match("hikaricp 连接池配置")) == ["i/pool.md"]


def test_domain_filter_restricts_matches() -> None:
    assert _docs(_index().match("ERR_TIMEOUT HikariCP", domain="infrastructure")) == ["i/pool.md"]


def test_nothing_matches_an_unrelated_query() -> None:
    assert _docs(_index().match("how do I bake bread")) == []


def test_codes_in_the_body_are_exact_matches_of_kind_code() -> None:
    index = KeywordIndex(
        [
            KeywordEntry(
                "ops/handbook.md", "ops", "Operations handbook", (), ("KAFKA_E503_REBALANCE", "HTTP 504")
            ),
            KeywordEntry("ops/other.md", "ops", "Other", (), ("HTTP 504",)),
        ]
    )
    hits = index.match("what does kafka_e503_rebalance mean")
    assert [(h.doc_key, h.kind) for h in hits] == [("ops/handbook.md", "code")]
    assert _docs(index.match("gateway returned HTTP 504")) == ["ops/handbook.md", "ops/other.md"]


def test_a_letters_only_code_matches_only_written_in_capitals() -> None:
    rates = KeywordIndex([KeywordEntry("r/rates.md", "revenue", "Rate codes", (), ("NRF", "PKG-BB"))])
    assert rates.match("Guest booked NRF, can he move?") == [L0Hit("r/rates.md", "code", "NRF")]
    assert rates.match("is nrf refundable? and Nrf?") == []
    assert rates.match("what is pkg-bb") == [L0Hit("r/rates.md", "code", "PKG-BB")]


def test_a_one_letter_code_matches_only_standing_apart_in_capitals() -> None:
    board = KeywordIndex([KeywordEntry("e/board.md", "equipment", "Status board", (), ("W", "U"))])
    assert board.match("拖车标的是 W，是什么意思") == [L0Hit("e/board.md", "code", "W")]
    assert board.match("tug marked W on the board") == [L0Hit("e/board.md", "code", "W")]
    # Lower case, a sentence's first letter, or part of a longer word: no match.
    assert board.match("tug marked w on the board") == []
    assert board.match("U can see it. W is") == []
    assert board.match("W805 on the tug") == []
