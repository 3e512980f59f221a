"""The command line refuses what it cannot do: one ``error:`` line naming the cause, exit code 2.

Through the real CLI, in-process (``main``) or as the installed command, over real directories
and files in ``tmp_path``: an empty or mistyped data directory, a missing or corrupt invocation
log, out-of-range flags, a watched folder that is not there, and a port that is taken.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
from pathlib import Path

import pytest

from server.cli.main import main
from server.cli.stats import parse_since
from server.config.data_dir import empty_knowledge_base_message
from tests.helpers import CLI, ROOT, free_port
from tests.wire import server_env

EMPTY_KB = "the knowledge base is empty"
# A server subprocess that should refuse at once gets this long before the test fails.
REFUSAL_TIMEOUT_S = 60


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


# -- an empty knowledge base (as the MCP server reports it) ----------------------------------
@pytest.mark.parametrize("output", [[], ["--json"]])
@pytest.mark.parametrize("exists", [False, True], ids=["mistyped", "never-ingested"])
def test_lookup_on_an_empty_data_directory_is_an_error_naming_it_and_the_ingest_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, output: list[str], exists: bool
) -> None:
    typo = tmp_path / "no-such-data"
    if exists:
        typo.mkdir()
    assert main(["lookup", "ERR_TIMEOUT", *output, "--data-dir", str(typo)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # never a NO_MATCH result
    assert _errors(captured.err) == [f"error: {empty_knowledge_base_message(typo)}"]
    assert f"lookup-knowledge-mcp ingest <dir> --data-dir {typo}" in captured.err
    assert typo.exists() == exists  # a mistyped directory is not created


@pytest.mark.parametrize("exists", [False, True], ids=["mistyped", "never-ingested"])
def test_map_of_an_empty_data_directory_says_it_is_empty_in_json_and_text(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, exists: bool
) -> None:
    empty = tmp_path / "empty"
    if exists:
        empty.mkdir()
    assert main(["map", "--json", "--data-dir", str(empty)]) == 0
    knowledge_map = json.loads(capsys.readouterr().out)
    assert knowledge_map["document_count"] == 0 and knowledge_map["empty"] is True
    assert knowledge_map["message"] == empty_knowledge_base_message(empty)
    assert main(["map", "--data-dir", str(empty)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("0 documents in 0 domains")
    assert empty_knowledge_base_message(empty) in text
    assert empty.exists() == exists


# -- stats: the log must exist and be readable -----------------------------------------------
def test_stats_without_an_invocation_log_names_the_path_and_creates_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nonexist"
    assert main(["stats", "--data-dir", str(missing)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: no invocation log at {str(missing / 'log.sqlite')!r}")
    assert not missing.exists()


def test_stats_on_a_corrupt_log_names_the_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "log.sqlite").write_text("not a database, just text\n" * 200, encoding="utf-8")
    assert main(["stats", "--json", "--data-dir", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert lines == [
        f"error: cannot read the invocation log {str(tmp_path / 'log.sqlite')!r}: file is not a database"
    ]


def test_stats_refuses_an_empty_since_instead_of_reading_all_time(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["stats", "--since", "", "--data-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: --since must be a duration")


# -- lookup --top-k: 1..10 as in the MCP tool ------------------------------------------------
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("0", "Input should be greater than or equal to 1, got 0"),
        ("-1", "Input should be greater than or equal to 1, got -1"),
        ("11", "Input should be less than or equal to 10, got 11"),
    ],
)
def test_lookup_refuses_a_top_k_out_of_range_before_opening_anything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: str, why: str
) -> None:
    data_dir = tmp_path / "data"
    assert main(["lookup", "x", "--top-k", value, "--data-dir", str(data_dir)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: --top-k: {why}"]
    assert not data_dir.exists(), "the stack was opened before the arguments were checked"


# -- serve: refused before it says "serving" -------------------------------------------------
def _serve(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[bytes]:
    """`serve` with an initialize on stdin: a server that starts instead of refusing would answer it."""
    return subprocess.run(
        [*CLI, "serve", *args],
        env=server_env(tmp_path / "data", **env),
        cwd=ROOT,
        input=b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}\n',
        capture_output=True,
        timeout=REFUSAL_TIMEOUT_S,
    )


def _one_error_line(done: subprocess.CompletedProcess[bytes]) -> str:
    err = done.stderr.decode()
    assert done.returncode == 2, err[-2000:]
    assert done.stdout == b""
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    assert "serving" not in lines[0]
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["stdio", "streamable-http"])
@pytest.mark.parametrize(
    ("make", "why"), [("missing", "it does not exist"), ("file", "it is not a directory")]
)
def test_serve_watching_a_folder_that_is_not_there_stops_with_one_line(
    tmp_path: Path, transport: str, make: str, why: str
) -> None:
    watched = tmp_path / "kb"
    if make == "file":
        watched.write_text("not a folder\n", encoding="utf-8")
    done = _serve(tmp_path, "--transport", transport, "--port", str(free_port()), "--watch", str(watched))
    assert _one_error_line(done) == f"error: cannot watch {str(watched)!r} (--watch, watch.directory): {why}"


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["streamable-http", "sse"])
def test_serve_on_a_port_in_use_says_so_in_one_line_before_serving(tmp_path: Path, transport: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve(tmp_path, "--transport", transport, "--port", str(port))
    assert _one_error_line(done) == f"error: cannot bind 127.0.0.1:{port}: address already in use"


@pytest.mark.slow
def test_serve_refuses_port_zero_as_the_settings_do_instead_of_binding_the_default(tmp_path: Path) -> None:
    done = _serve(tmp_path, "--transport", "streamable-http", "--port", "0")
    line = _one_error_line(done)
    assert line.startswith("error: invalid configuration") and "http.port" in line


@pytest.mark.slow
def test_serve_refuses_an_empty_host_instead_of_binding_the_default_or_every_interface(
    tmp_path: Path,
) -> None:
    done = _serve(tmp_path, "--transport", "streamable-http", "--host", "", "--port", str(free_port()))
    assert _one_error_line(done).startswith("error: http.host (--host) is empty")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "env", "error"),
    [
        (["--auth-token", ""], {}, "error: --auth-token is empty; leave it out to serve without a token"),
        # `VAR=$TOKEN` with TOKEN unset: the server used to serve without authentication.
        (
            [],
            {"LOOKUP_KNOWLEDGE_AUTH_TOKEN": ""},
            "error: LOOKUP_KNOWLEDGE_AUTH_TOKEN is set but empty; unset it to serve without a token",
        ),
        (
            [],
            {"LOOKUP_KNOWLEDGE_HTTP__AUTH_TOKEN": ""},
            "error: invalid configuration in environment/flags: http.auth_token: Value error, "
            "a bearer token is one or more visible ASCII characters",
        ),
    ],
    ids=["flag", "variable", "setting"],
)
def test_serve_refuses_an_empty_bearer_token_instead_of_serving_without_authentication(
    tmp_path: Path, flags: list[str], env: dict[str, str], error: str
) -> None:
    done = _serve(tmp_path, "--transport", "streamable-http", "--port", str(free_port()), *flags, **env)
    assert _one_error_line(done).startswith(error)


# -- help ------------------------------------------------------------------------------------
def _help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str) -> str:
    # Wide enough that argparse never wraps (it would break an ISO date at its hyphens).
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_stats_help_shows_the_since_forms_and_each_one_it_shows_is_accepted(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _help(capsys, monkeypatch, "stats")
    durations = re.findall(r"(?<![\w.:+-])\d+(?:\.\d+)?[smhdw]\b", text)
    dates = re.findall(r"\d{4}-\d{2}-\d{2}(?:T[\d:]+(?:[+-]\d{2}:\d{2})?)?", text)
    assert {"90s", "30m", "24h", "7d", "2w"} <= set(durations), durations
    assert any("T" in d for d in dates) and any("T" not in d for d in dates), dates
    for form in durations + dates:
        parse_since(form)  # raises StatsArgumentError for a form the help should not show


def test_calibrate_help_describes_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert re.search(r"--json\s+print the report as JSON", _help(capsys, monkeypatch, "calibrate"))
