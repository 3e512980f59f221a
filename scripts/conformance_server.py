"""``serve --transport streamable-http`` plus the three fixtures some conformance scenarios read.

The official suite's resources-read-text, resources-templates-read and prompts-get-with-args
scenarios read ``test://static-text``, ``test://template/{id}/data`` and the prompt
``test_prompt_with_arguments`` by those names. This builds the server exactly as ``serve``
does (create_server, then build_http_app with its auth, body limit and DNS-rebinding
settings), adds only those fixtures through the same decorators as knowledge://map,
knowledge://domain/{domain} and the prompts, and serves it. Used by scripts/conformance only.

    python scripts/conformance_server.py --port 8766 --data-dir DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anyio
import uvicorn

from server.config.loading import load_settings
from server.protocol.app import app_resources, create_server
from server.transport.http_app import build_http_app


def add_suite_fixtures(mcp: Any) -> None:
    """Register the fixtures the suite's scenarios name."""

    @mcp.resource("test://static-text", name="static-text", mime_type="text/plain")
    def static_text() -> str:
        """A fixed text resource (conformance fixture)."""
        return "This is the content of the static text resource."

    @mcp.resource("test://template/{id}/data", name="template-data", mime_type="application/json")
    def template_data(id: str) -> str:
        """A templated resource (conformance fixture)."""
        return json.dumps({"id": id, "templateTest": True, "data": f"Data for ID: {id}"})

    @mcp.prompt(name="test_prompt_with_arguments")
    def prompt_with_arguments(arg1: str, arg2: str) -> str:
        """A prompt with two required arguments (conformance fixture)."""
        return f"Prompt with arguments: arg1='{arg1}', arg2='{arg2}'"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    settings = load_settings(None, data_dir=args.data_dir, http={"host": "127.0.0.1", "port": args.port})
    resources = app_resources(settings, overrides={"data_dir": args.data_dir})
    mcp = create_server(resources)
    add_suite_fixtures(mcp)
    app = build_http_app(mcp, resources, settings, transport="streamable-http")
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on")
    anyio.run(uvicorn.Server(config).serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
