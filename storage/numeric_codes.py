"""Numbers used as codes: those a document defines as one, and those a query writes as one.

Teams number codes too: a card reader's fault 5100, a delay code 33, a radio code 19, a branch
6108. A number is a code only where a document defines it as one: in the first cell of a
table's body row, when that column is not a count of the rows (1, 2, 3, ...), or among its
front-matter keywords. A query writes one only standing apart, not as a quantity (a unit after
it: "15 天", "30 minutes"; a currency before it), a time, a date, a decimal or a year.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

from storage.markdown import TABLE_DELIMITER_ROW, unquoted

_NUMBER = re.compile(r"\d{2,6}")
_TABLE_LINE = re.compile(r"\s*\|")
# A number in a query, apart from letters, digits and the marks of decimals, times and dates.
_IN_QUERY = re.compile(r"(?<![0-9A-Za-z_.,:/#+\-])\d{2,6}(?![0-9A-Za-z_.,:/%°\-])")
_CURRENCY_BEFORE = re.compile(r"(?:[¥$€£]|\b(?:RMB|CNY|USD|EUR|HKD))\s*$", re.IGNORECASE)
# What after a number makes it a quantity: a unit of money, time, age, count or measure.
_CJK_UNITS = "元块角分秒天日周月年岁次个人台辆件张份页层米度倍户笔万千百亿公小毫厘克斤吨升条%％"
_LATIN_UNIT = re.compile(
    r"\s*(?:days?|weeks?|months?|years?|yrs?|hours?|hrs?|h|mins?|minutes?|secs?|seconds?|ms|km|kg|g|"
    r"m|cm|mm|l|ml|knots?|kts?|mph|yuan|rmb|usd|people|persons?|times|pcs|percent|degrees?|kb|mb|gb|tb)\b",
    re.IGNORECASE,
)


def defined_numbers(body: str, keywords: Sequence[str] = ()) -> list[str]:
    """The numbers a document defines as codes: first cells of tables that do not count their
    rows, and front-matter keywords that are numbers."""
    found: dict[str, None] = {}
    for cells in _tables(body):
        if _counts_rows(cells):
            continue
        for cell in cells:
            if _NUMBER.fullmatch(cell) and not _year(cell):
                found.setdefault(cell, None)
    for keyword in keywords:
        if _NUMBER.fullmatch(keyword) and not _year(keyword):
            found.setdefault(keyword, None)
    return list(found)


def standalone_numbers(query: str) -> set[str]:
    """The numbers a query writes as codes: apart, and no quantity, time, date, decimal or year."""
    found = set()
    for match in _IN_QUERY.finditer(query):
        number = match.group(0)
        after = query[match.end() :]
        if _year(number) or _CURRENCY_BEFORE.search(query[: match.start()]):
            continue
        unit = after.lstrip()[:1]
        if (unit and unit in _CJK_UNITS) or _LATIN_UNIT.match(after):
            continue
        found.add(number)
    return found


def _tables(body: str) -> Iterator[list[str]]:
    """Each markdown table's body rows' first cells, unquoted (the header row left out)."""
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        if i + 1 < len(lines) and _TABLE_LINE.match(lines[i]) and TABLE_DELIMITER_ROW.fullmatch(lines[i + 1]):
            i += 2
            cells = []
            while i < len(lines) and _TABLE_LINE.match(lines[i]):
                first = lines[i].strip().strip("|").split("|", 1)[0]
                cells.append(unquoted(first))
                i += 1
            yield cells
        else:
            i += 1


def _counts_rows(cells: list[str]) -> bool:
    """Whether a table's first column numbers its rows 1, 2, 3, ... (a step, a rank, a count)."""
    return cells[:1] in (["1"], ["01"]) and all(c.isdigit() and int(c) == n for n, c in enumerate(cells, 1))


def _year(number: str) -> bool:
    return len(number) == 4 and 1900 <= int(number) <= 2099
