#!/bin/sh
# Installs the spec linter (tests/lint/package.json, pinned by its package-lock.json) into
# tests/lint/node_modules when it is not there yet, and prints the path of its binary. Needs node
# and npm (scripts/deps.sh installs them) and the npm registry.
set -eu
dir=$(cd "$(dirname "$0")/../tests/lint" && pwd)
bin=$dir/node_modules/.bin/redocly
if [ ! -x "$bin" ] && ! command -v npm >/dev/null 2>&1; then
    # Debian's nodejs comes without npm (NodeSource's includes it): install it only when absent.
    echo "lint-tools: installing npm" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm >&2
fi
if [ ! -x "$bin" ]; then
    echo "lint-tools: installing the OpenAPI linter into $dir/node_modules" >&2
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
echo "$bin"
