"""Security: bearer auth, the bind warning, DNS-rebinding protection, the body limit, no secrets in logs.

Also: ingest refuses files that escape the knowledge base root, and ``log.log_queries: false``
keeps query text out of the invocation log.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client

from server.config.http_settings import token_digest
from server.transport import http_security
from server.transport.host_names import origin_host, split_host
from server.transport.http_security import BearerAuthMiddleware, host_policy, warn_if_exposed
from tests.helpers import CLI, ROOT
from tests.wire import RawSession, Served, post, private_data_dir, served_http, server_env

TOKEN = "tok-5f1c9a2e-never-log-me"
MILVUS_TOKEN = "milvus-user:milvus-pass-never-log-me"
GOOD_QUERY = "ERR_TIMEOUT 是什么"
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, sample_template: Path) -> Iterator[Served]:
    """A streamable-HTTP server that requires TOKEN, logging at debug level, with a 64 KiB body limit."""
    base = tmp_path_factory.mktemp("security")
    env = server_env(
        private_data_dir(sample_template, base / "data"),
        LOOKUP_KNOWLEDGE_HTTP__MAX_BODY_BYTES="65536",
        LOOKUP_KNOWLEDGE_MILVUS__TOKEN=MILVUS_TOKEN,
    )
    with served_http(env, base / "logs", extra=["--auth-token", TOKEN, "--verbose"]) as served:
        yield served


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.slow
@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": "Bearer  x"},
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer{TOKEN}"},
        {"X-Api-Key": TOKEN},
    ],
    ids=[
        "none",
        "wrong",
        "longer",
        "shorter",
        "extra space",
        "no scheme",
        "basic",
        "no space",
        "other header",
    ],
)
def test_every_request_without_the_exact_bearer_token_gets_401(
    guarded: Served, headers: dict[str, str]
) -> None:
    reply = post(guarded.url, PING, headers=headers)
    assert reply.status == 401
    assert reply.headers["www-authenticate"].startswith("Bearer")
    assert "unauthorized" in reply.text
    for method, path in (("GET", "/mcp"), ("DELETE", "/mcp"), ("GET", "/"), ("POST", "/anything")):
        response = httpx.request(
            method, f"http://127.0.0.1:{guarded.port}{path}", headers=headers, timeout=30
        )
        assert response.status_code == 401, (method, path)


@pytest.mark.slow
def test_the_right_bearer_token_opens_a_working_session(guarded: Served) -> None:
    session = RawSession(guarded.url, headers=AUTH)
    answer = session.call_tool("lookup_knowledge", {"query": GOOD_QUERY})["result"]["structuredContent"]
    assert answer["relevance_level"] == "PRECISE"
    # The session id alone is not a credential.
    stripped = {k: v for k, v in session.headers.items() if k != "Authorization"}
    assert post(guarded.url, PING, headers=stripped).status == 401


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "BeArEr"])
def test_the_bearer_scheme_is_case_insensitive(guarded: Served, scheme: str) -> None:
    # RFC 7235: the auth scheme is a case-insensitive token (finding 7).
    reply = post(guarded.url, PING, headers={"Authorization": f"{scheme} {TOKEN}"})
    assert reply.status != 401


@pytest.mark.slow
def test_a_token_given_on_the_command_line_prints_a_warning(guarded: Served) -> None:
    # finding 8: --auth-token is visible in ps; the server says so and names the alternatives.
    assert "warning: --auth-token puts the token in the process list" in guarded.output()


@pytest.mark.slow
def test_a_token_file_keeps_the_token_out_of_the_process_list(tmp_path: Path, sample_template: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n", encoding="utf-8")
    env = server_env(private_data_dir(sample_template, tmp_path / "data"))
    with served_http(env, tmp_path / "logs", extra=["--auth-token-file", str(token_file)]) as served:
        assert post(served.url, PING).status == 401
        assert "result" in RawSession(served.url, headers=AUTH).request("ping")
        cmdline = Path(f"/proc/{served.proc.pid}/cmdline").read_bytes()
    assert TOKEN.encode() not in cmdline
    assert "--auth-token puts the token" not in served.output()


@pytest.mark.slow
def test_the_sdk_client_connects_with_the_token(guarded: Served) -> None:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def run() -> Any:
        with anyio.fail_after(60):
            async with (
                create_mcp_http_client(headers=AUTH) as http,
                Client(streamable_http_client(guarded.url, http_client=http), mode="legacy") as client,
            ):
                return await client.call_tool("lookup_knowledge", {"query": GOOD_QUERY})

    assert not anyio.run(run).is_error


@pytest.mark.slow
def test_auth_is_checked_before_the_body_is_read(guarded: Served) -> None:
    oversized = b"x" * 70_000
    assert post(guarded.url, oversized).status == 401
    assert post(guarded.url, oversized, headers=AUTH).status == 413


@pytest.mark.slow
@pytest.mark.parametrize(
    ("headers", "status", "text"),
    [
        ({"Host": "evil.example"}, 421, "Invalid Host header"),
        ({"Host": "evil.example:80"}, 421, "Invalid Host header"),
        ({"Origin": "http://evil.example"}, 403, "Invalid Origin header"),
        ({"Origin": "http://127.0.0.1.evil.example"}, 403, "Invalid Origin header"),
        # finding 6: the SDK matched "127.0.0.1:*" as a prefix, so these passed with 200.
        ({"Host": "127.0.0.1:8791.evil"}, 421, "Invalid Host header"),
        ({"Host": "localhost:1.evil.example"}, 421, "Invalid Host header"),
        ({"Origin": "http://127.0.0.1:8791.evil.example"}, 403, "Invalid Origin header"),
        ({"Origin": "http://localhost:80@evil.example"}, 403, "Invalid Origin header"),
        ({"Origin": "null"}, 403, "Invalid Origin header"),
    ],
    ids=[
        "host",
        "host with port",
        "origin",
        "lookalike origin",
        "host port prefix",
        "localhost port prefix",
        "origin port prefix",
        "origin userinfo",
        "null origin",
    ],
)
def test_dns_rebinding_protection_refuses_foreign_host_and_origin(
    guarded: Served, headers: dict[str, str], status: int, text: str
) -> None:
    reply = post(guarded.url, PING, headers={**AUTH, **headers})
    assert (reply.status, reply.text) == (status, text)
    assert (
        post(guarded.url, PING, headers={**AUTH, "Origin": f"http://localhost:{guarded.port}"}).status != 403
    )


@pytest.mark.slow
def test_no_secret_reaches_the_logs_or_the_data_directory(guarded: Served) -> None:
    post(guarded.url, PING, headers={"Authorization": f"Bearer {TOKEN}-wrong"})
    RawSession(guarded.url, headers=AUTH).call_tool("lookup_knowledge", {"query": "webhook retries"})
    output = guarded.output()
    assert "DEBUG" in output  # the server did log, verbosely
    data_dir = guarded.stdout.parent.parent / "data"
    files = [guarded.stdout, guarded.stderr, *(p for p in data_dir.rglob("*") if p.is_file())]
    for path in files:
        content = path.read_bytes()
        for secret in (TOKEN, MILVUS_TOKEN.split(":")[1]):
            assert secret.encode() not in content, f"{secret!r} found in {path}"


@pytest.mark.slow
def test_the_token_can_come_from_the_environment(tmp_path: Path, sample_template: Path) -> None:
    env = server_env(private_data_dir(sample_template, tmp_path / "data"), LOOKUP_KNOWLEDGE_AUTH_TOKEN=TOKEN)
    with served_http(env, tmp_path / "logs") as served:
        assert post(served.url, PING).status == 401
        assert "result" in RawSession(served.url, headers=AUTH).request("ping")


async def test_the_token_is_compared_in_constant_time_against_every_principal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return a == b

    monkeypatch.setattr(http_security.hmac, "compare_digest", spy)
    sent: list[dict[str, Any]] = []

    async def inner(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    principals = {token_digest(TOKEN): "default", token_digest("other"): "ci"}
    middleware = BearerAuthMiddleware(inner, principals)
    scope: dict[str, Any] = {"type": "http", "headers": [(b"authorization", b"Bearer nope")]}
    await middleware(scope, None, send)  # type: ignore[arg-type]
    # Digests, not tokens, are compared; and all of them, whatever matched first.
    assert len(compared) == 2 and all(len(a) == len(b) == 32 for a, b in compared)
    assert sent[0]["status"] == 401
    scope = {"type": "http", "headers": [(b"authorization", b"bearer other")]}
    await middleware(scope, None, send)  # type: ignore[arg-type]
    assert sent[-1]["status"] == 200
    assert scope["state"][http_security.PRINCIPAL_STATE_KEY] == "ci"


def test_http_binds_loopback_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from server.config.loading import load_settings

    monkeypatch.delenv("LOOKUP_KNOWLEDGE_HTTP__HOST", raising=False)
    settings = load_settings(None, data_dir=tmp_path)
    assert settings.http.host == "127.0.0.1"
    assert settings.http.auth_token is None


@pytest.mark.parametrize(
    ("host", "authenticated", "warns"),
    [
        ("127.0.0.1", False, False),
        ("localhost", False, False),
        ("::1", False, False),
        ("0.0.0.0", False, True),
        ("::", False, True),
        ("192.168.1.20", False, True),
        ("0.0.0.0", True, False),
    ],
)
def test_binding_beyond_loopback_without_auth_warns(host: str, authenticated: bool, warns: bool) -> None:
    warning = warn_if_exposed(host, authenticated)
    assert (warning is not None) == warns
    if warning:
        assert warning.startswith(f"WARNING: serving on {host} without authentication")
        assert "--auth-token-file" in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "10.1.2.3"])
def test_dns_rebinding_protection_stays_on_for_every_bind_address(host: str) -> None:
    policy = host_policy(host, [])
    assert policy.allows("127.0.0.1", 8765) and policy.allows("localhost", None)
    assert not policy.allows("evil.example", 8765) and not policy.allows(None, None)
    assert policy.allows(host, 8765) == (host not in ("0.0.0.0",))


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("127.0.0.1:8765", True),
        ("[::1]:8765", True),
        ("LOCALHOST:8765", True),
        ("kb.example", True),
        ("kb.example:443", True),
        ("pinned.example:8443", True),
        ("pinned.example:8444", False),
        ("pinned.example", False),
        ("127.0.0.1:8791.evil", False),
        ("127.0.0.1.evil:8765", False),
        ("127.0.0.1:8765/path", False),
        ("user@127.0.0.1:8765", False),
        ("", False),
    ],
)
def test_host_headers_are_parsed_and_matched_exactly(header: str, allowed: bool) -> None:
    policy = host_policy("127.0.0.1", ["kb.example", "pinned.example:8443"])
    assert policy.allows(*split_host(header)) == allowed


@pytest.mark.parametrize(
    ("origin", "allowed"),
    [
        ("http://127.0.0.1:8765", True),
        ("https://localhost", True),
        ("http://[::1]:9", True),
        ("http://127.0.0.1:8791.evil.example", False),
        ("http://127.0.0.1.evil.example:8765", False),
        ("http://evil.example#127.0.0.1", False),
        ("http://127.0.0.1:8765/x", False),
        ("ftp://127.0.0.1:8765", False),
        ("null", False),
    ],
)
def test_origin_headers_are_parsed_and_matched_exactly(origin: str, allowed: bool) -> None:
    policy = host_policy("127.0.0.1", [])
    assert policy.allows(*origin_host(origin)) == allowed


@pytest.mark.slow
def test_serving_on_all_interfaces_without_a_token_prints_the_warning(
    tmp_path: Path, sample_template: Path
) -> None:
    env = server_env(private_data_dir(sample_template, tmp_path / "data"))
    with served_http(env, tmp_path / "logs", extra=["--host", "0.0.0.0"]) as served:
        # Protection stays on: a request naming this machine by another name is refused.
        assert post(served.url, PING, headers={"Host": "intranet.example"}).status == 421
    assert "WARNING: serving on 0.0.0.0 without authentication" in served.output()


async def test_with_log_queries_off_no_query_text_reaches_the_log(make_server: Any, data_dir: Path) -> None:
    server = make_server(overrides={"log": {"enabled": True, "log_queries": False}})
    query, dimension = "HikariCP 最大连接数应该设置成多少合适", "生产环境的推荐值"
    async with Client(server, mode="legacy") as client:
        with anyio.fail_after(120):
            await client.call_tool("lookup_knowledge", {"query": query})
            await client.call_tool("lookup_knowledge", {"query": query, "missing_dimension": dimension})
    with sqlite3.connect(data_dir / "log.sqlite") as db:
        rows = db.execute("SELECT * FROM tool_invocation").fetchall()
        stored = db.execute("SELECT query, missing_dimension FROM tool_invocation").fetchall()
    assert len(rows) == 2
    assert all(q.startswith("sha256:") for q, _ in stored)
    assert stored[1][1].startswith("sha256:")
    for row in rows:
        for value in row:
            assert query not in str(value) and dimension not in str(value)
    for path in data_dir.glob("log.sqlite*"):
        assert query.encode() not in path.read_bytes()


def test_ingest_refuses_files_and_directories_that_escape_the_root(tmp_path: Path, e5_embedder: Any) -> None:
    from server.config.loading import load_settings
    from server.container import open_runtime

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.md").write_text("# Secret\n\nThe root password is hunter2.\n", encoding="utf-8")
    root = tmp_path / "kb"
    (root / "ops").mkdir(parents=True)
    (root / "ops" / "runbook.md").write_text("# Runbook\n\nRestart the service.\n", encoding="utf-8")
    (root / "ops" / "alias.md").symlink_to(root / "ops" / "runbook.md")  # inside the root: fine
    (root / "ops" / "leak.md").symlink_to(outside / "secret.md")
    (root / "leakdir").symlink_to(outside, target_is_directory=True)
    (root / "ops" / "up.md").symlink_to(Path("..") / ".." / "outside" / "secret.md")

    runtime = open_runtime(load_settings(None, data_dir=tmp_path / "data"), embedder=e5_embedder)
    try:
        report = runtime.ingestor().run(root)
        refused = dict(report.failed)
        assert refused == {
            "leakdir": "symlink escapes the knowledge base root",
            "ops/leak.md": "symlink escapes the knowledge base root",
            "ops/up.md": "symlink escapes the knowledge base root",
        }
        assert sorted(report.added) == ["ops/alias.md", "ops/runbook.md"]
        assert all("hunter2" not in entry.body for entry in runtime.catalog.entries())
    finally:
        runtime.close()


# -- issue 34, weak 5: the Milvus Lite socket directory in the shared temporary directory -----------


def _symlinked(directory: Path) -> None:
    elsewhere = directory.parent / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    directory.symlink_to(elsewhere, target_is_directory=True)


def _foreign(directory: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("only root can create a directory owned by another user")
    directory.mkdir()
    os.chown(directory, 65534, 65534)  # nobody
    directory.chmod(0o1777)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("make", "cause"),
    [(_symlinked, "it is a symlink or not a directory"), (_foreign, "it is owned by uid 65534")],
    ids=["symlink", "another user's"],
)
def test_a_socket_directory_someone_else_controls_stops_serve_with_one_line(
    tmp_path: Path, make: Any, cause: str
) -> None:
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    socket_dir = tmp / f"lookup-knowledge-{os.getuid()}"
    make(socket_dir)
    env = server_env(tmp_path / "data", TMPDIR=str(tmp))
    done = subprocess.run([*CLI, "serve"], env=env, cwd=ROOT, input=b"", capture_output=True, timeout=120)
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2, done.stderr.decode()[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: refusing the Milvus Lite socket directory"), lines
    assert cause in lines[0] and str(socket_dir) in lines[0]
    assert not any(tmp.rglob("*.sock"))


def test_the_socket_directory_is_created_private_and_a_loose_one_of_ours_is_tightened(tmp_path: Path) -> None:
    from storage.lite_socket import ensure_socket_dir

    fresh, loose = tmp_path / "fresh", tmp_path / "loose"
    ensure_socket_dir(fresh)
    loose.mkdir()
    loose.chmod(0o777)
    ensure_socket_dir(loose)
    for directory in (fresh, loose):
        info = directory.lstat()
        assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
        assert info.st_uid == os.getuid()
