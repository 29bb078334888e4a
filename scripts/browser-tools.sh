#!/bin/sh
# Installs what the console's browser test needs when it is not there yet — Debian's chromium
# (apt-get; as root, or with sudo) and tests/console's npm packages (playwright-core, pinned by
# its package-lock.json) — and prints the path of the chromium binary.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v chromium >/dev/null 2>&1; then
    echo "browser-tools: installing chromium" >&2
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    export DEBIAN_FRONTEND=noninteractive
    # The package lists of a fresh machine may be empty or stale: refresh once, then install.
    $SUDO apt-get update -qq >&2 || true
    $SUDO apt-get install -y -qq --no-install-recommends chromium >&2
fi
"$root/scripts/npm-tools.sh" "$root/tests/console"
command -v chromium
