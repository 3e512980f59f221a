"""The config file and the environment are read strictly: an unknown key is an error naming its
dotted path, and a file that is not YAML is reported on one line with where the parser stopped."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from server.cli.main import main
from server.config.errors import ConfigError
from server.config.http_settings import DEFAULT_PRINCIPAL, token_digest
from server.config.loading import load_settings, unknown_env_sections
from server.config.sections import ENV_PREFIX
from server.config.settings import Settings

# Every check here fails before anything is opened; the bound only matters if that regresses
# and a lookup runs instead.
pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_environment_overrides")]

UNKNOWN = "Extra inputs are not permitted"
DIGEST = "0" * 64


def refused_lookup(tmp_path: Path, capsys: pytest.CaptureFixture[str], *config: str) -> str:
    """A CLI lookup (with --config when one is given) that must stop with exit code 2 and one
    line on stderr; that line."""
    flags = ["--config", config[0]] if config else []
    code = main(["lookup", "x", "--data-dir", str(tmp_path / "data"), *flags])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    ("yaml_text", "dotted"),
    [
        # Authentication would silently stay off.
        ("http:\n  auth_tokn: s3cret\n", "http.auth_tokn"),
        ("governance:\n  domain_polcy: hard\n", "governance.domain_polcy"),
        ("memory:\n  ttl: 60\n", "memory.ttl"),
        ("retrieval:\n  primary_max_char: 10\n", "retrieval.primary_max_char"),
        (
            "governance:\n  levels:\n    calls: {low_max: 1, medium_max: 3, high_max: 5}\n",
            "governance.levels.calls.high_max",
        ),
        (f"http:\n  clients: [{{name: ci, token_sha256: '{DIGEST}', role: admin}}]\n", "http.clients.0.role"),
        ("relevance:\n  hint_languag: en\n", "relevance.hint_languag"),
        (
            "relevance:\n  models:\n    e5-small:\n"
            "      on_topic: {weights: {}, bias: 5.0, threshold: 0.5}\n"
            "      top_right: {weights: {}, bias: 0.0, threshold: 0.5, thresold: 0.9}\n",
            "relevance.models.e5-small.top_right.thresold",
        ),
        (
            "relevance:\n  models:\n    e5-small:\n"
            "      on_topic: {weights: {}, bias: 5.0, threshold: 0.5}\n"
            "      top_right: {weights: {}, bias: 0.0, threshold: 0.5}\n"
            "      lexical_wieght: 0.2\n",
            "relevance.models.e5-small.lexical_wieght",
        ),
    ],
)
def test_a_misspelt_key_inside_a_section_stops_the_cli_naming_its_dotted_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], yaml_text: str, dotted: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(yaml_text, encoding="utf-8")
    err = refused_lookup(tmp_path, capsys, str(config))
    assert err.startswith(f"error: invalid configuration in {config}: {dotted}: {UNKNOWN}")
    assert "; " not in err, err  # that key, and nothing else, is wrong
    assert not (tmp_path / "data").exists()  # nothing was opened


def _sections() -> list[str]:
    return [
        name
        for name, field in Settings.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    ]


@pytest.mark.parametrize("section", _sections())
def test_every_section_rejects_a_key_it_does_not_define(tmp_path: Path, section: str) -> None:
    # Walks the model, so a section added later is held to the same rule.
    with pytest.raises(
        ConfigError, match=rf"^invalid configuration in environment/flags: {section}\.no_such_key: {UNKNOWN}$"
    ):
        load_settings(None, data_dir=tmp_path, **{section: {"no_such_key": 1}})


@pytest.mark.parametrize(
    ("variable", "dotted"),
    [
        ("GOVERNANCE__DOMAIN_POLCY", "governance.domain_polcy"),
        ("HTTP__AUTH_TOKN", "http.auth_tokn"),
    ],
)
def test_a_misspelt_nested_environment_variable_stops_the_cli(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    dotted: str,
) -> None:
    monkeypatch.setenv(f"{ENV_PREFIX}{variable}", "hard")
    err = refused_lookup(tmp_path, capsys)
    assert err.startswith(f"error: invalid configuration in environment/flags: {dotted}: {UNKNOWN}")


@pytest.mark.parametrize(
    "variable", ["GOVERNANC__DOMAIN_POLICY", "governanc__domain_policy", "HTTPS__AUTH_TOKEN"]
)
def test_a_misspelt_section_in_an_environment_variable_stops_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], variable: str
) -> None:
    # pydantic-settings reads only the variables of known sections: this one it would ignore.
    monkeypatch.setenv(f"{ENV_PREFIX}{variable}", "hard")
    err = refused_lookup(tmp_path, capsys)
    assert err.startswith(
        f"error: invalid configuration in environment: {ENV_PREFIX}{variable}: no such section ("
    )


def test_variables_that_share_the_prefix_without_a_section_are_not_settings_errors() -> None:
    environ = {
        f"{ENV_PREFIX}CONFIG": "x.yaml",
        f"{ENV_PREFIX}TEST_MILVUS_URI": "http://x",
        f"{ENV_PREFIX}MILVUS__URI": "u",
    }
    assert unknown_env_sections(environ) == []


def test_the_correctly_spelt_keys_still_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        f"http:\n  auth_token: s3cret\n  clients: [{{name: ci, token_sha256: '{DIGEST}'}}]\n",
        encoding="utf-8",
    )
    monkeypatch.setenv(f"{ENV_PREFIX}GOVERNANCE__DOMAIN_POLICY", "hard")
    settings = load_settings(config, data_dir=tmp_path)
    assert settings.http.principals() == {DIGEST: "ci", token_digest("s3cret"): DEFAULT_PRINCIPAL}
    assert settings.governance.domain_policy == "hard"


TOKEN_RULE = "http.auth_token: Value error, a bearer token is one or more visible ASCII characters"


@pytest.mark.parametrize(
    "token",
    # Empty used to mean "no authentication"; the others could never match a request's token,
    # which is read without surrounding whitespace.
    ['""', '" s3cret"', '"s3cret\\n"', '"two words"', '"pässwort"'],
)
def test_a_bearer_token_that_cannot_authenticate_is_refused_without_showing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], token: str
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"http:\n  auth_token: {token}\n", encoding="utf-8")
    err = refused_lookup(tmp_path, capsys, str(config))
    assert err.startswith(f"error: invalid configuration in {config}: {TOKEN_RULE}")
    for secret in ("s3cret", "words", "wort"):
        assert secret not in err


def test_an_empty_bearer_token_variable_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(f"{ENV_PREFIX}HTTP__AUTH_TOKEN", "")
    assert refused_lookup(tmp_path, capsys).startswith(
        f"error: invalid configuration in environment/flags: {TOKEN_RULE}"
    )


def test_a_visible_ascii_bearer_token_is_accepted(tmp_path: Path) -> None:
    token = "A-z_0.9~+/=!#$%&*"
    settings = load_settings(None, data_dir=tmp_path, http={"auth_token": token})
    assert settings.http.principals() == {token_digest(token): DEFAULT_PRINCIPAL}


@pytest.mark.parametrize("host", ["evil.com:abc", "", "kb.example/path", "user@kb.example"])
def test_an_allowed_host_the_guard_could_never_match_is_refused_when_the_settings_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], host: str
) -> None:
    # It used to pass the settings and stop `serve` with a traceback, exit code 1.
    monkeypatch.setenv(f"{ENV_PREFIX}HTTP__ALLOWED_HOSTS", f'["kb.example", "{host}"]')
    assert refused_lookup(tmp_path, capsys) == (
        "error: invalid configuration in environment/flags: http.allowed_hosts: Value error, "
        f"not a host name or host:port (such as kb.example or kb.example:8443): {host!r}\n"
    )


def test_allowed_hosts_with_and_without_a_port_load(tmp_path: Path) -> None:
    hosts = ["kb.example", "Pinned.Example:8443", "[::1]:8765", "10.0.0.5"]
    assert load_settings(None, data_dir=tmp_path, http={"allowed_hosts": hosts}).http.allowed_hosts == hosts


@pytest.mark.parametrize(
    ("variable", "value"),
    [("HTTP__ALLOWED_HOSTS", "docs.internal"), ("GOVERNANCE__LEVELS", "{calls: 3"), ("HTTP", "host=x")],
)
def test_a_variable_for_a_list_or_mapping_that_is_not_json_is_one_line_naming_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    variable: str,
    value: str,
) -> None:
    # pydantic-settings raised its own error with a traceback, naming only the section.
    monkeypatch.setenv(f"{ENV_PREFIX}{variable}", value)
    err = refused_lookup(tmp_path, capsys)
    assert err.startswith(
        f"error: invalid configuration in environment: {ENV_PREFIX}{variable}: not valid JSON ("
    )
    assert value not in err


@pytest.mark.parametrize(
    ("content", "where"),
    [
        # An unclosed bracket: the problem is at the end, the context says where it opened.
        (
            "governance:\n  domain_policy: soft\nretrieval: [1, 2\n",
            "line 4, column 1: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence at line 3, column 12)",
        ),
        (
            "retrieval:\n  content: passage\n   supplements: graded\n",
            "line 3, column 15: mapping values are not allowed here",
        ),
        (
            "governance:\n\tenabled: true\n",
            "line 2, column 1: found character '\\t' that cannot start any token",
        ),
    ],
)
def test_malformed_yaml_is_one_line_with_the_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, where: str
) -> None:
    config = tmp_path / "malformed.yaml"
    config.write_text(content, encoding="utf-8")
    err = refused_lookup(tmp_path, capsys, str(config))
    assert err.startswith(f"error: config file '{config}' is not valid YAML: {where}")


def test_yaml_the_reader_refuses_is_one_line_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A control character: PyYAML's reader gives no line and column, so its message is flattened.
    config = tmp_path / "control.yaml"
    config.write_text("governance:\n  domain_policy: \x07\n", encoding="utf-8")
    err = refused_lookup(tmp_path, capsys, str(config))
    assert err.startswith(f"error: config file '{config}' is not valid YAML: unacceptable character #x0007")


def test_a_config_file_that_is_not_utf8_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "latin1.yaml"
    before = "governance:\n  domain_policy: s"
    config.write_bytes(f"{before}ô\n".encode("latin-1"))
    err = refused_lookup(tmp_path, capsys, str(config))
    assert (
        err
        == f"error: config file '{config}' is not UTF-8 text: invalid continuation byte at byte {len(before)}\n"
    )
