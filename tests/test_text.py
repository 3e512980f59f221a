"""The shared text rules: identifiers, lexical terms, languages."""

from __future__ import annotations

from storage.text import (
    code_label,
    defined_codes,
    document_codes,
    identifiers,
    short_codes,
    standalone_letters,
    terms,
    text_language,
)


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


def test_a_document_defines_short_codes_in_table_cells_headings_and_list_leads() -> None:
    text = (
        "| Class | Meaning |\n|---|---|\n| BR-3 | Sensitive data |\n| **PR-A** | Access request |\n"
        "| 1 | a number |\n| Wi-Fi | a word |\n"
        "## IMM-E217 nozzle temperature\n### Thresholds\n"
        "- `C5`: toxic solvents\n- TK-MIN-01: parent request\n"
        "Escalate S2 and T-1 incidents here, as BR-4 ones."
    )
    assert defined_codes(text) == ["BR-3", "PR-A", "IMM-E217", "C5", "TK-MIN-01"]
    assert short_codes(text) == ["BR-3", "PR-A", "C5"]
    assert identifiers(text) == ["IMM-E217", "TK-MIN-01"]  # running text keeps the 4-character floor


def test_a_code_label_is_upper_case_with_a_digit_or_a_separator() -> None:
    assert [code_label(t) for t in ("BR-3", " `S2` ", "PR-A", "ERR_SCAN")] == [
        "BR-3",
        "S2",
        "PR-A",
        "ERR_SCAN",
    ]
    assert [code_label(t) for t in ("br-3", "API", "Q&A", "2024-01", "X", "Wi-Fi")] == [None] * 6


def test_a_letters_only_label_is_defined_by_a_table_row_a_list_lead_or_its_own_heading() -> None:
    """Two to eight capitals: claim statuses (HD, SB) and damage codes (ZP) are two letters long."""
    table = (
        "| Code | Name |\n|---|---|\n| BAR | Best available rate |\n| NRF | Non-refundable |\n"
        "| HD | On hold |\n"
    )
    assert defined_codes(table) == ["BAR", "NRF", "HD"]
    assert short_codes(table) == ["BAR", "NRF", "HD"]
    listed = "- **STAFF**: employee rate\n- `DND`: do not disturb\n- OOO: out of order\n"
    assert defined_codes(listed) == ["STAFF", "DND", "OOO"]
    assert defined_codes("## NRF: non-refundable\n### LCM — member rate\n") == ["NRF", "LCM"]


def test_an_acronym_in_prose_a_header_row_a_topic_heading_or_keywords_is_no_code() -> None:
    text = (
        "| VPN | Owner |\n|---|---|\n| Remote access | IT |\n"
        "## API keys\n## FAQ\nSend the PDF to the CEO over the VPN.\n- Use the VPN abroad.\n"
        "| Ab | two letters, not capitals |\n- A: the answer to a FAQ\n## B\n"
    )
    assert defined_codes(text) == []
    assert identifiers(text) == []
    assert document_codes("Remote access", ["VPN", "PDF", "BR-3"], text) == ["BR-3"]


def test_a_longer_label_running_text_misses_is_no_defined_code() -> None:
    """W805 and PA66 in a table's first column: a code or a material grade, the shape cannot tell."""
    table = "| Code | Meaning |\n|---|---|\n| W805 | Photo location mismatch |\n| PA66 | 80 °C |\n"
    assert defined_codes(table) == ["W805", "PA66"]
    assert short_codes(table) == []
    assert document_codes("System error codes", [], table) == []


def test_a_one_letter_status_is_defined_in_a_table_body_row_or_a_bold_list_lead() -> None:
    statuses = (
        "| Letter | Status |\n|---|---|\n| A | Available |\n| M | Missing |\n- **W** – in the workshop\n"
    )
    assert defined_codes(statuses) == ["A", "M", "W"]
    assert short_codes(statuses) == ["A", "M", "W"]
    # Not a header row, a plain list lead (the "A:" of a FAQ) or a heading.
    assert defined_codes("| W | Meaning |\n|---|---|\n- A: yes\n- Q: no\n## B\n## C: third\n") == []


def test_a_query_names_a_one_letter_label_only_where_it_stands_apart() -> None:
    assert standalone_letters("实名制里状态是F 为啥闸机进不去") == {"F"}
    assert standalone_letters("设备状态板上这台拖车标的是 W，是什么意思") == {"W"}
    assert standalone_letters("item status M in koha means?") == {"M"}
    # A sentence's first letter and the pronoun are words; so is a letter inside a word or code.
    assert standalone_letters("A patron lost a book. I paid for plan B") == {"B"}
    assert standalone_letters("is plan A ready? X-RAY or W805") == {"A"}
