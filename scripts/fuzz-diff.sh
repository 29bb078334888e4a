#!/bin/sh
# Differential checks of two fuzzed parsers against reference implementations, over the checked-in
# corpora and what `make fuzz` added to BUILD/fuzz-corpus/:
# - the RFC 8785 canonical form (src/jcs.c) against the npm package `canonicalize` (installed
#   here into BUILD/npm; node and npm from Debian when missing);
# - Retry-After HTTP-dates (src/backoff.c) against Python's email.utils, on the corpus and on
#   dates generated in all three forms.
#   scripts/fuzz-diff.sh BUILD
set -eu
build=${1:?usage: fuzz-diff.sh BUILD}
cd "$(dirname "$0")/.."
CANONICALIZE_VERSION=2.0.0

need=""
command -v node >/dev/null 2>&1 || need="$need nodejs"
command -v npm >/dev/null 2>&1 || need="$need npm"
if [ -n "$need" ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO=sudo
    echo "fuzz-diff: installing$need"
    $SUDO apt-get update -qq || true
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $need
fi
npmdir=$build/npm
if [ ! -f "$npmdir/node_modules/canonicalize/package.json" ] ||
    ! grep -q "\"version\": \"$CANONICALIZE_VERSION\"" "$npmdir/node_modules/canonicalize/package.json"; then
    mkdir -p "$npmdir"
    npm install --silent --no-audit --no-fund --prefix "$npmdir" "canonicalize@$CANONICALIZE_VERSION"
fi

status=0
list=$build/fuzz-diff-jcs.tsv
find tests/fuzz/corpus/jcs "$build/fuzz-corpus/jcs" -type f 2>/dev/null | sort |
    xargs -r "$build/fuzz/tool_jcs_canon" >"$list"
NODE_PATH="$npmdir/node_modules" node tests/fuzz/diff_jcs.mjs "$npmdir/node_modules" "$list" || status=1

find tests/fuzz/corpus/retry_after "$build/fuzz-corpus/retry_after" -type f 2>/dev/null | sort |
    /usr/bin/python3 tests/fuzz/diff_retry_after.py "$build/fuzz/tool_retry_after" || status=1
exit $status
