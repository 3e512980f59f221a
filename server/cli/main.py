"""The ``lookup-knowledge-mcp`` command line: ingest, lookup, map, calibrate, serve, stats, gaps, console, eval.

Logs and progress go to stderr; stdout carries only results (and, under ``serve`` on stdio,
belongs to the protocol).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeAlias

from server.cli.errors import CommandError
from server.config.errors import ConfigError
from server.config.http_settings import AUTH_TOKEN_ENV
from server.config.loading import config_path_from_env, load_settings
from server.config.settings import Settings

logger = logging.getLogger("lookup_knowledge")


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    for noisy in ("httpx", "pymilvus", "milvus_lite", "urllib3", "uvicorn.access", "faiss", "faiss.loader"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # Milvus Lite's embedded gRPC server logs an ERROR traceback for a timestamp call that
    # pymilvus makes and Lite does not implement; the call's failure is handled by pymilvus.
    logging.getLogger("grpc._server").setLevel(logging.CRITICAL)


def _common(parser: argparse.ArgumentParser) -> None:
    """The options every command takes."""
    parser.add_argument("--data-dir", type=Path, help="state directory (env LOOKUP_KNOWLEDGE_DATA_DIR)")
    parser.add_argument("--config", type=Path, help="YAML config file (env LOOKUP_KNOWLEDGE_CONFIG)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lookup-knowledge-mcp",
        description="MCP knowledge server: graded relevance tiers, per-session action memory, governance.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _ingest_args,
        _lookup_args,
        _map_args,
        _calibrate_args,
        _serve_args,
        _stats_args,
        _gaps_args,
        _console_args,
        _eval_args,
    ):
        _common(add(sub))
    return parser


Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _ingest_args(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "ingest",
        help="ingest a directory of .md/.markdown/.txt, .html/.htm, .pdf, .docx and .pptx files "
        "(incremental, idempotent)",
    )
    p.add_argument("directory", type=Path)
    p.add_argument(
        "--replace",
        action="store_true",
        help="let another folder than the one this data directory was ingested from replace it "
        "(without it, an ingest that would delete that folder's documents is refused)",
    )
    return p


def _lookup_args(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("lookup", help="run one lookup and print the result model")
    p.add_argument("query")
    p.add_argument("--domain")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print the JSON result")
    return p


def _map_args(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("map", help="print the knowledge map (domains, coverage, when to retrieve)")
    p.add_argument("--json", action="store_true", help="print the JSON knowledge map")
    return p


def _calibrate_args(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "calibrate", help="fit the tier models on evaluation sets and report figures held out per set"
    )
    p.add_argument(
        "sets", type=Path, nargs="+", help="evaluation sets: directories with kb/ and questions.jsonl"
    )
    p.add_argument("--write", action="store_true", help="write the model fitted on all sets into --config")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def _serve_args(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="run the MCP server")
    p.add_argument("--transport", choices=["stdio", "sse", "streamable-http"], default="stdio")
    p.add_argument("--host", default=None, help="bind address for HTTP (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port for HTTP (default 8765)")
    p.add_argument(
        "--auth-token",
        default=None,
        help=f"require this bearer token; visible in `ps`, prefer --auth-token-file or {AUTH_TOKEN_ENV}",
    )
    p.add_argument("--auth-token-file", type=Path, default=None, help="read the bearer token from this file")
    p.add_argument("--stateless", action="store_true", help="streamable HTTP without MCP sessions")
    p.add_argument(
        "--watch", type=Path, default=None, metavar="DIR", help="keep the index in sync with this folder"
    )
    return p


def _stats_args(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("stats", help="summarise the invocation log")
    p.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="only calls since WHEN: a duration before now (90s, 30m, 24h, 7d, 2w; decimals such as "
        "1.5d work) or an ISO 8601 date or time (2026-05-01, 2026-05-01T09:30, "
        "2026-05-01T09:30:00+02:00; UTC when no offset is given)",
    )
    p.add_argument("--session", default=None, help="only the calls of this session key")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--png", type=Path, default=None, help="also draw a chart to this PNG file")
    return p


def _gaps_args(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("gaps", help="the questions the knowledge base could not answer, and document usage")
    p.add_argument(
        "--since",
        default="7d",
        metavar="WHEN",
        help="only calls since WHEN (as for stats: 24h, 7d, an ISO date; 'all' for the whole log; default 7d)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def _console_args(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("console", help="serve the read-only web console alone (loopback by default)")
    p.add_argument("--host", default=None, help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="port (default 8765)")
    p.add_argument(
        "--auth-token",
        default=None,
        help=f"require this bearer token; visible in `ps`, prefer --auth-token-file or {AUTH_TOKEN_ENV}",
    )
    p.add_argument("--auth-token-file", type=Path, default=None, help="read the bearer token from this file")
    return p


def _eval_args(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser("eval", help="replay agent traces through the MCP server")
    p.add_argument(
        "trace", type=Path, help='JSONL lines {"session":..., "query":..., "missing_dimension"?:...}'
    )
    p.add_argument("--baseline", action="store_true", help="also run with governance and dedup off")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    return p


def _auth_token(args: argparse.Namespace) -> str | None:
    """The token of --auth-token-file, --auth-token or the environment, in that order."""
    path: Path | None = getattr(args, "auth_token_file", None)
    if path is not None:
        try:
            token = path.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read --auth-token-file {str(path)!r}: {exc}") from exc
        if not token:
            raise ConfigError(f"--auth-token-file {str(path)!r} is empty")
        return token
    if getattr(args, "auth_token", None) is not None:
        if not args.auth_token:
            raise ConfigError("--auth-token is empty; leave it out to serve without a token")
        print(
            "warning: --auth-token puts the token in the process list (ps) and shell history; "
            f"use --auth-token-file or {AUTH_TOKEN_ENV}",
            file=sys.stderr,
        )
        return str(args.auth_token)
    from_env = os.environ.get(AUTH_TOKEN_ENV)
    if from_env == "":
        # Most often `VAR=$TOKEN` with TOKEN unset: serving without authentication was not meant.
        raise ConfigError(f"{AUTH_TOKEN_ENV} is set but empty; unset it to serve without a token")
    return from_env


def settings_from_args(args: argparse.Namespace) -> tuple[Settings, Path | None, dict[str, Any]]:
    """Settings from --config/env, with the flags that override them."""
    config_path = args.config or config_path_from_env()
    overrides: dict[str, Any] = {}
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    http: dict[str, Any] = {}
    # `is not None`, not truthiness: --port 0 and --host "" are values to check, not "unset".
    if getattr(args, "host", None) is not None:
        http["host"] = args.host
    if getattr(args, "port", None) is not None:
        http["port"] = args.port
    token = _auth_token(args)
    if token is not None:
        http["auth_token"] = token
    if http:
        base = load_settings(config_path, **overrides).http.model_dump()
        overrides["http"] = {**base, **http}
    if getattr(args, "watch", None) is not None:
        base = load_settings(config_path, **overrides).watch.model_dump()
        overrides["watch"] = {**base, "directory": args.watch}
    return load_settings(config_path, **overrides), config_path, overrides


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    # Everything this process creates (Milvus Lite files, catalogs, the invocation log with its
    # queries and session memory) is private to the user running it.
    os.umask(0o077)
    try:
        settings, config_path, overrides = settings_from_args(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    handler = _handler(args.command)
    try:
        result = handler(args, settings, config_path, overrides)
        return int(asyncio.run(result) if asyncio.iscoroutine(result) else result)
    except KeyboardInterrupt:
        return 130
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


Handler = Callable[[argparse.Namespace, Settings, "Path | None", dict[str, Any]], Any]


def _handler(command: str) -> Handler:
    # Imported here, not at the top: `--help` and a mistyped flag answer without loading the
    # model stack, the SDK or pymilvus.
    from server.cli import calibrate, commands, console, eval, gaps, serve, stats

    handlers: dict[str, Handler] = {
        "ingest": commands.cmd_ingest,
        "lookup": commands.cmd_lookup,
        "map": commands.cmd_map,
        "calibrate": calibrate.cmd_calibrate,
        "serve": serve.cmd_serve,
        "stats": stats.cmd_stats,
        "gaps": gaps.cmd_gaps,
        "console": console.cmd_console,
        "eval": eval.cmd_eval,
    }
    return handlers[command]


if __name__ == "__main__":
    sys.exit(main())
