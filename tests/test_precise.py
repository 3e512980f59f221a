"""PRECISE: which one document a query's code, title or specific keyword names."""

from __future__ import annotations

from dataclasses import replace

from retrieval.engine import Evidence
from retrieval.models import Tier
from retrieval.precise import at_most_reference, precise_doc, unseen_names
from retrieval.ranking import RankedDoc
from retrieval.relevance import Logistic, TierModel
from storage.catalog_records import CatalogEntry
from storage.keyword_index import L0Hit
from storage.text import identifiers, query_labels, terms

MODEL = TierModel(
    on_topic=Logistic(weights={"similarity": 20.0}, bias=-4.0, threshold=0.5),
    top_right=Logistic(weights={"gap": 100.0}, bias=-3.0, threshold=0.5),
)
ANSWERABLE = {"similarity": 0.8, "gap": 0.1}  # HIGHLY_RELEVANT by MODEL
TABLE = "| Code | Meaning | SLA |\n|---|---|---|\n| TK-MIN-01 | Parent request | 4 hours |\n"


def _entries(**bodies: str) -> dict[str, CatalogEntry]:
    return {
        k: CatalogEntry(
            doc_key=k,
            content_hash="h",
            title=k.title(),
            domain="d",
            keywords=(),
            summary="",
            domain_description="",
            when_to_retrieve="",
            body=b,
            chunk_count=1,
        )
        for k, b in bodies.items()
    }


def _label_holders(
    query: str, l0: tuple[L0Hit, ...], entries: dict[str, CatalogEntry]
) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """As the engine's full-text query finds them: the documents whose terms hold the label's."""
    shorts = [h.term.upper() for h in l0 if h.kind == "code" and not identifiers(h.term)]
    return tuple(
        (label, tuple(sorted(k for k, e in entries.items() if set(terms(label)) <= set(terms(e.body)))))
        for label in dict.fromkeys([*query_labels(query), *shorts])
    )


def _precise(
    hits: list[tuple[str, str, str]],
    entries: dict[str, CatalogEntry],
    query: str = "q",
    unseen: tuple[str, ...] = (),
) -> str | None:
    """Graded as answerable; the dense channel ranks the documents in the order given."""
    l0 = tuple(L0Hit(doc, kind, term) for doc, kind, term in hits)  # type: ignore[arg-type]
    evidence = Evidence(
        query=query,
        l0=l0,
        specific_keyword_docs=tuple(doc for doc, kind, _ in hits if kind == "keyword"),
        dense=(),
        lexical=(),
        term_weights=(),
        unseen=unseen,
        label_holders=_label_holders(query, l0, entries),
    )
    ranked = [RankedDoc(k, 1.0 - i / 10, 0.9 - i / 10, 0.5, (), True) for i, k in enumerate(entries)]
    return precise_doc(evidence, ranked, ANSWERABLE, MODEL, entries, unseen_names(evidence))


def test_a_code_in_several_documents_is_precise_for_the_one_that_defines_it() -> None:
    entries = _entries(
        refunds="File a TK-MIN-01 ticket with the receipts.", sla=TABLE, minors="See TK-MIN-01."
    )
    hits = [(k, "code", "TK-MIN-01") for k in entries]
    assert _precise(hits, entries) == "sla"


def test_a_code_several_documents_define_names_none() -> None:
    assert _precise([(k, "code", "TK-MIN-01") for k in ("a", "b")], _entries(a=TABLE, b=TABLE)) is None


def test_a_code_several_documents_only_mention_names_the_one_the_ranking_puts_first() -> None:
    # A vehicle code cited in a fleet table's last column and in a list: it is still a name, and
    # the question's other words decide between its holders.
    mentioned = _entries(fleet="| TR-01 | Wuhan | JH-R-D03 |", vaccine="- use JH-R-D03 only.")
    hits = [(k, "code", "JH-R-D03") for k in mentioned]
    assert _precise(hits, mentioned) == "fleet"
    assert _precise(hits, dict(reversed(mentioned.items()))) == "vaccine"


def test_a_code_a_document_is_named_for_wins_over_a_list_of_forms_defining_it() -> None:
    # The handbook's list of forms defines it in a row; the pour procedure's heading is about it.
    entries = _entries(
        handbook="| Form | Use |\n|---|---|\n| ZL-F06 | Concrete pour permit |\n",
        pouring="## 一、浇灌令（ZL-F06）\n浇筑前必须办理浇灌令。",
    )
    hits = [(k, "code", "ZL-F06") for k in entries]
    assert _precise(hits, entries, "ZL-F06 最后谁签发") == "pouring"


