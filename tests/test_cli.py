"""The command line over the ingested sample knowledge base: lookup, map, calibrate."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from retrieval.calibration_figures import Figures
from server.cli.calibrate import print_report
from server.cli.main import main
from server.config.loading import load_settings
from tests.conftest import SAMPLE_KB
from tests.helpers import CLI, ROOT, cli_env


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
    code = main(list(args))
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in args else out


@pytest.mark.slow
def test_lookup_of_an_identifier_is_precise_through_the_installed_command(data_dir: Path) -> None:
    proc = subprocess.run(
        [*CLI, "lookup", "ERR_TIMEOUT 是什么", "--json"],
        env=cli_env(data_dir),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["relevance_level"] == "PRECISE"
    assert result["primary"]["doc_key"] == "error-codes/err-timeout.md"
    assert set(result) >= {
        "found",
        "completeness_hint",
        "supplement",
        "retrieved_domains_this_session",
        "budget",
    }


@pytest.mark.parametrize(
    ("query", "doc"),
    [
        # English questions about Chinese documents, and Chinese questions about English ones,
        # with no keyword in common: only the semantic (L1) path can find them.
        (
            "MySQL keeps returning Too many connections, which server setting controls this",
            "infrastructure/mysql-server-config.md",
        ),
        ("how do I raise the gateway timeout for a slow report export endpoint", "api/gateway-timeouts.md"),
        ("第三方合作方调用接口时 API Key 放在哪个请求头，多久轮换一次", "api/api-keys.md"),
        ("怎么在 Kubernetes 里抓堆转储并用 MAT 分析", "troubleshooting/memory-leak-diagnosis.md"),
    ],
)
def test_paraphrase_in_the_other_language_finds_the_document(
    capsys: pytest.CaptureFixture[str], data_dir: Path, query: str, doc: str
) -> None:
    code, result = _run(capsys, "lookup", query, "--json", "--data-dir", str(data_dir))
    assert code == 0
    assert result["primary"]["doc_key"] == doc
    assert result["relevance_level"] in ("HIGHLY_RELEVANT", "REFERENCE")


@pytest.mark.parametrize("query", ["how do I bake sourdough bread at home", "明天北京天气怎么样"])
def test_off_topic_query_gives_no_match(
    capsys: pytest.CaptureFixture[str], data_dir: Path, query: str
) -> None:
    code, result = _run(capsys, "lookup", query, "--json", "--data-dir", str(data_dir))
    assert code == 0
    assert result["relevance_level"] == "NO_MATCH" and result["found"] is False and result["primary"] is None


def test_lookup_text_output_and_bad_arguments(capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    code, out = _run(capsys, "lookup", "ERR_TIMEOUT 是什么", "--data-dir", str(data_dir))
    assert code == 0 and out.startswith("relevance: PRECISE")
    assert main(["lookup", "x", "--domain", "cooking", "--data-dir", str(data_dir)]) == 2
    assert "unknown domain 'cooking'; known domains: api" in capsys.readouterr().err
    assert main(["lookup", "x", "--top-k", "11", "--data-dir", str(data_dir)]) == 2
    assert "--top-k: Input should be less than or equal to 10, got 11" in capsys.readouterr().err


def test_map_lists_every_domain(capsys: pytest.CaptureFixture[str], data_dir: Path) -> None:
    code, result = _run(capsys, "map", "--json", "--data-dir", str(data_dir))
    assert code == 0
    assert result["empty"] is False and result["message"] is None
    assert {d["domain_id"] for d in result["domains"]} == {
        "api",
        "error-codes",
        "infrastructure",
        "onboarding",
        "troubleshooting",
    }
    onboarding = next(d for d in result["domains"] if d["domain_id"] == "onboarding")
    # Documents without front matter are mapped by their first heading and top folder.
    assert {"开发环境搭建指南", "Release Process", "glossary"} <= set(onboarding["covers"])
    assert onboarding["document_count"] == 7


def _evaluation_set(root: Path, domain: str, questions: list[dict[str, Any]]) -> Path:
    shutil.copytree(SAMPLE_KB / domain, root / "kb" / domain)
    (root / "questions.jsonl").write_text(
        "\n".join(json.dumps(q, ensure_ascii=False) for q in questions) + "\n", encoding="utf-8"
    )
    return root


@pytest.mark.slow
def test_calibrate_reports_held_out_figures_and_writes_the_model(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    off_topic = [
        {"query": "how do I bake sourdough bread", "doc": None, "kind": "offtopic"},
        {"query": "明天北京天气怎么样", "doc": None, "kind": "offtopic"},
    ]
    api = _evaluation_set(
        tmp_path / "api-set",
        "api",
        [
            {"query": "where do partners put their key in the request", "doc": "api/api-keys.md"},
            {"query": "how long is a webhook retried", "doc": "api/webhooks.md"},
            {"query": "what happens when a client sends too many requests", "doc": "api/rate-limiting.md"},
            *off_topic,
        ],
    )
    errors = _evaluation_set(
        tmp_path / "error-set",
        "error-codes",
        [
            {"query": "ERR_TIMEOUT 是什么", "doc": "error-codes/err-timeout.md", "kind": "code"},
            {"query": "两个事务互相等待锁怎么办", "doc": "error-codes/db-e2001-deadlock.md"},
            {"query": "the access token expired, what now", "doc": "error-codes/auth-e401-expired.md"},
            *off_topic,
        ],
    )
    config = tmp_path / "config.yaml"
    config.write_text("# the team's settings\nlog:\n  log_queries: true  # keep the text\n", encoding="utf-8")
    code, report = _run(
        capsys,
        "calibrate",
        str(api),
        str(errors),
        "--json",
        "--write",
        "--config",
        str(config),
        "--data-dir",
        str(tmp_path / "data"),
    )
    assert code == 0
    assert set(report["held_out"]) == {"api-set", "error-set"}
    assert report["held_out_total"]["questions"] == 10
    assert report["held_out"]["error-set"]["codes_precise"] == "1/1"
    # The HIGHLY_RELEVANT contract, counted per set: the off-topic questions here are all far.
    total = report["held_out_total"]
    assert (total["far_no_match"].split("/")[1], total["near_no_match"]) == ("4", "0/0")
    assert total["far_highly_relevant"].endswith("/4") and total["hr_precision"].count("/") == 1
    text = config.read_text(encoding="utf-8")
    assert text.startswith("# the team's settings\nlog:\n  log_queries: true  # keep the text\nrelevance:\n")
    written = yaml.safe_load(text)
    assert written["log"] == {"log_queries": True}
    assert written["relevance"]["models"]["e5-small"] == report["fitted_on_all"]
    assert load_settings(config, data_dir=tmp_path).tier_model.model_dump() == report["fitted_on_all"]


def test_calibrate_rejects_a_malformed_query_file(
    capsys: pytest.CaptureFixture[str], data_dir: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "set" / "questions.jsonl"
    (bad.parent / "kb").mkdir(parents=True)
    bad.write_text('{"query": "ok", "doc": null}\nnot json\n', encoding="utf-8")
    assert main(["calibrate", str(bad.parent), "--data-dir", str(data_dir)]) == 2
    assert f"{bad}:2: not JSON" in capsys.readouterr().err


def test_calibrate_names_a_path_that_is_not_an_evaluation_set_before_ingesting_any(
    capsys: pytest.CaptureFixture[str], data_dir: Path, tmp_path: Path
) -> None:
    questions = tmp_path / "queries.jsonl"
    questions.write_text('{"query": "ok", "doc": null}\n', encoding="utf-8")
    no_kb = tmp_path / "no-kb"
    no_kb.mkdir()
    (no_kb / "questions.jsonl").write_text('{"query": "ok", "doc": null}\n', encoding="utf-8")
    fine = tmp_path / "fine"
    (fine / "kb").mkdir(parents=True)
    (fine / "questions.jsonl").write_text('{"query": "ok", "doc": null}\n', encoding="utf-8")
    cases = (
        (questions, "it is not a directory"),
        (no_kb, "it has no kb"),
        (tmp_path / "typo", "it does not exist"),
    )
    for path, why in cases:
        assert main(["calibrate", str(fine), str(path), "--data-dir", str(data_dir)]) == 2
        err = capsys.readouterr().err
        assert f"{path} is not an evaluation set ({why})" in err
        assert "a directory with kb/ and questions.jsonl" in err
    assert not (data_dir / "calibration" / "fine").exists(), "a set was ingested before the check"


def test_the_calibrate_table_prints_the_highly_relevant_columns(capsys: pytest.CaptureFixture[str]) -> None:
    figures = Figures(highly_relevant=4, highly_relevant_right=3, far=2, far_no_match=2, near=5).as_dict()
    print_report(
        {
            "embedder": "e5-small",
            "sets": ["a"],
            "held_out": {"a": figures},
            "held_out_total": figures,
            "configured_model": {},
            "fitted_on_all": {},
        }
    )
    header, row = capsys.readouterr().out.splitlines()[3:5]
    for column in ("HR precision", "far NO_MATCH", "near NO_MATCH", "far HR", "near HR"):
        assert column in header
    assert row.split()[-5:] == ["3/4", "2/2", "0/5", "0/2", "0/5"]
