"""Hot reload of the YAML config: the next lookup sees an edit; a broken edit keeps the old config."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from functools import reduce
from pathlib import Path
from typing import Annotated, Any

import pytest
from mcp import Client
from pydantic import BaseModel

from server.cli.main import main
from server.config.loading import load_settings
from server.config.reload import SettingsHolder
from server.config.sections import HOT
from server.config.settings import Settings, reload_rules, restart_only_paths
from server.protocol.app import create_server
from storage.invocation_record import hash_text
from tests.helpers import lookup

# No keyword, title or identifier matches it, so its tier comes from similarity alone.
QUERY = "如何排查生产故障？"


def write_config(path: Path, *, top_right: float, feature: str = "gap", extra: str = "") -> None:
    """A tier model whose top-document probability is 0.5 for every query: the threshold decides."""
    path.write_text(
        "relevance:\n"
        "  models:\n"
        "    e5-small:\n"
        "      on_topic: {weights: {}, bias: 5.0, threshold: 0.5}\n"
        f"      top_right: {{weights: {{{feature}: 0.0}}, bias: 0.0, threshold: {top_right}}}\n" + extra,
        encoding="utf-8",
    )


async def test_editing_the_tier_model_changes_the_tier_of_the_next_lookup(
    tmp_path: Path, make_resources: Any, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "config.yaml"
    write_config(config, top_right=0.4)
    resources = make_resources(config)
    server = create_server(resources)
    holder: SettingsHolder = resources.holder
    async with Client(server) as client:
        before = await lookup(client, QUERY, "before")
        write_config(config, top_right=0.6)
        assert holder.check() is True
        after = await lookup(client, QUERY, "after")
        with caplog.at_level(logging.ERROR, logger="server.config.reload"):
            write_config(config, top_right=2.0)
            assert holder.check() is False
        kept = await lookup(client, QUERY, "kept")

    assert before["relevance_level"] == "HIGHLY_RELEVANT"
    assert after["relevance_level"] == "REFERENCE"
    assert kept["relevance_level"] == "REFERENCE"
    assert holder.current().tier_model.top_right.threshold == 0.6
    assert holder.last_error is not None
    assert (
        f"invalid configuration in {config}: relevance.models.e5-small.top_right.threshold:"
        in holder.last_error
    )
    assert "config reload rejected, keeping the previous settings" in caplog.text


def test_an_unknown_feature_is_rejected_naming_the_embedder_entry(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    write_config(config, top_right=0.5)
    holder = SettingsHolder(load_settings(config, data_dir=tmp_path), config, {"data_dir": tmp_path})
    write_config(config, top_right=0.5, feature="cosine")
    assert holder.check() is False
    assert holder.last_error is not None
    assert "relevance.models.e5-small.top_right: Value error, unknown feature(s) cosine" in holder.last_error
    assert holder.current().tier_model.top_right.weights == {"gap": 0.0}
    assert holder.reload_errors == 1


def test_a_misspelt_nested_key_keeps_the_old_config_and_logs_its_dotted_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("governance:\n  domain_policy: soft\n", encoding="utf-8")
    holder = SettingsHolder(load_settings(config, data_dir=tmp_path), config, {"data_dir": tmp_path})
    with caplog.at_level(logging.ERROR, logger="server.config.reload"):
        # Without the check the typo would reload as the defaults and log "config reloaded".
        config.write_text("governance:\n  domain_polcy: hard\n  water_metric: calls\n", encoding="utf-8")
        assert holder.check() is False
    assert holder.current().governance.water_metric == "tokens"
    assert holder.reload_errors == 1 and holder.reloads == 0
    assert holder.last_error is not None and holder.last_error.startswith(
        f"invalid configuration in {config}: governance.domain_polcy: Extra inputs are not permitted"
    )
    assert "config reload rejected, keeping the previous settings: " + holder.last_error in caplog.text
    config.write_text("governance:\n  domain_policy: hard\n", encoding="utf-8")
    assert holder.check() is True
    assert holder.current().governance.domain_policy == "hard"


def test_unparseable_yaml_keeps_the_old_config_and_a_fix_is_applied(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    write_config(config, top_right=0.5)
    holder = SettingsHolder(load_settings(config, data_dir=tmp_path), config, {"data_dir": tmp_path})
    config.write_text("relevance: [unclosed\n", encoding="utf-8")
    assert holder.check() is False
    assert holder.last_error is not None and holder.last_error.startswith(
        f"config file '{config}' is not valid YAML: line 2, column 1: "
    )
    assert "\n" not in holder.last_error  # one log line
    write_config(config, top_right=0.55)
    assert holder.check() is True
    assert holder.current().tier_model.top_right.threshold == 0.55
    assert holder.last_error is None


def test_an_edit_that_leaves_the_running_embedder_without_a_model_is_rejected(tmp_path: Path) -> None:
    # Valid on its own (bge-m3 with its own model), but the embedder is restart-only: the running
    # e5-small would be left with no tier model, and every lookup would fail.
    config = tmp_path / "config.yaml"
    write_config(config, top_right=0.5)
    holder = SettingsHolder(load_settings(config, data_dir=tmp_path), config, {"data_dir": tmp_path})
    config.write_text(
        "embedder:\n  name: bge-m3\n"
        "relevance:\n  models:\n    bge-m3:\n"
        "      on_topic: {weights: {}, bias: 5.0, threshold: 0.5}\n"
        "      top_right: {weights: {gap: 0.0}, bias: 0.0, threshold: 0.5}\n",
        encoding="utf-8",
    )
    assert holder.check() is False
    assert holder.last_error is not None and "no entry for embedder 'e5-small'" in holder.last_error
    assert holder.current().tier_model.top_right.threshold == 0.5


def test_an_edit_is_picked_up_without_an_explicit_check_once_the_interval_passed(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("governance:\n  domain_policy: soft\n", encoding="utf-8")
    holder = SettingsHolder(
        load_settings(config, data_dir=tmp_path), config, {"data_dir": tmp_path}, interval_s=0
    )
    config.write_text("governance:\n  domain_policy: hard\n", encoding="utf-8")
    assert holder.current().governance.domain_policy == "hard"


def setting(settings: Settings, dotted: str) -> Any:
    return reduce(getattr, dotted.split("."), settings)


@pytest.mark.parametrize(
    ("edit", "field", "running", "warned"),
    [
        ("chunking:\n  max_chars: 800\n", "chunking.max_chars", 1200, "chunking"),
        # The loaded cross-encoder stays as it is, so its settings must too.
        ("reranker:\n  enabled: true\n", "reranker.enabled", False, "reranker"),
        ("http:\n  port: 9999\n", "http.port", 8765, "http"),
        # Per-field rules: the hot sibling in the same section changes, this field does not.
        ("log:\n  enabled: false\n  log_queries: false\n", "log.enabled", True, "log.enabled"),
        ("memory:\n  persist: false\n  ttl_seconds: 60\n", "memory.persist", True, "memory.persist"),
    ],
)
def test_a_restart_only_setting_keeps_its_running_value_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, edit: str, field: str, running: object, warned: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("governance:\n  domain_policy: soft\n", encoding="utf-8")
    holder = SettingsHolder(load_settings(config, data_dir=tmp_path), config, {"data_dir": tmp_path})
    with caplog.at_level(logging.WARNING, logger="server.config.reload"):
        config.write_text(edit + "governance:\n  domain_policy: hard\n", encoding="utf-8")
        assert holder.check() is True
    applied = load_settings(config, data_dir=tmp_path)
    assert setting(applied, field) != running  # the edit did change it
    assert setting(holder.current(), field) == running
    assert holder.current().governance.domain_policy == "hard"
    assert f"config change to {warned!r} takes effect after a restart" in caplog.text
    # Everything hot in the edit applied: only the restart-only settings were held back.
    for dotted, rule in reload_rules().items():
        if rule != "restart":
            assert setting(holder.current(), dotted) == setting(applied, dotted), dotted


def test_every_setting_must_declare_a_reload_rule() -> None:
    class Section(BaseModel):
        marked: Annotated[int, HOT] = 1
        unmarked: int = 2

    class Root(BaseModel):
        section: Section = Section()

    with pytest.raises(TypeError, match="setting 'unmarked' of Section declares no reload rule"):
        reload_rules(Root)


def test_restart_only_paths_name_sections_and_single_fields() -> None:
    paths = restart_only_paths()
    assert {"milvus", "embedder", "reranker", "chunking", "data_dir", "http", "watch"} <= set(paths)
    assert {"log.enabled", "memory.persist"} <= set(paths)
    assert not {"log", "log.log_queries", "memory", "memory.ttl_seconds", "relevance"} & set(paths)


async def test_turning_query_logging_off_stores_hashes_from_the_next_call(
    tmp_path: Path, make_resources: Any
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("log:\n  log_queries: true\n", encoding="utf-8")
    resources = make_resources(config)
    async with Client(create_server(resources)) as client:
        await lookup(client, "数据库连接池怎么配置", "s")
        config.write_text("log:\n  log_queries: false\n", encoding="utf-8")
        assert resources.holder.check() is True
        await lookup(client, "消息队列基础", "s", missing_dimension="重试策略")
        log_path = resources.log.path
    with contextlib.closing(sqlite3.connect(log_path)) as conn:
        rows = conn.execute("SELECT query, missing_dimension FROM tool_invocation ORDER BY id").fetchall()
    assert rows == [("数据库连接池怎么配置", None), (hash_text("消息队列基础"), hash_text("重试策略"))]


async def test_editing_domain_policy_applies_to_the_next_lookup_of_a_running_session(
    tmp_path: Path, make_resources: Any
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("governance:\n  domain_policy: soft\n", encoding="utf-8")
    resources = make_resources(config)
    server = create_server(resources)
    async with Client(server) as client:
        await lookup(client, "数据库连接池怎么配置", "s")
        config.write_text("governance:\n  domain_policy: hard\n", encoding="utf-8")
        assert resources.holder.check() is True
        same_domain = await lookup(client, "消息队列基础", "s")
    assert same_domain["dedup_reason"] == "domain_retrieved"


def test_invalid_config_at_start_up_exits_before_serving_and_names_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    write_config(config, top_right=2.0)
    code = main(["serve", "--config", str(config), "--data-dir", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(
        f"error: invalid configuration in {config}: relevance.models.e5-small.top_right.threshold:"
    )
    assert not (tmp_path / "data").exists()  # nothing was opened


def test_invalid_config_named_by_the_environment_is_reported_the_same_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("governance:\n  levels:\n    calls: {low_max: 9, medium_max: 7}\n", encoding="utf-8")
    monkeypatch.setenv("LOOKUP_KNOWLEDGE_CONFIG", str(config))
    code = main(["serve", "--data-dir", str(tmp_path / "data")])
    err = capsys.readouterr().err
    assert code == 2
    assert "governance.levels.calls: Value error, low_max (9) must be below medium_max (7)" in err
