#!/bin/sh
# Installs the npm packages a test needs (DIR/package.json, pinned by DIR/package-lock.json)
# into DIR/node_modules when they are not there yet. Needs node and npm (npm is installed with
# apt-get when missing: Debian's nodejs comes without it) and the npm registry.
#   scripts/npm-tools.sh DIR
set -eu
dir=$(cd "${1:?usage: npm-tools.sh DIR}" && pwd)
[ -f "$dir/node_modules/.installed" ] && exit 0
if ! command -v npm >/dev/null 2>&1; then
    echo "npm-tools: installing npm" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm >&2
fi
echo "npm-tools: installing $dir/package.json's packages" >&2
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >&2)
touch "$dir/node_modules/.installed"
