# Sourced by the scripts that need Node 22 (the MCP Inspector and the conformance suite).
# Installs Node 22 from the npm registry into .cache/node22 once, and puts it first on PATH.
# Usage: source scripts/node22.sh; npm_tool_install DIR PACKAGE@VERSION
set -euo pipefail

PROJECT_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_DIR="${LOOKUP_KNOWLEDGE_TOOLS_CACHE:-$PROJECT_ROOT/.cache}"
NODE22_PREFIX="$CACHE_DIR/node22"

if [ ! -x "$NODE22_PREFIX/node_modules/.bin/node" ]; then
    echo "installing Node 22 into $NODE22_PREFIX" >&2
    mkdir -p "$NODE22_PREFIX"
    npm install --silent --no-audit --no-fund --prefix "$NODE22_PREFIX" node@22 >&2
fi
export PATH="$NODE22_PREFIX/node_modules/.bin:$PATH"

# npm_tool_install DIR SPEC: install an npm package into DIR unless it is already there.
npm_tool_install() {
    local dir="$1" spec="$2" marker
    marker="$dir/.installed-$(echo "$spec" | tr '/@' '__')"
    if [ ! -f "$marker" ]; then
        echo "installing $spec into $dir" >&2
        mkdir -p "$dir"
        npm install --silent --no-audit --no-fund --prefix "$dir" "$spec" >&2
        touch "$marker"
    fi
}