def test_a_code_the_summary_of_a_document_names_wins_over_a_list_of_forms_defining_it() -> None:
    # The manual's appendix of forms defines CK-05 in a row; the procedure says in its own summary
    # that it is about the form, and only mentions it in its text.
    forms = "| Form | Name |\n|---|---|\n| CK-05 | 长短款登记表 |\n| KG-03 | 金库出入登记簿 |\n"
    entries = _entries(manual=forms, procedure="发现长短款的，填写《长短款登记表》（CK-05）。")
    entries["procedure"] = replace(
        entries["procedure"], summary="长短款的报告时限、登记表 CK-05 和处理原则。"
    )
    hits = [(k, "code", "CK-05") for k in entries]
    assert _precise(hits, entries, "短款了 CK-05 多久内报主管") == "procedure"
    # A summary naming a longer code (CK-050) does not name CK-05; the row decides.
    entries["procedure"] = replace(entries["procedure"], summary="登记表 CK-050 的用法。")
    assert _precise(hits, entries, "短款了 CK-05 多久内报主管") == "manual"


def test_a_level_several_documents_define_follows_the_code_beside_it() -> None:
    # L2 is defined by the manual and by the downtime procedure; BCP-03 names the procedure, which
    # the ranking puts first (a label prose would not count as a code needs that: L1, A320).
    levels = "| Level | Meaning |\n|---|---|\n| L2 | Several branches down |\n"
    entries = _entries(downtime="## 应急处置（BCP-03）\n" + levels, manual=levels, other="See BCP-03.")
    hits = [("manual", "code", "L2"), ("downtime", "code", "L2"), ("downtime", "code", "BCP-03")]
    hits.append(("other", "code", "BCP-03"))
    assert _precise(hits, entries, "BCP-03 L2 多久内要报运营管理部") == "downtime"
    # Where the document the code names does not define the level, the level names none.
    entries["downtime"] = replace(entries["downtime"], body="## 应急处置（BCP-03）\n见 L2。")
    assert _precise(hits, entries, "BCP-03 L2 多久内要报运营管理部") is None


def test_a_summary_naming_a_scale_does_not_name_one_level_of_it() -> None:
    # Both define L4; the classification's summary names the scale, not the access process.
    levels = "| Level | Meaning |\n|---|---|\n| L4 | Highly sensitive |\n"
    entries = _entries(classification=levels, access="| Level | Days |\n|---|---|\n| L4 | 5 |\n")
    entries["classification"] = replace(entries["classification"], summary="平台数据的 L1–L4 四级分类标准。")
    hits = [(k, "code", "L4") for k in entries]
    assert _precise(hits, entries, "How many working days for read rights on L4 data?") is None


def test_a_letters_only_code_several_documents_define_names_the_one_the_ranking_puts_first() -> None:
    table = "| Code | Meaning |\n|---|---|\n| YD | Large print |\n"
    entries = _entries(cataloguing=table, koha=table)
    hits = [(k, "code", "YD") for k in entries]
    assert _precise(hits, entries, "馆藏代码 YD 是什么书") == "cataloguing"


def test_every_code_the_query_names_must_point_at_the_same_document() -> None:
    entries = _entries(pump="| IP-A31 | x |\n| IP-A32 | y |", bed="| EB-07 | z |")
    assert _precise([("pump", "code", "IP-A31"), ("pump", "code", "IP-A32")], entries) == "pump"
    assert _precise([("pump", "code", "IP-A31"), ("bed", "code", "EB-07")], entries) is None


def test_an_unseen_name_or_number_vetoes_a_keyword_only_precise() -> None:
    entries = _entries(visitors="Visiting hours are 10:00 to 20:00.", other="Ward rounds.")
    hits = [("visitors", "keyword", "visiting hours")]
    assert _precise(hits, entries, "What are the visiting hours?") == "visitors"
    hangzhou = "What are the visiting hours at the Hangzhou campus?"
    assert _precise(hits, entries, hangzhou, unseen=("hangzhou",)) is None
    assert _precise(hits, entries, "visiting hours for bed 700", unseen=("700",)) is None  # a number it lacks
    # Ordinary words and CJK bigrams the knowledge base lacks name nothing.
    assert (
        _precise(hits, entries, "visiting hours, quickly 周末开放吗", unseen=("quickly", "周末"))
        == "visitors"
    )


def test_an_unseen_name_vetoes_a_short_code_only_when_the_dense_channel_prefers_another_document() -> None:
    entries = _entries(storage="| C5 | toxic solvents |", pumps="| IP-A31 | downstream occlusion |")
    reversed_entries = dict(reversed(entries.items()))
    citroen = "Is the Citroen C5 a good car?"
    assert _precise([("storage", "code", "C5")], entries, citroen, unseen=("citroen",)) == "storage"
    assert _precise([("storage", "code", "C5")], reversed_entries, citroen, unseen=("citroen",)) is None
    assert _precise([("storage", "code", "C5")], reversed_entries, "What goes in cabinet C5?") == "storage"
    pumps = "IP-A31 on the Infusa pump"
    assert _precise([("pumps", "code", "IP-A31")], entries, pumps, unseen=("infusa",)) == "pumps"


