"""Numbers used as codes (storage.numeric_codes): defined by a table's first column or a keyword,
named by a query that writes one apart, not as a quantity."""

from __future__ import annotations

from storage.keyword_index import KeywordEntry, KeywordIndex, L0Hit
from storage.numeric_codes import defined_numbers, standalone_numbers
from storage.text import document_codes

FAULTS = (
    "| Code | Meaning |\n|---|---|\n| 4007 | Annual check overdue |\n| **5100** | PSAM failed |\n"
    "| 2023 | a year, not a code |\n"
)
STEPS = "| Step | Action |\n|---|---|\n| 1 | Stop |\n| 2 | Call |\n| 3 | Log |\n"


def test_a_table_of_codes_defines_its_numbers_and_a_numbered_list_of_steps_does_not() -> None:
    assert defined_numbers(FAULTS) == ["4007", "5100"]
    assert defined_numbers(STEPS) == []
    # Not a header row, nor a number in another column or in prose.
    assert defined_numbers("| 33 | Meaning |\n|---|---|\n| GE | 33 |\nDelay 39 applies.\n") == []
    assert defined_numbers("", keywords=["card reader", "5100"]) == ["5100"]
    assert document_codes("Reader faults", [], FAULTS) == ["4007", "5100"]


def test_a_query_writes_a_number_as_a_code_only_apart_and_not_as_a_quantity() -> None:
    assert standalone_numbers("终端代码19 发了之后调度会回电话吗") == {"19"}
    assert standalone_numbers("is that delay code 33 or 39?") == {"33", "39"}
    assert standalone_numbers("6108 地址") == {"6108"}
    for quantity in ("超过 30 分钟", "15天内", "costs ¥500", "wait 45 minutes", "gusts of 45 knots"):
        assert standalone_numbers(quantity) == set(), quantity
    for other in ("at 09:00 on 2024-05-01", "3.5 km", "2023 年的标准", "in 2023", "版本 10.2", "W805"):
        assert standalone_numbers(other) == set(), other


def test_a_number_matches_its_code_only_written_as_one() -> None:
    index = KeywordIndex([KeywordEntry("p/faults.md", "passenger", "Reader faults", (), ("4007", "5100"))])
    assert index.match("4007 on the reader, can the senior still ride?") == [
        L0Hit("p/faults.md", "code", "4007")
    ]
    assert index.match("refund of 4007 yuan") == []
    assert index.match("code 40071") == []
