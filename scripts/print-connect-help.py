"""Print how to connect an MCP client to the server that `make run` is about to start."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    url = f"http://{args.host}:{args.port}/mcp"
    command = shutil.which("lookup-knowledge-mcp") or str(
        Path(sys.executable).parent / "lookup-knowledge-mcp"
    )
    stdio = json.loads((ROOT / "mcp.json").read_text(encoding="utf-8"))["mcpServers"]["lookup-knowledge"]
    stdio["command"] = command
    if args.data_dir:
        stdio["env"]["LOOKUP_KNOWLEDGE_DATA_DIR"] = args.data_dir
    config = {
        "mcpServers": {"lookup-knowledge": stdio, "lookup-knowledge-http": {"type": "http", "url": url}}
    }
    print(
        f"""
lookup-knowledge-mcp: serving streamable HTTP on {url}

Client configuration (Claude Desktop, Cursor, VS Code style "mcpServers"; the stdio entry starts
its own server, which shares this data directory with the running one):

{json.dumps(config, indent=2, ensure_ascii=False)}

MCP Inspector (Node 22):
  npx @modelcontextprotocol/inspector --cli {url} --method tools/list
  npx @modelcontextprotocol/inspector --cli {url} --method tools/call --tool-name lookup_knowledge --tool-arg "query=ERR_TIMEOUT 是什么"

Stop with Ctrl-C.
""",
        flush=True,
    )


if __name__ == "__main__":
    main()