def test_a_question_naming_what_the_knowledge_base_lacks_is_at_most_reference() -> None:
    def evidence(query: str, unseen: tuple[str, ...]) -> Evidence:
        return Evidence(query, (), (), (), (), (), unseen=unseen)

    vietnamese = evidence("TradeGuard gave me TG-60 on a new Vietnamese customer", ("tg_60", "vietnamese"))
    assert unseen_names(vietnamese) == ["tg_60", "vietnamese"]
    assert at_most_reference(Tier.HIGHLY_RELEVANT, unseen_names(vietnamese)) is Tier.REFERENCE
    assert at_most_reference(Tier.PRECISE, unseen_names(vietnamese)) is Tier.PRECISE
    plain = evidence("who gets pulled in and how quickly?", ("gets", "pulled", "quickly"))
    assert at_most_reference(Tier.HIGHLY_RELEVANT, unseen_names(plain)) is Tier.HIGHLY_RELEVANT


RATES = "| Code | Name |\n|---|---|\n| BAR | Best available rate |\n| NRF | Non-refundable |\n"


def test_a_letters_only_code_a_table_defines_is_precise_when_the_ranking_puts_it_first() -> None:
    entries = _entries(rates=RATES, handbook="NRF bookings are prepaid and simply closed.")
    hits = [("rates", "code", "NRF")]
    booked = "Guest booked NRF and wants to move his stay"
    assert _precise(hits, entries, booked) == "rates"
    # The ranking prefers another document, or the question names what the base lacks: none.
    assert _precise(hits, dict(reversed(entries.items())), booked) is None
    assert _precise(hits, entries, "NRF at the Lisbon hotel", unseen=("lisbon",)) is None


def test_a_letters_only_code_beside_a_full_code_is_context() -> None:
    entries = _entries(drift="| ERR_SCHEMA_DRIFT | x |", layers="| ODS | raw layer |")
    hits = [("drift", "code", "ERR_SCHEMA_DRIFT"), ("layers", "code", "ODS")]
    assert _precise(hits, dict(reversed(entries.items())), "ERR_SCHEMA_DRIFT breaks the ODS sync") == "drift"


def test_an_acronym_no_document_defines_is_no_code() -> None:
    # "VPN" in running text and keywords gives no code hit (storage.text), so only the keyword rules
    # apply: a keyword other documents contain names nothing.
    entries = _entries(remote="Connect to the VPN first.", travel="Use the VPN abroad.")
    evidence = Evidence("How do I reset the VPN?", (L0Hit("remote", "keyword", "VPN"),), (), (), (), ())
    ranked = [RankedDoc(k, 1.0 - i / 10, 0.9 - i / 10, 0.5, (), True) for i, k in enumerate(entries)]
    assert precise_doc(evidence, ranked, ANSWERABLE, MODEL, entries, unseen_names(evidence)) is None


def test_an_unseen_chinese_compound_before_a_matched_keyword_names_another_kind() -> None:
    entries = _entries(backwash="V 型滤池反冲洗", other="管网冲洗")
    hits = [("backwash", "keyword", "滤池")]
    carbon = "南山水厂的活性炭滤池多久更换一次炭"
    unseen = ("厂的", "的活", "活性", "性炭", "炭滤", "池多", "多久", "次炭")
    assert _precise(hits, entries, carbon, unseen=unseen) is None
    evidence = Evidence(carbon, (L0Hit("backwash", "keyword", "滤池"),), (), (), (), (), unseen=unseen)
    assert unseen_names(evidence) == ["活性炭"]
    assert at_most_reference(Tier.HIGHLY_RELEVANT, unseen_names(evidence)) is Tier.REFERENCE
    # One unseen bigram at a word boundary, or one after a function character, is no name.
    assert _precise(hits, entries, "两格滤池反冲洗要隔多久", unseen=("格滤", "多久")) == "backwash"
    assert _precise(hits, entries, "池子里滤池多久冲洗", unseen=("子里", "里滤")) == "backwash"


def _keyworded(entries: dict[str, CatalogEntry], doc: str, *keywords: str) -> dict[str, CatalogEntry]:
    return {**entries, doc: replace(entries[doc], keywords=keywords)}


