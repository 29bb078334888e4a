#!/bin/sh
# Installs the spec linter (tests/lint/package.json, pinned by its package-lock.json) when it is
# not there yet, and prints the path of its binary.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/npm-tools.sh" "$root/tests/lint"
echo "$root/tests/lint/node_modules/.bin/redocly"
