"""The shared text rules: identifiers, lexical terms, languages."""

from __future__ import annotations

from storage.text import identifiers, terms, text_language


def test_identifiers_are_code_shaped_tokens_in_any_case() -> None:
    text = "See KAFKA_E503_REBALANCE, kfk-4012, AL-1107 and HTTP 504 in the X-API-Key follow-up (UTF)."
    assert identifiers(text) == ["KAFKA_E503_REBALANCE", "KFK-4012", "AL-1107", "HTTP 504"]


def test_terms_keep_identifiers_whole_and_split_and_use_cjk_bigrams() -> None:
    found = terms("ERR_TIMEOUT 连接池 what is it")
    assert {"err_timeout", "err", "timeout", "连接", "接池"} <= set(found)
    assert "what" not in found and "is" not in found  # function words carry no topic


def test_chunk_language_is_mixed_only_when_neither_dominates() -> None:
    assert text_language("连接池的最大连接数设置为 CPU 核数的两倍") == "zh"
    assert text_language("The pool size should be twice the CPU count") == "en"
    assert text_language("连接池 pool size 设置 should be twice") == "mixed"