def test_a_code_other_documents_prose_holds_names_its_definer_only_where_the_ranking_agrees() -> None:
    # L1 is indexed only where the rota defines it (too short for running text), but the severity
    # matrix's prose uses it too: a question the matrix ranks first is about the matrix.
    matrix = "Only the IC may lower a severity; an L1 engineer may not."
    entries = _entries(matrix=matrix, rota="- **L1**: the engineers on the floor.")
    hits = [("rota", "code", "L1")]
    assert _precise(hits, entries, "can L1 lower the severity") is None
    assert _precise(hits, dict(reversed(entries.items())), "can L1 lower the severity") == "rota"
    # Held by no other document, or a code running text counts (AL-1107), it stands as before.
    alone = _entries(matrix="Only the IC may lower a severity.", rota="- **L1**: the engineers.")
    assert _precise(hits, alone, "can L1 lower the severity") == "rota"
    alarms = _entries(other="See AL-1107.", table="| AL-1107 | fan |")
    assert _precise([("table", "code", "AL-1107")], alarms, "AL-1107") == "table"


def test_a_letters_only_label_one_document_declares_counts_as_a_letters_only_code() -> None:
    # Graded REFERENCE, the keyword rule names nothing; here no L0 hit is needed either.
    entries = _keyworded(_entries(change="单号以 ECR 开头。", other="变更流程。"), "change", "ECR")
    assert _precise([], entries, "ECR 开头的单子要补什么") == "change"
    # Like a letters-only code: only where the ranking puts it first, and in capitals.
    assert _precise([], dict(reversed(entries.items())), "ECR 开头的单子要补什么") is None
    assert _precise([], entries, "ecr 开头的单子要补什么") is None
    # Glossed in parentheses it is declared too; only used, or held by two documents, it is not.
    glossed = _entries(guide="Close reasons: CPF (paid in full), CPP (partly paid).", other="x")
    assert _precise([], glossed, "difference between CPP and CPF") == "guide"
    assert _precise([], _entries(guide="Export the PDF.", other="x"), "where is the PDF") is None
    shared = _keyworded(_entries(change="ECR 开头。", other="ECR 也要补录。"), "change", "ECR")
    assert _precise([], shared, "ECR 开头的单子要补什么") is None


def test_a_label_of_capitals_and_digits_the_index_misses_names_the_one_document_holding_it() -> None:
    # W805 (one letter) is no identifier of running text, so no L0 hit; one document holds it,
    # written inside Chinese text as well.
    entries = _entries(errors="| W805 | Photo location mismatch |", guide="Upload photos.")
    assert _precise([], entries, "上传照片后出现W805，要怎么处理") == "errors"
    assert _precise([], dict(reversed(entries.items())), "上传照片后出现 W805") is None
    assert _precise([], entries, "W8050 是什么") is None  # not a whole word of any document
    # A word joined to others by a separator is part of a code, not a label: Q7 is not XY-Q7.
    assert _precise([], _entries(errors="| Q7 | fan stalled |", guide="x"), "XY-Q7 是什么") is None
    # Digits first is also how a quantity is written: it counts only as a front-matter keyword.
    delays = _entries(delays="| 32A | baggage offload |", gate="Use 32A for offloads.")
    assert _precise([], delays, "32A") is None
    assert _precise([], _keyworded(delays, "delays", "32A"), "32A") == "delays"
    assert _precise([], _entries(spark="tables under 200MB", other="x"), "joins under 200MB") is None


def test_a_code_a_runbook_lists_as_a_keyword_is_named_by_the_table_that_defines_it() -> None:
    # The runbook tags the alarm it handles among its keywords; the table's row says what it is.
    entries = _keyworded(
        _entries(
            table="| Code | Meaning |\n|---|---|\n| RF-201 | compressor high-pressure trip |\n",
            runbook="When a reefer unit stops (for example RF-201), call the control tower.",
        ),
        "runbook",
        "RF-201",
    )
    hits = [("table", "code", "RF-201"), ("runbook", "code", "RF-201")]
    assert _precise(hits, entries, "RF-201") == "table"
    # Two tables defining it name neither.
    both = {**entries, "runbook": replace(entries["table"], doc_key="runbook")}
    assert _precise(hits, both, "RF-201") is None


def test_a_number_a_table_defines_is_precise_only_where_the_ranking_puts_its_table_first() -> None:
    faults = "| Code | Meaning |\n|---|---|\n| 4007 | Annual check overdue |\n"
    entries = _entries(faults=faults, fares="Senior cards pay full fare.")
    assert _precise([("faults", "code", "4007")], entries, "4007 on the reader") == "faults"
    later = dict(reversed(entries.items()))  # the ranking puts the fares page first
    assert _precise([("faults", "code", "4007")], later, "4007 on the reader") is None
    # Beside a code with letters, a number is context.
    both = _entries(faults=faults + "| RD-12 | Reader offline |\n", fares="x")
    assert _precise([("faults", "code", "4007"), ("faults", "code", "RD-12")], both) == "faults"
